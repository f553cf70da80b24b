// What both ends of the engine's HTTP/2 share: the client connections
// (http2.cc, nghttp2 server sessions) and the connections to the
// application (http2_pool.cc, nghttp2 client sessions). Both run their
// session the same way: NGHTTP2_OPT_NO_AUTO_WINDOW_UPDATE (bytes are
// credited only once the other side took them), one reader coroutine that
// feeds the session, one writer coroutine that sends what it produces.
//
// Threads: the event loop only.
#pragma once

#include <nghttp2/nghttp2.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "agent/steal/http/http2_exchange.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::steal::http {

// A header field for nghttp2 (which copies it on submit).
inline nghttp2_nv nv(std::string_view name, std::string_view value) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                    value.size(), NGHTTP2_NV_FLAG_NONE};
}

inline std::string_view sv(const uint8_t* p, size_t n) {
  return std::string_view(reinterpret_cast<const char*>(p), n);
}

// A new session (server or client) with NGHTTP2_OPT_NO_AUTO_WINDOW_UPDATE;
// `setCallbacks` installs its callbacks, `setOptions` (if given) more
// options. False when nghttp2 could not make it.
bool newHttp2Session(nghttp2_session** session, bool server,
                     void (*setCallbacks)(nghttp2_session_callbacks*), void* user_data,
                     void (*setOptions)(nghttp2_option*) = nullptr);

// Our SETTINGS, and the connection window we give the peer.
bool submitHttp2Settings(nghttp2_session* session, std::span<const nghttp2_settings_entry> settings,
                         int32_t connection_window);

// In a data provider, once the body is all sent: ends the data, and sends
// `trailers` (if any) in a HEADERS frame that ends the stream instead.
void endHttp2Data(nghttp2_session* session, int32_t stream_id, const HeaderList& trailers,
                  uint32_t* data_flags);

// The socket and session of one HTTP/2 connection, and its writer.
//
// Call order: the derived class creates session_ and assigns sock_, then
// spawns writeLoop() (holding itself alive); kick() after anything that may
// give the session something to send.
class Http2Wire {
 public:
  // The session may have something to send: wakes the writer.
  void kick() {
    wake_pending_ = true;
    wake_.notify();
  }

 protected:
  // `error_event`: logged when a coroutine throws; `send_error_event`: logged
  // (debug) when the session fails to produce output, empty for none.
  Http2Wire(net::asio::any_io_executor ex, std::string_view error_event,
            std::string_view send_error_event);
  virtual ~Http2Wire();
  Http2Wire(const Http2Wire&) = delete;
  Http2Wire& operator=(const Http2Wire&) = delete;

  // Sends preamble_, then what the session produces, in batches of up to
  // kWriteBatch, one write at a time: the session produces more only once
  // the previous batch is written, so its flow control bounds what waits
  // here. Ends when the connection closes, or wireIdle() says so.
  net::awaitable<void> writeLoop();

  // The connection is closed (no more I/O).
  virtual bool wireClosed() const = 0;
  // Close the connection (a write or the session failed).
  virtual void wireClose() = 0;
  // The session has nothing to send now (`session_done`: it wants neither
  // to read nor to write): true when the writer ends (the hook closed or
  // finished the connection), false to wait for a kick().
  virtual bool wireIdle(bool session_done) = 0;

  net::asio::posix::stream_descriptor sock_;
  nghttp2_session* session_ = nullptr;
  std::string preamble_;  // bytes to send before the session's next output

 private:
  net::Signal wake_;
  bool wake_pending_ = false;
  std::string_view error_event_;
  std::string_view send_error_event_;
};

}  // namespace siphon::agent::steal::http
