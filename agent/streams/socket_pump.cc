#include "agent/streams/socket_pump.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "siphon/protocol/codec.h"
#include "siphon/status.h"

namespace siphon::agent::streams {

namespace asio = net::asio;
using outgoing::forFamily;
using outgoing::formatAddress;
using outgoing::fromProto;
using outgoing::localAddress;
using outgoing::socketError;
using outgoing::toProto;
using outgoing::wireError;

namespace {

// Room a StreamDatagram frame needs besides its payload: tags, lengths, the
// stream id and the peer address (IPv6 text and port). Datagrams use the
// generic encoding, not the data fast path.
constexpr size_t kDatagramFrameOverhead = 96;

}  // namespace

SocketPump::SocketPump(asio::any_io_executor ex, uint64_t stream_id,
                       std::weak_ptr<SessionHost> host, Options options)
    : sock_(std::move(ex)), id_(stream_id), host_(std::move(host)), opt_(std::move(options)) {}

SocketPump::~SocketPump() = default;

absl::Status SocketPump::attach(UniqueFd fd) {
  if (dead_) return protoError(v1::CANCELLED, "the stream ended before its socket was ready");
  // Our own recv()/send() calls must never block the event loop.
  int flags = fcntl(fd.get(), F_GETFL);
  if (flags < 0 || fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) < 0) {
    return lastErrnoStatus("fcntl O_NONBLOCK");
  }
  net::error_code ec;
  if (sock_.is_open()) sock_.close(ec);
  sock_.assign(fd.get(), ec);
  if (ec) return protoError(v1::INTERNAL, absl::StrCat("register socket: ", ec.message()));
  (void)fd.release();
  return absl::OkStatus();
}

net::awaitable<absl::Status> SocketPump::waitWritable(
    std::chrono::steady_clock::time_point deadline) {
  if (dead_ || !sock_.is_open()) {
    co_return protoError(v1::CANCELLED, "the stream ended before its socket was ready");
  }
  auto fired = std::make_shared<bool>(false);
  asio::steady_timer watchdog(sock_.get_executor());
  watchdog.expires_at(deadline);
  std::weak_ptr<SocketPump> weak = weak_from_this();
  watchdog.async_wait([fired, weak](net::error_code ec) {
    if (ec || *fired) return;
    *fired = true;
    if (auto self = weak.lock()) {
      net::error_code ignored;
      self->sock_.cancel(ignored);
    }
  });
  net::error_code ec;
  co_await sock_.async_wait(asio::posix::descriptor_base::wait_write,
                            asio::redirect_error(net::use_awaitable, ec));
  const bool timed_out = *fired;
  *fired = true;  // disarm
  watchdog.cancel();
  if (dead_ || !sock_.is_open()) {
    co_return protoError(v1::CANCELLED, "the stream ended before its socket was ready");
  }
  if (timed_out) co_return absl::DeadlineExceededError("no answer");
  if (ec) co_return errnoStatus(ec.value(), "wait for the socket");
  co_return absl::OkStatus();
}

void SocketPump::start() {
  if (dead_ || started_) return;
  if (frozen_) {
    started_ = true;  // thaw() starts it
    return;
  }
  started_ = true;
  readMore();
  flushWrites();
}

void SocketPump::onAccept(const v1::StreamAccept& accept) {
  if (opt_.peer_window == 0) opt_.peer_window = accept.initial_window();
  start();
}

size_t SocketPump::maxMessage(protocol::Session& s) const {
  uint32_t window = opt_.peer_window != 0 ? opt_.peer_window : s.limits().initial_stream_window;
  size_t frame =
      s.limits().max_frame_size -
      (opt_.kind == Kind::kDatagram ? kDatagramFrameOverhead : protocol::kDataFrameOverhead);
  return std::min<size_t>(window - window / 4, frame);
}

// ------------------------------------------------------ socket -> stream

