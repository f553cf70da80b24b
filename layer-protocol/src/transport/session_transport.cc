#include "siphon/transport/session_transport.h"

#include <cstddef>
#include <cstdio>
#include <vector>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::net {

SessionTransport::SessionTransport(Stream stream, protocol::Session& session,
                                   protocol::SessionHandler& handler, std::string initial)
    : stream_(std::move(stream)),
      session_(session),
      handler_(handler),
      initial_(std::move(initial)),
      writer_signal_(stream_.get_executor()),
      done_signal_(stream_.get_executor()),
      closed_signal_(stream_.get_executor()),
      linger_timer_(stream_.get_executor()),
      tick_timer_(stream_.get_executor()) {
  error_code ec;
  auto ep = stream_.remote_endpoint(ec);
  if (!ec) peer_ = absl::StrCat(ep.address().to_string(), ":", ep.port());
  stream_.socket().set_option(tcp::no_delay(true), ec);
  // The socket says writable only while less than this is unsent in it, and
  // the writer waits for that before each batch: what waits in the kernel
  // in front of a small frame stays this small (the send buffer itself
  // autotunes to the path's bandwidth-delay product for what is in flight).
  const int lowat = static_cast<int>(kUnsentInSocket);
  (void)::setsockopt(stream_.socket().native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat,
                     sizeof lowat);
  if (const int sndbuf = sendBufferSize(); sndbuf > 0) {
    (void)::setsockopt(stream_.socket().native_handle(), SOL_SOCKET, SO_SNDBUF, &sndbuf,
                       sizeof sndbuf);
  }
}

int SessionTransport::sendBufferSize() {
  // Read once: the machine's limits do not change under a running process
  // in any way that matters here.
  static const int size = [] {
    auto readInts = [](const char* path) {
      std::vector<long> out;
      if (FILE* f = std::fopen(path, "r")) {
        long v;
        while (std::fscanf(f, "%ld", &v) == 1) out.push_back(v);
        std::fclose(f);
      }
      return out;
    };
    const auto max = readInts("/proc/sys/net/core/wmem_max");
    const auto tcp = readInts("/proc/sys/net/ipv4/tcp_wmem");
    if (max.size() != 1 || tcp.size() != 3) return 0;
    // The kernel doubles what SO_SNDBUF asks (for its bookkeeping), up to
    // twice wmem_max; worth it only above what autotuning reaches.
    const long asked = std::min<long>(max[0], kMaxSendBuffer / 2);
    return 2 * asked > tcp[2] ? static_cast<int>(asked) : 0;
  }();
  return size;
}

