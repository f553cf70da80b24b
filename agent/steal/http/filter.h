// A filtered steal's request filter (v1::HttpFilter), compiled once at
// subscribe time. Regexes are RE2: linear time whatever the input, so a
// hostile request cannot make matching slow, and a pattern RE2 refuses is
// INVALID_ARGUMENT at subscribe time, in RE2's words.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/steal/http/request_head.h"
#include "siphon/v1/services.pb.h"

namespace re2 {
class RE2;
}

namespace siphon::agent::steal::http {

class RequestFilter {
 public:
  // INVALID_ARGUMENT: no test set, a bad regex, a header name or method
  // that is not an HTTP token.
  static absl::StatusOr<std::shared_ptr<const RequestFilter>> compile(const v1::HttpFilter& f);
  ~RequestFilter();

  // Whether the request is this filter's. A kubelet probe (User-Agent
  // "kube-probe/...") never is, unless the filter tests User-Agent itself:
  // a filter that matches everything must not take the probes that keep
  // the pod alive (the application answers them; a developer's server
  // that is slow or down would get the pod restarted).
  bool matches(const RequestHead& head) const;
  // "header x-user: ^alice$ and path ^/api", for logs and messages.
  const std::string& description() const { return description_; }
  // What it was compiled from (a handover sends it to the new agent).
  const v1::HttpFilter& spec() const { return spec_; }

 private:
  RequestFilter() = default;
  struct Header {
    std::string name;
    std::unique_ptr<re2::RE2> value;
  };
  std::vector<Header> headers_;
  std::unique_ptr<re2::RE2> path_;
  std::string method_;
  bool any_ = false;
  bool names_user_agent_ = false;  // a header test on User-Agent: probes may match
  std::string description_;
  v1::HttpFilter spec_;
};

}  // namespace siphon::agent::steal::http
