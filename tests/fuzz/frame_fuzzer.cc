// libFuzzer target: arbitrary bytes into the frame decoder, the handshake
// helpers and a Session of each role whose handler calls back into it the way
// an application does. Nothing may crash, leak, read out of bounds or hit
// undefined behaviour; a few invariants are checked on the way (a decoded
// frame re-encodes to something that decodes the same; errors are sticky).
//
// Seed corpus: run the binary with SIPHON_FUZZ_WRITE_SEEDS=DIR to write a few
// valid exchanges there and exit (scripts/fuzz.sh does).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "siphon/protocol/codec.h"
#include "siphon/protocol/handshake.h"
#include "siphon/protocol/limits.h"
#include "siphon/protocol/session.h"
#include "siphon/status.h"

namespace siphon::protocol {
namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

// Reads bytes of the input as a source of small choices (split points and
// the like) without consuming the frames themselves.
class Choices {
 public:
  explicit Choices(std::string_view in) : in_(in) {}
  size_t upTo(size_t n) {
    if (n == 0 || in_.empty()) return 0;
    size_t v = static_cast<unsigned char>(in_[at_++ % in_.size()]);
    v = (v << 8) | static_cast<unsigned char>(in_[at_++ % in_.size()]);
    return v % (n + 1);
  }

 private:
  std::string_view in_;
  size_t at_ = 0;
};

// ------------------------------------------------------------ decoder

void checkReencodes(const DecodedFrame& d, uint32_t max_frame_size) {
  std::string again =
      d.is_data ? encodeDataFrame(d.data.stream_id, d.data.payload) : encodeFrame(d.frame);
  FrameDecoder dec(max_frame_size + 64);  // canonical form may be a bit longer
  dec.feed(again);
  auto next = dec.next();
  check(next.ok() && next->has_value(), "a decoded frame re-encodes to a valid frame");
  const DecodedFrame& e = **next;
  check(e.is_data == d.is_data, "re-encoded frame keeps its kind");
  if (d.is_data) {
    check(e.data.stream_id == d.data.stream_id && e.data.payload == d.data.payload,
          "re-encoded data frame keeps stream and payload");
  } else {
    check(e.frame.body_case() == d.frame.body_case(), "re-encoded frame keeps its body");
  }
}

void fuzzDecoder(std::string_view in) {
  Choices choose(in);
  uint32_t max = choose.upTo(1) ? 512 : kDefaultMaxFrameSize;
  FrameDecoder dec(max);
  size_t cut = choose.upTo(in.size());
  size_t cut2 = cut + choose.upTo(in.size() - cut);
  size_t frames_bytes = 0;
  auto drain = [&] {
    while (true) {
      auto next = dec.next();
      if (!next.ok()) {
        // Sticky: the same error again, whatever comes next.
        auto again = dec.next();
        check(!again.ok() && again.status() == next.status(), "decoder errors are sticky");
        check(errorCodeOf(next.status()) == v1::PROTOCOL_ERROR ||
                  errorCodeOf(next.status()) == v1::FRAME_TOO_LARGE,
              "decoder errors are PROTOCOL_ERROR or FRAME_TOO_LARGE");
        return false;
      }
      if (!next->has_value()) return true;
      const DecodedFrame& d = **next;
      check(d.wire_size > kLengthPrefixSize && d.wire_size <= kLengthPrefixSize + max,
            "wire size within the limit");
      frames_bytes += d.wire_size;
      // Touch every payload byte: ASan checks the view is inside live memory.
      volatile unsigned sum = 0;
      for (char c : d.data.payload) sum = sum + static_cast<unsigned char>(c);
      checkReencodes(d, max);
    }
  };
  // Three feeds: feed(), prepare()/commit(), feed().
  dec.feed(in.substr(0, cut));
  if (!drain()) return;
  std::string_view mid = in.substr(cut, cut2 - cut);
  std::span<char> room = dec.prepare(mid.size());
  check(room.size() >= mid.size(), "prepare gives the room asked for");
  std::copy(mid.begin(), mid.end(), room.begin());
  dec.commit(mid.size());
  if (!drain()) return;
  dec.feed(in.substr(cut2));
  if (!drain()) return;
  // Nothing is lost: what was not returned is still buffered.
  std::string rest = dec.takeBuffered();
  check(frames_bytes + rest.size() == in.size(), "decoded + buffered == fed");
  check(dec.buffered() == 0, "takeBuffered empties the decoder");
}

// A decoder receiving large file answers into their own strings
// (setDetachFileData, the client's) decodes the same frames as a plain one,
// and fails where it fails, whatever the chunking. The input is also made
// to start with a valid file answer head now and then, so the fuzzer need
// not find that layout on its own. Sometimes that answer's request is
// marked piped, and the bytes it still wants go in a pipe (the client's
// splice receive): the frames are the same again.
void fuzzDetached(std::string_view raw) {
  Choices choose(raw);
  std::string in;
  std::optional<uint64_t> piped_id;
  if (choose.upTo(1)) {
    v1::Response r;
    r.set_request_id(choose.upTo(1000));
    if (choose.upTo(1)) piped_id = r.request_id();
    r.mutable_file()->mutable_data()->set_eof(choose.upTo(1) != 0);
    const size_t data = 1 + choose.upTo(raw.size() + 100);
    in = encodeFileDataResponseHead(r, data);
  }
  in.append(raw);
  const uint32_t max = choose.upTo(1) ? 512 : kDefaultMaxFrameSize;
  auto frames = [&](FrameDecoder& dec, bool detach) {
    std::vector<std::string> out;  // each frame re-encoded, then "error"
    if (detach) dec.setDetachFileData(1 + choose.upTo(64));
    if (detach && piped_id) dec.expectPiped(*piped_id);
    std::string_view rest = in;
    bool failed = false;
    while (!rest.empty() && !failed) {
      // A pipe's default 64 KiB take the wanted bytes without a reader.
      if (const size_t wanted = dec.pipeWanted();
          wanted > 0 && wanted <= rest.size() && wanted <= 65536) {
        int fds[2];
        check(::pipe(fds) == 0, "pipe");
        check(::write(fds[1], rest.data(), wanted) == static_cast<ssize_t>(wanted),
              "the pipe takes the bytes");
        ::close(fds[1]);
        dec.commitPiped(std::make_shared<PipedBytes>(fds[0], wanted));
        rest.remove_prefix(wanted);
      } else {
        std::span<char> room = dec.prepare(1 + choose.upTo(300));
        check(!room.empty(), "prepare gives some room");
        const size_t n = std::min({room.size(), rest.size(), 1 + choose.upTo(rest.size())});
        std::copy(rest.begin(), rest.begin() + static_cast<ptrdiff_t>(n), room.begin());
        dec.commit(n);
        rest.remove_prefix(n);
      }
      while (true) {
        auto next = dec.next();
        if (!next.ok()) {
          out.push_back("error " + std::string(next.status().message()));
          failed = true;
          break;
        }
        if (!next->has_value()) break;
        DecodedFrame& d = **next;
        if (d.piped) {
          auto bytes = d.piped->materialize();
          check(bytes.ok(), "a committed pipe holds its bytes");
          d.frame.mutable_response()->mutable_file()->mutable_data()->mutable_data()->append(
              *bytes);
        }
        out.push_back(d.is_data ? encodeDataFrame(d.data.stream_id, d.data.payload)
                                : encodeFrame(d.frame));
        out.push_back(std::to_string(d.wire_size));
      }
    }
    if (!failed) out.push_back("buffered " + std::to_string(dec.buffered()));
    return out;
  };
  FrameDecoder plain(max), detached(max);
  check(frames(plain, false) == frames(detached, true),
        "a detaching decoder decodes what a plain one does");
}

// ------------------------------------------------------------ session

// Answers like an application: accepts streams, consumes and echoes data,
// answers requests, opens and resets now and then.
class EchoApp : public SessionHandler {
 public:
  explicit EchoApp(Session& s) : s_(s) {}