void SessionTransport::notePathRtt() {
  const auto now = std::chrono::steady_clock::now();
  if (now - rtt_noted_ < kRttPeriod) return;
  rtt_noted_ = now;
  struct tcp_info info {};
  socklen_t len = sizeof info;
  if (::getsockopt(stream_.socket().native_handle(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(struct tcp_info, tcpi_rtt) + sizeof info.tcpi_rtt || info.tcpi_rtt == 0) {
    return;  // not TCP (a test's socketpair), or no sample yet
  }
  session_.setPathRtt(std::chrono::microseconds(info.tcpi_rtt));
}

void SessionTransport::fail(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
  close();
}

void SessionTransport::close() {
  if (closed_) return;
  closed_ = true;
  stream_.close();
  tick_timer_.cancel();
  linger_timer_.cancel();
  writer_signal_.notify();
  closed_signal_.notify();
}

void SessionTransport::closeAfterFlush() {
  close_after_flush_ = true;
  writer_signal_.notify();
}

void SessionTransport::closeAfterFlushAndPeer(std::chrono::milliseconds bound) {
  if (!stream_.tls()) {
    linger_ = true;
    linger_bound_ = bound;
  }
  closeAfterFlush();
}

awaitable<void> SessionTransport::waitClosed(asio::steady_timer::time_point deadline) {
  while (!closed_ && asio::steady_timer::clock_type::now() < deadline) {
    co_await closed_signal_.wait(deadline);
  }
}

awaitable<absl::Status> SessionTransport::run() {
  auto self = shared_from_this();
  auto ex = stream_.get_executor();
  // An exception that escapes the writer or the ticker ends this transport
  // (the session replays what was unacked on the next one), and marks the
  // coroutine done so run() does not wait for it forever.
  spawn(ex, writer(self), "session_writer", [self] {
    self->writer_done_ = true;
    self->fail(protoError(v1::INTERNAL, "the session writer failed"));
    self->done_signal_.notify();
  });
  spawn(ex, ticker(self), "session_ticker", [self] {
    self->ticker_done_ = true;
    self->fail(protoError(v1::INTERNAL, "the session ticker failed"));
    self->done_signal_.notify();
  });

  auto now = protocol::Clock::now();
  if (!initial_.empty()) {
    absl::Status s = session_.onBytes(initial_, handler_, now);
    initial_.clear();
    if (!s.ok()) {
      session_.sendGoaway(errorCodeOf(s), sv(s.message()));
      status_ = s;
      closeAfterFlush();
    }
    wake();
  }
  // Lingering (closeAfterFlushAndPeer), the reads go on until the peer's
  // close or the bound.
  while (!closed_ && (!close_after_flush_ || linger_)) {
    absl::Status s;
    bool taken = false;  // by the piped receive
    if (const size_t want = session_.pipeWanted();
        want > 0 && !stream_.tls() && pipes_in_.usable()) {
      // A file read answer its caller takes from a pipe: its bytes go from
      // the socket into one, uncopied (pipe_sender.h).
      auto got = co_await pipes_in_.receive(stream_.socket(), want, [this] {
        session_.onPipedProgress(protocol::Clock::now());
      });
      if (closed_) break;
      if (!got.ok()) {
        fail(protoError(v1::UNAVAILABLE, absl::StrCat("read from ", peer_, ": ", got.status().message())));
        break;
      }
      // Without a pipe, the read below takes the bytes in memory.
      taken = got->piped || !got->partial.empty();
      if (got->piped) {
        s = session_.onPiped(std::move(got->piped), handler_, protocol::Clock::now());
      } else if (!got->partial.empty()) {
        s = session_.onBytes(got->partial, handler_, protocol::Clock::now());
      }
    }
    if (!taken) {
      auto buf = session_.readBuffer(64 * 1024);
      error_code ec;
      size_t n = co_await stream_.async_read_some(asio::buffer(buf.data(), buf.size()),
                                                  asio::redirect_error(use_awaitable, ec));
      if (closed_) break;
      if (ec) {
        fail(ec == asio::error::eof || ec == ssl::error::stream_truncated
                 ? protoError(v1::UNAVAILABLE, absl::StrCat("connection closed by ", peer_))
                 : protoError(v1::UNAVAILABLE,
                              absl::StrCat("read from ", peer_, ": ", ec.message())));
        break;
      }
      s = session_.onRead(n, handler_, protocol::Clock::now());
    }
    if (!s.ok()) {
      // Tell the peer why, then close once the Goaway is written.
      session_.sendGoaway(errorCodeOf(s), sv(s.message()));
      if (status_.ok()) status_ = s;
      closeAfterFlush();
    }
    // What was read may owe the peer an ack before the ticker's next wake.
    if (session_.nextTick() < tick_timer_.expiry()) tick_timer_.cancel();
    wake();
  }
  // Let a pending Goaway go out, for a bounded time (a peer that does not
  // read must not hold us).
  asio::steady_timer flush_wait(ex);
  for (int i = 0; i < 200 && close_after_flush_ && !closed_ && !writer_done_; ++i) {
    flush_wait.expires_after(std::chrono::milliseconds(10));
    error_code ec;
    co_await flush_wait.async_wait(asio::redirect_error(use_awaitable, ec));
  }
  close();
  // The writer and the ticker use the session, which our owner may destroy
  // as soon as run() returns: wait until both have stopped touching it.
  while (!writer_done_ || !ticker_done_) co_await done_signal_.wait();
  co_return status_;
}

awaitable<void> SessionTransport::writer(std::shared_ptr<SessionTransport> self) {
  // GCC 12 drops coroutine parameters the body never names: hold the owner
  // in a frame variable so it outlives every suspension.
  const auto keep_alive = std::move(self);
  std::vector<asio::const_buffer> buffers;
  while (!closed_) {
    if (!session_.hasWrites()) {
      if (close_after_flush_) break;
      co_await writer_signal_.wait();
      continue;
    }
    // Room in the socket first (TCP_NOTSENT_LOWAT): frames wait here, in
    // the session, where a later small one is not behind a whole buffer.
    {
      error_code ec;
      co_await stream_.socket().async_wait(tcp::socket::wait_write,
                                           asio::redirect_error(use_awaitable, ec));
      if (closed_) break;
      if (ec) {
        fail(protoError(v1::UNAVAILABLE, absl::StrCat("write to ", peer_, ": ", ec.message())));
        break;
      }
      if (!session_.hasWrites()) continue;
    }
    notePathRtt();
    // Gathered write of many frames; data payloads go as their own buffers.
    protocol::WriteBatch batch = session_.takeWrites(kBatchBytes);
    // Streams whose queued bytes just went may read more for the next one.
    session_.pollWritable(handler_);
    buffers.clear();
    error_code ec;
    absl::Status failed;
    if (stream_.tls()) {
      // asio::ssl writes one buffer per call, each its own record: small
      // frames would cost a record and a system call each. Encryption
      // copies the bytes anyway; gather them first (piped reads too).
      for (const auto& f : batch.frames) {
        if (!f->piped) continue;
        if (auto m = f->piped->materialize(); !m.ok()) failed = m.status();
      }
      if (failed.ok()) {
        gathered_.clear();
        for (std::string_view b : batch.buffers()) gathered_.append(b);
        co_await asio::async_write(stream_, asio::buffer(gathered_),
                                   asio::redirect_error(use_awaitable, ec));
      }
    } else {
      for (const auto& f : batch.frames) {
        buffers.emplace_back(f->head.data(), f->head.size());
        if (!f->payload.empty()) buffers.emplace_back(f->payload.data(), f->payload.size());
        if (!f->piped) continue;
        size_t spliced = 0;
        if (!f->piped->materialized() && pipes_.usable()) {
          // What is gathered, this frame's head included, goes first; then
          // the read's bytes from their pipe, uncopied.
          co_await asio::async_write(stream_, buffers, asio::redirect_error(use_awaitable, ec));
          buffers.clear();
          if (ec || closed_) break;
          auto sent = co_await pipes_.send(stream_.socket(), *f->piped);
          if (!sent.ok()) {
            failed = sent.status();
            break;
          }
          spliced = *sent;
          if (spliced == f->piped->size()) continue;
        }
        // Whatever did not splice goes from memory.
        auto bytes = f->piped->materialize();
        if (!bytes.ok()) {
          failed = bytes.status();
          break;
        }
        buffers.emplace_back(bytes->data() + spliced, bytes->size() - spliced);
      }
      if (!ec && failed.ok() && !closed_ && !buffers.empty()) {
        co_await asio::async_write(stream_, buffers, asio::redirect_error(use_awaitable, ec));
      }
    }
    if (closed_) break;
    if (!failed.ok()) {
      fail(protoError(v1::UNAVAILABLE,
                      absl::StrCat("write to ", peer_, ": ", failed.message())));
      break;
    }
    if (ec) {
      fail(protoError(v1::UNAVAILABLE, absl::StrCat("write to ", peer_, ": ", ec.message())));
      break;
    }
  }
  writer_done_ = true;
  if (close_after_flush_ && linger_ && !closed_) {
    // Everything is written: say so with a FIN, and give the peer until
    // the bound to close its side (the reader sees it and closes).
    error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) {
      close();
    } else {
      linger_timer_.expires_after(linger_bound_);
      linger_timer_.async_wait([self = keep_alive](error_code e) {
        if (!e) self->close();
      });
    }
  } else if (close_after_flush_) {
    close();
  }
  done_signal_.notify();
}

awaitable<void> SessionTransport::ticker(std::shared_ptr<SessionTransport> self) {
  // GCC 12 drops coroutine parameters the body never names: hold the owner
  // in a frame variable so it outlives every suspension.
  const auto keep_alive = std::move(self);
  while (!closed_) {
    auto next = session_.nextTick();
    // Session and timer share the steady clock.
    tick_timer_.expires_at(next);
    error_code ec;
    co_await tick_timer_.async_wait(asio::redirect_error(use_awaitable, ec));
    if (closed_) break;
    absl::Status s = session_.onTick(protocol::Clock::now());
    if (!s.ok()) {
      fail(s);
      break;
    }
    wake();
  }
  ticker_done_ = true;
  done_signal_.notify();
}

absl::Status splitHostPort(const std::string& in, std::string* host, std::string* port) {
  auto bad = [&](std::string_view why) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("bad address '", in, "': ", asv(why), " (want HOST:PORT)"));
  };
  size_t colon;
  if (!in.empty() && in[0] == '[') {
    size_t close = in.find(']');
    if (close == std::string::npos || close + 1 >= in.size() || in[close + 1] != ':') {
      return bad("unbalanced brackets");
    }
    *host = in.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = in.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    *host = in.substr(0, colon);
    if (host->find(':') != std::string::npos) return bad("IPv6 addresses need [brackets]");
  }
  *port = in.substr(colon + 1);
  if (host->empty()) return bad("no host");
  if (port->empty() || port->find_first_not_of("0123456789") != std::string::npos ||
      port->size() > 5 || std::stoul(*port) > 65535) {
    return bad("port must be a number from 0 to 65535");
  }
  return absl::OkStatus();
}

}  // namespace siphon::net
