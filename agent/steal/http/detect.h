// Protocol detection: what a connection to a port with filtered steals
// speaks, from its client's first bytes. No I/O: the engine (engine.cc)
// reads, calls detectProtocol() on all it has so far, and reads more while
// the answer is kNeedMore (within HttpOptions::detect_timeout).
#pragma once

#include <cstddef>
#include <string_view>

namespace siphon::agent::steal::http {

enum class Protocol {
  kNeedMore,  // consistent with HTTP so far: read more
  kHttp1,     // an HTTP/1.x request line
  kHttp2,     // the HTTP/2 client preface (prior knowledge)
  kOther,     // anything else: passthrough
};

// The HTTP/2 client connection preface (RFC 9113 §3.4).
inline constexpr std::string_view kHttp2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// HTTP/1 is decided once the request line is seen up to its version
// ("GET /x HTTP/1."): a method token, one space, a target of visible
// characters, one space. Deciding on less would take text protocols that
// start with a word and a space (Redis inline commands, memcached's "get
// key") for HTTP and answer them 400; deciding on more gains nothing.
// `max_line`: a request line still consistent with HTTP beyond this length
// is taken for HTTP/1 (the parser then answers 431), so detection never
// waits for an unbounded line.
Protocol detectProtocol(std::string_view bytes, size_t max_line = 64 * 1024);

}  // namespace siphon::agent::steal::http