void SocketPump::readMore() {
  if (dead_ || frozen_ || !started_ || read_done_ || read_armed_ || wants_credit_) return;
  protocol::Session* s = host_.session();
  if (s == nullptr) {
    close();
    return;
  }
  auto self = shared_from_this();  // reset() may release the last owner
  bool queued = false;
  bool more = true;
  for (int i = 0; i < opt_.max_reads_per_wake && more; ++i) {
    more = opt_.kind == Kind::kStream ? readBytes(*s, &queued) : readMessage(*s, &queued);
  }
  // Also when the stream just ended: its last Data and HalfClose must go.
  if (queued) host_.wake();
  // Out of reads for this turn but more may be there: come back through
  // the reactor so other sockets get their turn.
  if (more && !dead_ && !read_done_) armRead();
}

bool SocketPump::readBytes(protocol::Session& s, bool* queued) {
  size_t credit = s.sendCredit(id_);
  if (credit == 0) {
    if (s.streamOpen(id_)) wants_credit_ = true;  // onWritable() resumes
    return false;
  }
  // One scratch buffer per thread, then exactly the bytes read go into the
  // frame: a fresh 64 KiB string per read would be zero-filled for nothing
  // (most reads of request/response traffic are a few hundred bytes), and
  // it sits in the replay buffer until acked, so its capacity must fit.
  thread_local std::unique_ptr<char[]> scratch(new char[kReadChunk]);
  const size_t want = std::min(credit, kReadChunk);
  ssize_t n = ::recv(sock_.native_handle(), scratch.get(), want, 0);
  if (n > 0) {
    std::string buf(scratch.get(), static_cast<size_t>(n));
    bytes_in_ += static_cast<uint64_t>(n);
    host_.sent(id_, static_cast<uint64_t>(n));
    absl::Status st = s.sendData(id_, std::move(buf));
    if (!st.ok()) {
      reset(wireError(v1::INTERNAL, absl::StrCat("stream ", id_, ": ", st.message())));
      return false;
    }
    *queued = true;
    if (static_cast<size_t>(n) < want) {
      // A short read took everything there was: wait for more rather than
      // asking again for an EAGAIN (a request/response exchange would pay
      // that extra recv on every message). Re-arming the wait re-polls the
      // socket, so bytes that came meanwhile are not missed.
      armRead();
      return false;
    }
    return true;
  }
  if (n == 0) {
    read_done_ = true;
    if (s.halfClose(id_).ok()) *queued = true;
    maybeFinish();
    return false;
  }
  return readFailed(errno);
}

// A read returned -1 with `err`: true to try again (EINTR); false when
// reading stops, waiting for readiness (EAGAIN) or with the stream reset.
bool SocketPump::readFailed(int err) {
  if (err == EINTR) return true;
  if (err == EAGAIN || err == EWOULDBLOCK) {
    armRead();
    return false;
  }
  reset(socketError(err, absl::StrCat("read from ", opt_.label)));
  return false;
}

bool SocketPump::readMessage(protocol::Session& s, bool* queued) {
  const int fd = sock_.native_handle();
  // The size of the next datagram or record, without taking it: it goes
  // whole or not at all.
  ssize_t len = ::recv(fd, nullptr, 0, MSG_PEEK | MSG_TRUNC);
  if (len < 0) return readFailed(errno);
  if (len == 0 && !opt_.udp) {
    // seqpacket: 0 is the end of the peer's records (an empty UDP datagram
    // is a datagram).
    read_done_ = true;
    if (s.halfClose(id_).ok()) *queued = true;
    maybeFinish();
    return false;
  }
  const size_t size = static_cast<size_t>(len);
  const size_t limit = maxMessage(s);
  if (size > limit) {
    if (opt_.udp) {
      // Taking it with a zero-length buffer discards the datagram.
      (void)::recv(fd, nullptr, 0, 0);
      ++dropped_;
      log::debug("outgoing_udp_drop", {{"stream", id_},
                                       {"bytes", static_cast<uint64_t>(size)},
                                       {"limit", static_cast<uint64_t>(limit)}});
      return true;
    }
    reset(wireError(v1::RESOURCE_EXHAUSTED,
                    absl::StrCat("a record of ", size, " bytes from ", opt_.label, " is above the ",
                                 limit, " bytes one frame of stream ", id_, " can carry")));
    return false;
  }
  if (s.sendCredit(id_, std::max<size_t>(size, 1)) < std::max<size_t>(size, 1)) {
    if (s.streamOpen(id_)) wants_credit_ = true;
    return false;
  }
  std::string buf(size, '\0');
  SockAddr peer;
  peer.len = sizeof(peer.storage);
  ssize_t n = opt_.kind == Kind::kDatagram
                  ? ::recvfrom(fd, buf.data(), buf.size(), 0, peer.get(), &peer.len)
                  : ::recv(fd, buf.data(), buf.size(), 0);
  if (n < 0) return readFailed(errno);
  buf.resize(static_cast<size_t>(n));
  bytes_in_ += static_cast<uint64_t>(n);
  host_.sent(id_, static_cast<uint64_t>(n));
  absl::Status st;
  if (opt_.kind == Kind::kDatagram) {
    v1::StreamDatagram d;
    d.set_stream_id(id_);
    *d.mutable_peer() = toProto(peer);
    d.set_payload(std::move(buf));
    st = s.sendDatagram(std::move(d));
  } else {
    st = s.sendData(id_, std::move(buf));
  }
  if (!st.ok()) {
    reset(wireError(v1::INTERNAL, absl::StrCat("stream ", id_, ": ", st.message())));
    return false;
  }
  *queued = true;
  return true;
}

