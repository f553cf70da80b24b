#include "agent/steal/http/http2_wire.h"

#include <vector>

#include "agent/common/log.h"

namespace siphon::agent::steal::http {

namespace asio = net::asio;

namespace {

constexpr size_t kWriteBatch = 64 * 1024;

}  // namespace

bool newHttp2Session(nghttp2_session** session, bool server,
                     void (*setCallbacks)(nghttp2_session_callbacks*), void* user_data,
                     void (*setOptions)(nghttp2_option*)) {
  nghttp2_session_callbacks* cbs;
  if (nghttp2_session_callbacks_new(&cbs) != 0) return false;
  setCallbacks(cbs);
  nghttp2_option* opt;
  nghttp2_option_new(&opt);
  nghttp2_option_set_no_auto_window_update(opt, 1);
  if (setOptions != nullptr) setOptions(opt);
  const int rv = server ? nghttp2_session_server_new2(session, cbs, user_data, opt)
                        : nghttp2_session_client_new2(session, cbs, user_data, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cbs);
  return rv == 0;
}

bool submitHttp2Settings(nghttp2_session* session, std::span<const nghttp2_settings_entry> settings,
                         int32_t connection_window) {
  if (nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, settings.data(), settings.size()) != 0) {
    return false;
  }
  nghttp2_session_set_local_window_size(session, NGHTTP2_FLAG_NONE, 0, connection_window);
  return true;
}

void endHttp2Data(nghttp2_session* session, int32_t stream_id, const HeaderList& trailers,
                  uint32_t* data_flags) {
  *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  if (trailers.empty()) return;
  std::vector<nghttp2_nv> nva;
  for (const auto& [name, value] : trailers) nva.push_back(nv(name, value));
  if (nghttp2_submit_trailer(session, stream_id, nva.data(), nva.size()) == 0) {
    *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
  }
}

Http2Wire::Http2Wire(asio::any_io_executor ex, std::string_view error_event,
                     std::string_view send_error_event)
    : sock_(ex), wake_(ex), error_event_(error_event), send_error_event_(send_error_event) {}

Http2Wire::~Http2Wire() {
  if (session_ != nullptr) nghttp2_session_del(session_);
}

net::awaitable<void> Http2Wire::writeLoop() {
  try {
    std::string out;
    while (!wireClosed()) {
      out.clear();
      out.swap(preamble_);
      wake_pending_ = false;
      while (out.size() < kWriteBatch) {
        const uint8_t* data;
        const ssize_t n = nghttp2_session_mem_send(session_, &data);
        if (n < 0) {
          if (!send_error_event_.empty()) {
            log::debug(send_error_event_, {{"error", nghttp2_strerror(static_cast<int>(n))}});
          }
          wireClose();
          co_return;
        }
        if (n == 0) break;
        out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
      }
      if (wireClosed()) co_return;
      if (out.empty()) {
        const bool done =
            !nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_);
        if (wireIdle(done)) co_return;
        if (!wake_pending_) co_await wake_.wait();
        continue;
      }
      net::error_code ec;
      co_await asio::async_write(sock_, asio::buffer(out),
                                 asio::redirect_error(net::use_awaitable, ec));
      if (ec) {
        wireClose();
        co_return;
      }
    }
  } catch (const std::exception& e) {
    log::error(error_event_, {{"error", e.what()}});
    wireClose();
  }
}

}  // namespace siphon::agent::steal::http