  void onRequest(v1::Request r) override {
    v1::Response resp;
    resp.set_request_id(r.request_id());
    if (++events_ % 3 == 0) resp.mutable_error()->set_code(v1::NOT_FOUND);
    s_.sendResponse(resp);
    if (events_ % 5 == 0) (void)s_.sendRequest(v1::Request());
  }
  void onStreamOpen(v1::StreamOpen open) override {
    if (++events_ % 4 == 0) {
      s_.resetStream(open.stream_id(), v1::Error());
      return;
    }
    v1::StreamAccept a;
    a.set_stream_id(open.stream_id());
    a.set_initial_window(events_ % 2 ? 0 : 100);
    (void)s_.acceptStream(a);
    (void)s_.acceptStream(a);  // twice: must be refused, not crash
  }
  void onStreamAccept(v1::StreamAccept a) override { echo(a.stream_id(), "hi"); }
  void onStreamData(uint64_t id, std::string_view payload) override {
    s_.consumed(id, payload.size());
    echo(id, payload);
    if (++events_ % 7 == 0) (void)s_.halfClose(id);
  }
  void onStreamDatagram(v1::StreamDatagram d) override {
    s_.consumed(d.stream_id(), d.payload().size());
    v1::StreamDatagram back = d;
    (void)s_.sendDatagram(back);
  }
  void onStreamHalfClose(uint64_t id) override { (void)s_.halfClose(id); }
  void onStreamReset(uint64_t id, v1::Error) override {
    (void)s_.sendData(id, "x");  // on a gone stream: STREAM_CLOSED
  }
  void onStreamWritable(uint64_t id) override { echo(id, "more"); }
  void onStreamGap(v1::StreamGap g) override { (void)s_.sendGap(g); }
  void onDraining(v1::Draining) override {
    if (s_.streamCount() < 4) (void)s_.openStream(v1::StreamOpen());
  }