// One wait per direction at a time; `then` runs once the socket is ready,
// unless the pump died meanwhile.
void SocketPump::arm(asio::posix::descriptor_base::wait_type what, bool SocketPump::*armed,
                     void (SocketPump::*then)()) {
  if (this->*armed || dead_ || !sock_.is_open()) return;
  this->*armed = true;
  sock_.async_wait(what, [self = shared_from_this(), armed, then](net::error_code ec) {
    self.get()->*armed = false;
    if (self->dead_ || self->frozen_) return;
    // A wait cancelled by freeze() whose thaw() came before this handler
    // ran: thaw() found the wait still armed, so the work is done here.
    if (ec && ec != net::asio::error::operation_aborted) return;
    (self.get()->*then)();
  });
}

void SocketPump::armRead() {
  arm(asio::posix::descriptor_base::wait_read, &SocketPump::read_armed_, &SocketPump::readMore);
}

void SocketPump::onWritable() {
  auto self = shared_from_this();
  wants_credit_ = false;
  readMore();
}

// ------------------------------------------------------ stream -> socket

void SocketPump::onData(std::string_view payload) {
  auto self = shared_from_this();
  if (dead_) return;
  if (opt_.kind == Kind::kDatagram) {
    reset(wireError(v1::INVALID_ARGUMENT,
                    "an unconnected UDP stream carries StreamDatagram frames (with a peer "
                    "address), not Data"));
    return;
  }
  if (out_.empty() && started_ && !frozen_ && !write_armed_ && sock_.is_open()) {
    // Nothing waits ahead of it: hand the payload to the socket straight
    // from the receive buffer, and keep (copy) only what it does not take.
    ssize_t n;
    do {
      n = ::send(sock_.native_handle(), payload.data(), payload.size(), MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n >= 0) {
      // A datagram or record goes whole.
      const size_t taken = opt_.kind == Kind::kStream ? static_cast<size_t>(n) : payload.size();
      bytes_out_ += static_cast<uint64_t>(n);
      if (protocol::Session* s = host_.session()) {
        s->consumed(id_, taken);
        host_.wake();
      }
      payload.remove_prefix(taken);
      if (payload.empty()) return;
    }
    // Otherwise (no room, or an error) flushWrites() below meets it again.
  }
  out_.push_back(Out{std::string(payload), 0, std::nullopt});
  flushWrites();
}

void SocketPump::onDatagram(v1::StreamDatagram datagram) {
  auto self = shared_from_this();
  if (dead_) return;
  if (opt_.kind != Kind::kDatagram) {
    reset(wireError(v1::INVALID_ARGUMENT,
                    "a connected stream carries Data frames, not StreamDatagram (send a "
                    "datagram to a peer only on an unconnected UDP stream)"));
    return;
  }
  auto to = fromProto(datagram.peer());
  if (to.ok() && sock_.is_open()) {
    auto local = localAddress(sock_.native_handle());
    if (local.ok()) to = forFamily(*to, local->family());
  }
  if (!to.ok()) {
    reset(wireError(v1::INVALID_ARGUMENT, absl::StrCat("datagram peer: ", to.status().message())));
    return;
  }
  out_.push_back(Out{std::move(*datagram.mutable_payload()), 0, *to});
  flushWrites();
}

void SocketPump::flushWrites() {
  if (dead_ || frozen_ || !started_ || write_armed_ || !sock_.is_open()) return;
  auto self = shared_from_this();
  const int fd = sock_.native_handle();
  size_t done = 0;  // payload bytes the socket took (or that were dropped)
  while (!out_.empty()) {
    Out& o = out_.front();
    const char* data = o.data.data() + o.offset;
    const size_t size = o.data.size() - o.offset;
    ssize_t n = o.to ? ::sendto(fd, data, size, MSG_NOSIGNAL, o.to->get(), o.to->len)
                     : ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        armWrite();
        break;
      }
      if (opt_.kind == Kind::kDatagram) {
        // One unreachable or refused destination fails its own datagram,
        // not the socket.
        log::debug("outgoing_udp_send_failed",
                   {{"stream", id_}, {"to", formatAddress(*o.to)}, {"errno", errno}});
        ++dropped_;
        done += o.data.size();
        out_.pop_front();
        continue;
      }
      reset(socketError(errno, absl::StrCat("write to ", opt_.label)));
      return;
    }
    bytes_out_ += static_cast<uint64_t>(n);
    if (opt_.kind == Kind::kStream) {
      o.offset += static_cast<size_t>(n);
      done += static_cast<size_t>(n);
      if (o.offset == o.data.size()) out_.pop_front();
    } else {
      // A datagram or record goes whole.
      done += o.data.size();
      out_.pop_front();
    }
  }
  if (done > 0) {
    if (protocol::Session* s = host_.session()) {
      s->consumed(id_, done);
      host_.wake();
    }
  }
  if (out_.empty() && peer_closed_ && !write_done_) {
    write_done_ = true;
    // UDP has no FIN to send: the peer's half-close only ends what it sends.
    if (!opt_.udp) ::shutdown(fd, SHUT_WR);
    maybeFinish();
  }
}

