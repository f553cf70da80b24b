// libFuzzer target: the HTTP/2 client side of filtered steals as nghttp2
// decodes it, with the limits of agent/steal/http/http2_limits.h applied
// the way http2.cc applies them. The engine itself (serveHttp2) runs on
// Asio coroutines, which clang 14 with libstdc++ 12 cannot compile, so this
// target drives a real nghttp2 server session set up as the engine's
// (NO_AUTO_WINDOW_UPDATE, nghttp2's CONTINUATION limit behind ours, the
// same SETTINGS) with callbacks that count exactly as the engine's do:
// HeaderBlockBudget per header block, checked before a field is kept,
// NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE on refusal; EventBudget for
// resets, control frames and refused blocks; GOAWAY(ENHANCE_YOUR_CALM) by
// nghttp2_session_terminate_session when one is spent.
//
// The first byte picks the knobs: bit 0 prepends the client preface and an
// empty SETTINGS (so the fuzzer starts past them), bit 1 a small
// --http-max-head (256 bytes); bit 2 feeds the rest in pieces of 61 bytes
// instead of at once.
//
// Checked, the nghttp2 behaviour the engine's bounds rest on: no header
// block kept passes the limits; a refused block emits no further field; a
// terminated session delivers no further frame or stream; the session's
// own output frames correctly (no frame past 16384 bytes).
#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "agent/steal/http/http2_limits.h"
#include "tests/fuzz/fuzz_util.h"

namespace siphon::agent::steal::http {
namespace {

using fuzz::check;

constexpr std::string_view kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr std::string_view kEmptySettings{"\0\0\0\4\0\0\0\0\0", 9};
// As http2.cc.
constexpr size_t kMaxContinuations = 8;
constexpr size_t kNghttp2MaxContinuations = 64;

struct Stream {
  HeaderBlockBudget block;
  size_t kept = 0;  // bytes of fields kept (as RFC 7541 counts them)
  bool refused = false;
};

struct Connection {
  explicit Connection(size_t max_head) : max_head(max_head) {}
  size_t max_head;
  nghttp2_session* session = nullptr;
  std::map<int32_t, Stream> streams;
  EventBudget header_refusals{8, 1};
  EventBudget resets{200, 50};
  EventBudget control{200, 20};
  size_t continuations = 0;
  bool calm = false;
  // A clock that only the input moves (one tick per frame): the budgets
  // see a flood, whatever the fuzzer's speed.
  EventBudget::Clock::time_point now{};

  void terminate() {
    if (calm) return;
    calm = true;
    nghttp2_session_terminate_session(session, NGHTTP2_ENHANCE_YOUR_CALM);
  }
};

Connection* conn(void* ud) { return static_cast<Connection*>(ud); }

int onBeginFrame(nghttp2_session*, const nghttp2_frame_hd* hd, void* ud) {
  Connection* c = conn(ud);
  c->now += std::chrono::milliseconds(1);
  if (c->calm) return 0;
  const bool ack = (hd->flags & NGHTTP2_FLAG_ACK) != 0;
  switch (hd->type) {
    case NGHTTP2_HEADERS:
      c->continuations = 0;
      break;
    case NGHTTP2_CONTINUATION:
      if (++c->continuations > kMaxContinuations) c->terminate();
      break;
    case NGHTTP2_PING:
    case NGHTTP2_SETTINGS:
      if (!ack && !c->control.take(c->now)) c->terminate();
      break;
    case NGHTTP2_PRIORITY:
      if (!c->control.take(c->now)) c->terminate();
      break;
    default:
      break;
  }
  return 0;
}

int onBeginHeaders(nghttp2_session*, const nghttp2_frame* frame, void* ud) {
  Connection* c = conn(ud);
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  if (c->calm) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  auto it = c->streams.find(frame->hd.stream_id);
  if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
    c->streams.insert_or_assign(frame->hd.stream_id,
                                Stream{HeaderBlockBudget(c->max_head, kHttp2MaxHeaderFields)});
  } else if (it != c->streams.end()) {
    it->second.block.reset();
    it->second.kept = 0;
    it->second.refused = false;
  }
  return 0;
}

int onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t*, size_t namelen,
             const uint8_t*, size_t valuelen, uint8_t, void* ud) {
  Connection* c = conn(ud);
  auto it = c->streams.find(frame->hd.stream_id);
  if (it == c->streams.end()) return 0;
  Stream& s = it->second;
  check(!s.refused, "a refused header block emits no further field");
  if (!s.block.add(namelen, valuelen)) {
    s.refused = true;
    if (!c->header_refusals.take(c->now)) c->terminate();
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  }
  s.kept += namelen + valuelen + kHeaderFieldOverhead;
  check(s.kept <= c->max_head, "a kept header block stays within --http-max-head");
  check(s.block.fields() <= kHttp2MaxHeaderFields, "a kept header block stays within the count");
  return 0;
}

int onFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* ud) {
  Connection* c = conn(ud);
  // A request the engine would route: its begin was accepted (a stream
  // refused in on_begin_headers, as after a GOAWAY for a limit, is never
  // delivered), and its block was not refused.
  if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
    auto it = c->streams.find(frame->hd.stream_id);
    check(it != c->streams.end(), "a delivered request was begun");
    check(!it->second.refused, "a refused header block is not delivered");
  }
  return 0;
}

int onStreamClose(nghttp2_session*, int32_t stream_id, uint32_t, void* ud) {
  Connection* c = conn(ud);
  if (c->streams.erase(stream_id) > 0 && !c->calm && !c->resets.take(c->now)) c->terminate();
  return 0;
}

int onData(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t*, size_t len,
           void*) {
  nghttp2_session_consume(session, stream_id, len);
  return 0;
}

void checkOutput(std::string_view out) {
  while (out.size() >= 9) {
    const size_t len = (size_t{static_cast<uint8_t>(out[0])} << 16) |
                       (size_t{static_cast<uint8_t>(out[1])} << 8) | static_cast<uint8_t>(out[2]);
    check(len <= 16384, "no frame past the client's default SETTINGS_MAX_FRAME_SIZE");
    check(out.size() >= 9 + len, "the session's output is whole frames");
    out.remove_prefix(9 + len);
  }
  check(out.empty(), "the session's output is whole frames");
}

void fuzzConnection(std::string_view in, size_t max_head, size_t piece) {
  Connection c(max_head);
  nghttp2_session_callbacks* cbs;
  check(nghttp2_session_callbacks_new(&cbs) == 0, "callbacks");
  nghttp2_session_callbacks_set_on_begin_frame_callback(cbs, &onBeginFrame);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, &onBeginHeaders);
  nghttp2_session_callbacks_set_on_header_callback(cbs, &onHeader);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &onFrameRecv);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &onStreamClose);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &onData);
  nghttp2_option* opt;
  check(nghttp2_option_new(&opt) == 0, "options");
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_option_set_max_continuations(opt, kNghttp2MaxContinuations);
  check(nghttp2_session_server_new2(&c.session, cbs, &c, opt) == 0, "session");
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cbs);
  const nghttp2_settings_entry iv[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 128},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 64 * 1024},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<uint32_t>(max_head)},
  };
  nghttp2_submit_settings(c.session, NGHTTP2_FLAG_NONE, iv, 3);

  std::string out;
  const auto send = [&] {
    for (;;) {
      const uint8_t* data;
      const ssize_t n = nghttp2_session_mem_send(c.session, &data);
      if (n <= 0) return;
      out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
  };
  send();
  while (!in.empty()) {
    const std::string_view chunk = in.substr(0, piece);
    in.remove_prefix(chunk.size());
    // The engine feeds nghttp2 nothing more after a GOAWAY for a limit.
    if (c.calm) break;
    // An exactly sized copy, so ASan sees any read past it.
    const std::string copy(chunk);
    const ssize_t rv = nghttp2_session_mem_recv(
        c.session, reinterpret_cast<const uint8_t*>(copy.data()), copy.size());
    if (rv < 0) {
      c.terminate();  // the engine's answer to a fatal error
      break;
    }
    check(static_cast<size_t>(rv) == copy.size(), "mem_recv takes all it is given");
    send();
  }
  send();
  checkOutput(out);
  nghttp2_session_del(c.session);
}