 private:
  void echo(uint64_t id, std::string_view bytes) {
    size_t n = std::min(s_.sendCredit(id), bytes.size());
    if (n > 0) check(s_.sendData(id, std::string(bytes.substr(0, n))).ok(), "send within credit");
  }

  Session& s_;
  int events_ = 0;
};

SessionLimits fuzzLimits() {
  // Small, so the limits are reached by short inputs.
  SessionLimits l;
  l.max_frame_size = 4096;
  l.initial_stream_window = 1024;
  l.max_streams = 4;
  l.max_pending_requests = 4;
  l.replay_buffer_bytes = 16 * 1024;
  return l;
}

void fuzzSession(Role role, std::string_view in) {
  Choices choose(in);
  TimePoint now = TimePoint() + std::chrono::hours(1);
  // The handshake: the first frame is the peer's Hello (we are the agent) or
  // its Welcome/Reject (we are the client).
  SessionLimits limits = fuzzLimits();
  FrameDecoder hs(limits.max_frame_size);
  hs.feed(in);
  auto first = hs.next();
  std::string rest(in);
  if (first.ok() && first->has_value() && !(*first)->is_data) {
    const v1::Frame& f = (*first)->frame;
    if (role == Role::kAgent && f.has_hello()) {
      (void)negotiateVersion(f.hello().version(), currentVersion());
      (void)constantTimeEquals(f.hello().auth_token(), "fuzz-token");
      limits = negotiateLimits(f.hello().requested_limits(), fuzzLimits());
    } else if (role == Role::kClient) {
      auto welcome = welcomeFrom(f);
      if (welcome.ok()) {
        (void)negotiateVersion(currentVersion(), welcome->version());
        SessionLimits offered = fromProto(welcome->limits());
        // A client keeps its own bounds on what a peer may make it hold.
        limits.max_streams = std::min(offered.max_streams, 64u);
        limits.initial_stream_window = std::clamp(offered.initial_stream_window, 1024u, 1u << 20);
      } else {
        check(errorCodeOf(welcome.status()) != v1::OK, "a refusal is never OK");
      }
    }
    rest = hs.takeBuffered();
  }

  Session s(role, limits, now);
  EchoApp app(s);
  // Streams of our own too, so accepts, window updates and acks from the
  // peer have something to act on.
  (void)s.openStream(v1::StreamOpen());
  (void)s.sendRequest(v1::Request());
  std::string_view bytes(rest);
  for (int round = 0; !bytes.empty() && round < 4; ++round) {
    size_t n = round == 3 ? bytes.size() : choose.upTo(bytes.size());
    // Writes are taken (as a transport would) so acks can be valid.
    (void)s.takeWrites(choose.upTo(1) ? 100 : 1 << 20);
    absl::Status st;
    if (choose.upTo(1) && n > 0) {
      // The zero-copy path.
      std::span<char> room = s.readBuffer(n);
      std::copy_n(bytes.data(), n, room.data());
      st = s.onRead(n, app, now);
    } else {
      st = s.onBytes(bytes.substr(0, n), app, now);
    }
    bytes.remove_prefix(n);
    if (!st.ok()) {
      // INTERNAL would be a broken invariant of ours, not a bad peer.
      check(errorCodeOf(st) != v1::OK && errorCodeOf(st) != v1::INTERNAL,
            "session errors are typed");
      s.sendGoaway(errorCodeOf(st), std::string(st.message()));
      (void)s.takeWrites();
      return;
    }
    now += std::chrono::milliseconds(choose.upTo(30000));
    (void)s.onTick(now);
    (void)s.nextTick();
    if (choose.upTo(7) == 0) {
      // A cut and a resume from a count the input chooses.
      s.onTransportLost();
      (void)s.sendRequest(v1::Request());
      if (!s.resume(choose.upTo(s.sentCount() + 1), now).ok()) return;
    }
    for (uint64_t id : s.streamIds()) (void)s.sendCredit(id);
  }
  while (s.hasWrites()) {
    WriteBatch b = s.takeWrites();
    size_t total = 0;
    for (std::string_view v : b.buffers()) total += v.size();
    check(total == b.bytes, "batch byte count");
  }
  check(s.receivedCount() <= in.size() / kLengthPrefixSize, "received count is plausible");
}

// ------------------------------------------------------------ seeds

std::string frame(void (*fill)(v1::Frame&)) {
  v1::Frame f;
  fill(f);
  return encodeFrame(f);
}

std::vector<std::string> seeds() {
  v1::Limits asked;
  asked.set_max_frame_size(8192);
  asked.set_initial_stream_window(2048);
  std::string hello = encodeFrame(makeHello("fuzz", "fuzz-token", asked, nullptr));
  std::string welcome = frame([](v1::Frame& f) {
    *f.mutable_welcome()->mutable_version() = currentVersion();
    f.mutable_welcome()->set_session_id("s");
    *f.mutable_welcome()->mutable_limits() = toProto(SessionLimits());
  });
  // What a client sends an agent: streams 1 and 3, data, a window update for
  // the agent's stream 2, requests, a half-close, a reset, acks and pings.
  std::string to_agent = frame([](v1::Frame& f) {
                           f.mutable_open()->set_stream_id(1);
                           f.mutable_open()->set_initial_window(4096);
                         }) +
                         frame([](v1::Frame& f) { f.mutable_accept()->set_stream_id(2); }) +
                         encodeDataFrame(1, "GET / HTTP/1.1\r\n\r\n") +
                         encodeDataFrame(2, "hello") + frame([](v1::Frame& f) {
                           f.mutable_request()->set_request_id(1);
                           f.mutable_request()->mutable_env()->add_include("*");
                         }) +
                         frame([](v1::Frame& f) { f.mutable_ack()->set_received(1); }) +
                         frame([](v1::Frame& f) {
                           f.mutable_window_update()->set_stream_id(2);
                           f.mutable_window_update()->set_increment(512);
                         }) +
                         frame([](v1::Frame& f) { f.mutable_ping()->set_nonce(7); }) +
                         frame([](v1::Frame& f) { f.mutable_half_close()->set_stream_id(1); }) +
                         frame([](v1::Frame& f) {
                           f.mutable_open()->set_stream_id(3);
                           f.mutable_open()->mutable_capture()->set_filter("tcp port 80");
                         }) +
                         frame([](v1::Frame& f) {
                           f.mutable_datagram()->set_stream_id(1);
                           f.mutable_datagram()->set_payload("dgram");
                         }) +
                         frame([](v1::Frame& f) {
                           f.mutable_reset()->set_stream_id(3);
                           f.mutable_reset()->mutable_error()->set_code(v1::CANCELLED);
                         });
  // What an agent sends a client: the mirror image, and draining.
  std::string to_client =
      frame([](v1::Frame& f) { f.mutable_accept()->set_stream_id(1); }) + frame([](v1::Frame& f) {
        f.mutable_open()->set_stream_id(2);
        f.mutable_open()->mutable_stolen()->set_subscription_id(1);
      }) +
      encodeDataFrame(2, std::string(300, 's')) + encodeDataFrame(1, "") + frame([](v1::Frame& f) {
        f.mutable_response()->set_request_id(1);
        f.mutable_response()->mutable_error()->set_code(v1::ERRNO);
      }) +
      frame([](v1::Frame& f) {
        f.mutable_gap()->set_stream_id(2);
        f.mutable_gap()->set_bytes(100);
      }) +
      frame([](v1::Frame& f) { f.mutable_pong()->set_nonce(1); }) +
      frame([](v1::Frame& f) { f.mutable_draining()->set_deadline_unix_ms(1); }) +
      frame([](v1::Frame& f) { f.mutable_notice()->mutable_overlap()->set_requests(2); }) +
      frame([](v1::Frame& f) { f.mutable_goaway()->set_code(v1::AGENT_DRAINING); });
  std::string reject = encodeFrame(makeReject(v1::UNAUTHENTICATED, "no"));
  return {hello + to_agent,
          welcome + to_client,
          reject,
          hello,
          to_agent + to_client,
          hello + std::string("\0\0\0\0", 4),
          std::string("\x00\x10\x00\x01", 4) + to_agent};
}

}  // namespace
}  // namespace siphon::protocol

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // protobuf logs every proto3 string field with invalid UTF-8 it refuses;
  // thousands of lines a second would drown the fuzzer's own output.
  google::protobuf::SetLogHandler(nullptr);
  if (const char* dir = std::getenv("SIPHON_FUZZ_WRITE_SEEDS")) {
    int i = 0;
    for (const std::string& seed : siphon::protocol::seeds()) {
      std::string path = std::string(dir) + "/seed-" + std::to_string(i++);
      std::ofstream out(path, std::ios::binary);
      out << seed;
      if (!out) {
        std::fprintf(stderr, "cannot write %s\n", path.c_str());
        std::exit(1);
      }
    }
    std::fprintf(stderr, "wrote %d seeds to %s\n", i, dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  siphon::protocol::fuzzDecoder(in);
  siphon::protocol::fuzzDetached(in);
  siphon::protocol::fuzzSession(siphon::protocol::Role::kAgent, in);
  siphon::protocol::fuzzSession(siphon::protocol::Role::kClient, in);
  return 0;
}