void SocketPump::armWrite() {
  arm(asio::posix::descriptor_base::wait_write, &SocketPump::write_armed_,
      &SocketPump::flushWrites);
}

void SocketPump::onHalfClose() {
  auto self = shared_from_this();
  if (dead_) return;
  peer_closed_ = true;
  flushWrites();
}

// ------------------------------------------------------------- endings

void SocketPump::maybeFinish() {
  if (dead_ || opt_.udp || !read_done_ || !write_done_) return;
  // Both directions are closed: the session already forgot the stream.
  dead_ = true;
  host_.release(id_);
  closeSocket(false);
}

void SocketPump::reset(v1::Error error) {
  if (dead_) return;
  auto self = shared_from_this();
  dead_ = true;
  log::debug("outgoing_stream_failed", {{"stream", id_}, {"error", error.message()}});
  if (host_.session()) {
    host_.reset(id_, error);
    host_.wake();
  }
  host_.release(id_);
  closeSocket(opt_.tcp);
}

void SocketPump::onReset(const v1::Error& error) {
  auto self = shared_from_this();
  if (dead_) return;
  dead_ = true;
  log::debug("outgoing_stream_reset", {{"stream", id_}, {"error", error.message()}});
  host_.release(id_);
  // The client aborted the stream: the target's peer sees an abort too (RST).
  closeSocket(opt_.tcp);
}

void SocketPump::close() {
  auto self = shared_from_this();
  dead_ = true;
  closeSocket(false);
}