std::string frame(uint8_t type, uint8_t flags, uint32_t stream, std::string_view payload) {
  std::string out;
  out.push_back(static_cast<char>(payload.size() >> 16));
  out.push_back(static_cast<char>(payload.size() >> 8));
  out.push_back(static_cast<char>(payload.size()));
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<char>((stream >> shift) & 0xff));
  out.append(payload);
  return out;
}

// A GET (:method GET, :scheme http, :path /, :authority a), then `extra`.
std::string getBlock(std::string_view extra = {}) {
  return std::string(
             "\x82\x86\x84\x01\x01"
             "a",
             6) +
         std::string(extra);
}

std::vector<std::string> seeds() {
  const uint8_t end = NGHTTP2_FLAG_END_STREAM | NGHTTP2_FLAG_END_HEADERS;
  // A 200-byte field added to the dynamic table, then referenced 100 times.
  std::string amplified = std::string("\x40\x05x-big\x7f\x49", 9) + std::string(200, 'a');
  for (int i = 0; i < 100; ++i) amplified += '\xbe';
  std::string steal = std::string("\x00\x07x-steal\x01y", 11);
  std::string resets;
  for (uint32_t id = 1; id < 600; id += 2) {
    resets += frame(NGHTTP2_HEADERS, end, id, getBlock());
    resets += frame(NGHTTP2_RST_STREAM, 0, id, std::string("\0\0\0\x08", 4));
  }
  std::string pings;
  for (int i = 0; i < 300; ++i) pings += frame(NGHTTP2_PING, 0, 0, "12345678");
  std::string continuations = frame(NGHTTP2_HEADERS, 0, 1, getBlock());
  for (int i = 0; i < 20; ++i) continuations += frame(NGHTTP2_CONTINUATION, 0, 1, "");
  return {
      std::string("\x01", 1) + frame(NGHTTP2_HEADERS, end, 1, getBlock()),
      std::string("\x01", 1) + frame(NGHTTP2_HEADERS, end, 1, getBlock(steal)),
      std::string("\x03", 1) + frame(NGHTTP2_HEADERS, end, 1, getBlock(amplified)),
      std::string("\x05", 1) +
          frame(NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS, 1, getBlock(steal)) +
          frame(NGHTTP2_DATA, 0, 1, std::string(40, 'b')) +
          frame(NGHTTP2_HEADERS, end, 1, std::string("\x00\x02x-\x01t", 6)),
      std::string("\x01", 1) + resets,
      std::string("\x01", 1) + pings,
      std::string("\x01", 1) + continuations,
      std::string("\x00", 1) + std::string(kPreface) + std::string(kEmptySettings) +
          frame(NGHTTP2_WINDOW_UPDATE, 0, 0, std::string("\0\0\x10\0", 4)) +
          frame(NGHTTP2_GOAWAY, 0, 0, std::string("\0\0\0\0\0\0\0\0", 8)),
  };
}

}  // namespace
}  // namespace siphon::agent::steal::http

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  siphon::fuzz::writeSeedsIfAsked(siphon::agent::steal::http::seeds());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace siphon::agent::steal::http;
  siphon::fuzz::Input in(std::string_view(reinterpret_cast<const char*>(data), size));
  const uint8_t knobs = in.byte();
  const size_t max_head = (knobs & 2) ? 256 : 64 * 1024;
  const size_t piece = (knobs & 4) ? 61 : SIZE_MAX;
  std::string bytes;
  if (knobs & 1) bytes = std::string(kPreface) + std::string(kEmptySettings);
  bytes.append(in.rest());
  fuzzConnection(bytes, max_head, piece);
  return 0;
}
