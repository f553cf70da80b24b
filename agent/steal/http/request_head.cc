#include "agent/steal/http/request_head.h"

#include <strings.h>

namespace siphon::agent::steal::http {

std::string_view RequestHead::pathAndQuery() const {
  std::string_view t = target;
  // Absolute form: scheme "://" authority, then the path.
  if (const size_t scheme = t.find("://"); scheme != std::string_view::npos && !t.starts_with('/')) {
    const size_t path = t.find('/', scheme + 3);
    return path == std::string_view::npos ? std::string_view("/") : t.substr(path);
  }
  return t;
}

std::string_view RequestHead::path() const {
  std::string_view pq = pathAndQuery();
  return pq.substr(0, pq.find('?'));
}

std::vector<std::string_view> RequestHead::values(std::string_view name) const {
  std::vector<std::string_view> out;
  for (const auto& [n, v] : headers) {
    if (n.size() == name.size() && ::strncasecmp(n.data(), name.data(), n.size()) == 0) {
      out.push_back(v);
    }
  }
  return out;
}

std::string RequestHead::protocol() const {
  if (version == 20) return "HTTP/2";
  return version == 10 ? "HTTP/1.0" : "HTTP/1.1";
}

}  // namespace siphon::agent::steal::http