void SocketPump::closeSocket(bool abortive) {
  out_.clear();
  if (!sock_.is_open()) return;
  if (abortive) {
    linger l{1, 0};
    ::setsockopt(sock_.native_handle(), SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  }
  net::error_code ignored;
  sock_.close(ignored);
}

// ------------------------------------------------------------- handover

void SocketPump::freeze() {
  if (dead_ || frozen_) return;
  frozen_ = true;
  // The waits end (operation_aborted) and do nothing while frozen.
  net::error_code ignored;
  if (sock_.is_open()) sock_.cancel(ignored);
}

void SocketPump::thaw() {
  if (!frozen_) return;
  frozen_ = false;
  if (dead_ || !started_) return;
  auto self = shared_from_this();
  readMore();
  flushWrites();
}

absl::Status SocketPump::exportState(v1::PumpExport* out, std::vector<UniqueFd>* fds) {
  if (dead_ || !sock_.is_open()) {
    return absl::FailedPreconditionError(absl::StrCat("stream ", id_, " has no socket"));
  }
  if (!frozen_) return absl::FailedPreconditionError("the pump is not frozen");
  int dup_fd = ::fcntl(sock_.native_handle(), F_DUPFD_CLOEXEC, 3);
  if (dup_fd < 0) return lastErrnoStatus("handover: dup a stream's socket");
  out->set_stream_id(id_);
  out->set_fd(static_cast<int32_t>(fds->size()));
  fds->emplace_back(dup_fd);
  out->set_kind(static_cast<uint32_t>(opt_.kind));
  out->set_udp(opt_.udp);
  out->set_tcp(opt_.tcp);
  out->set_peer_window(opt_.peer_window);
  out->set_label(opt_.label);
  out->set_started(started_);
  out->set_read_done(read_done_);
  out->set_peer_closed(peer_closed_);
  out->set_write_done(write_done_);
  for (const Out& o : out_) {
    out->add_out(o.data.substr(o.offset));
    // A datagram waiting to go keeps its destination (same machine, same
    // kernel: the sockaddr as it is).
    out->add_out_to(o.to ? std::string(reinterpret_cast<const char*>(&o.to->storage), o.to->len)
                         : std::string());
  }
  out->set_bytes_in(bytes_in_);
  out->set_bytes_out(bytes_out_);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SocketPump>> SocketPump::restore(asio::any_io_executor ex,
                                                                std::weak_ptr<SessionHost> host,
                                                                const v1::PumpExport& state,
                                                                UniqueFd fd) {
  if (state.kind() > static_cast<uint32_t>(Kind::kDatagram)) {
    return absl::InvalidArgumentError(
        absl::StrCat("handover: stream ", state.stream_id(), " has unknown kind ", state.kind()));
  }
  Options opt;
  opt.kind = static_cast<Kind>(state.kind());
  opt.udp = state.udp();
  opt.tcp = state.tcp();
  opt.peer_window = state.peer_window();
  opt.label = state.label();
  auto pump = std::make_shared<SocketPump>(std::move(ex), state.stream_id(), std::move(host), opt);
  pump->frozen_ = true;
  RETURN_IF_ERROR(pump->attach(std::move(fd)));
  pump->started_ = state.started();
  pump->read_done_ = state.read_done();
  pump->peer_closed_ = state.peer_closed();
  pump->write_done_ = state.write_done();
  for (int i = 0; i < state.out_size(); ++i) {
    std::optional<SockAddr> to;
    if (i < state.out_to_size() && !state.out_to(i).empty()) {
      const std::string& raw = state.out_to(i);
      if (raw.size() > sizeof(sockaddr_storage)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "handover: stream ", state.stream_id(), ": a datagram's destination is malformed"));
      }
      to.emplace();
      std::memcpy(&to->storage, raw.data(), raw.size());
      to->len = static_cast<socklen_t>(raw.size());
    }
    if (opt.kind == Kind::kDatagram && !to) {
      return absl::InvalidArgumentError(absl::StrCat(
          "handover: stream ", state.stream_id(), ": a datagram without its destination"));
    }
    pump->out_.push_back(Out{state.out(i), 0, to});
  }
  pump->bytes_in_ = state.bytes_in();
  pump->bytes_out_ = state.bytes_out();
  return pump;
}

}  // namespace siphon::agent::streams
