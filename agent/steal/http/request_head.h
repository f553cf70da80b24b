// One HTTP request's head as the filters and the router see it, whatever
// the client spoke (HTTP/1.x or HTTP/2).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace siphon::agent::steal::http {

struct RequestHead {
  std::string method;
  // The request target as sent: origin form "/path?query" (HTTP/2: :path),
  // or absolute form, or "*".
  std::string target;
  // 10, 11 (HTTP/1.x) or 20 (HTTP/2).
  int version = 11;
  // In the order received, names as sent (HTTP/2: lower case). HTTP/2's
  // :authority is here as "host"; other pseudo-headers are not.
  std::vector<std::pair<std::string, std::string>> headers;

  // The target's path: up to the '?' (an absolute-form target's path part).
  std::string_view path() const;
  // The target's path and query ("/a?b=1"): for an absolute form, from the
  // path on; otherwise the target.
  std::string_view pathAndQuery() const;
  // The values of header `name` (case-insensitive), in order.
  std::vector<std::string_view> values(std::string_view name) const;
  // "HTTP/1.1", "HTTP/1.0", "HTTP/2".
  std::string protocol() const;
};

}  // namespace siphon::agent::steal::http
