#include "agent/steal/http/filter.h"

#include <re2/re2.h>

#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "siphon/status.h"

namespace siphon::agent::steal::http {
namespace {

// RFC 9110 token characters.
bool isToken(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (std::isalnum(c)) continue;
    if (std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) == std::string_view::npos) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<re2::RE2>> compileRegex(const std::string& what,
                                                        const std::string& pattern) {
  RE2::Options opt;
  opt.set_log_errors(false);
  auto re = std::make_unique<re2::RE2>(pattern, opt);
  if (!re->ok()) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("HTTP filter: ", what, " regex \"", pattern, "\": ", re->error()));
  }
  return re;
}

}  // namespace

RequestFilter::~RequestFilter() = default;

absl::StatusOr<std::shared_ptr<const RequestFilter>> RequestFilter::compile(
    const v1::HttpFilter& f) {
  std::shared_ptr<RequestFilter> out(new RequestFilter());
  std::vector<std::string> parts;
  for (const v1::HeaderFilter& h : f.headers()) {
    if (!isToken(h.name())) {
      return protoError(v1::INVALID_ARGUMENT,
                        absl::StrCat("HTTP filter: header name \"", h.name(),
                                     "\" is not an HTTP token (write --filter-header 'Name: regex')"));
    }
    ASSIGN_OR_RETURN(auto re, compileRegex(absl::StrCat("header ", h.name()), h.value_regex()));
    if (absl::EqualsIgnoreCase(h.name(), "user-agent")) out->names_user_agent_ = true;
    out->headers_.push_back({h.name(), std::move(re)});
    parts.push_back(absl::StrCat("header ", h.name(), ": ", h.value_regex()));
  }
  if (!f.path_regex().empty()) {
    ASSIGN_OR_RETURN(out->path_, compileRegex("path", f.path_regex()));
    parts.push_back(absl::StrCat("path ", f.path_regex()));
  }
  if (!f.method().empty()) {
    if (!isToken(f.method())) {
      return protoError(v1::INVALID_ARGUMENT, absl::StrCat("HTTP filter: method \"", f.method(),
                                                           "\" is not an HTTP token"));
    }
    out->method_ = f.method();
    parts.push_back(absl::StrCat("method ", f.method()));
  }
  if (parts.empty()) {
    return protoError(v1::INVALID_ARGUMENT,
                      "HTTP filter: no header, path or method to match; steal the whole port "
                      "without a filter instead");
  }
  out->any_ = f.match_any();
  out->description_ = absl::StrJoin(parts, f.match_any() ? " or " : " and ");
  out->spec_ = f;
  return std::shared_ptr<const RequestFilter>(std::move(out));
}

bool RequestFilter::matches(const RequestHead& head) const {
  if (!names_user_agent_) {
    for (std::string_view agent : head.values("user-agent")) {
      if (agent.substr(0, 11) == "kube-probe/") return false;
    }
  }
  // Each test, in a fixed order; any_ stops at the first match, all-of at
  // the first miss.
  auto header = [&head](const Header& h) {
    for (std::string_view v : head.values(h.name)) {
      if (re2::RE2::PartialMatch(re2::StringPiece(v.data(), v.size()), *h.value)) return true;
    }
    return false;
  };
  auto path = [&head](const re2::RE2& re) {
    const std::string_view p = head.path();
    if (re2::RE2::PartialMatch(re2::StringPiece(p.data(), p.size()), re)) return true;
    const std::string_view pq = head.pathAndQuery();
    return pq.size() != p.size() &&
           re2::RE2::PartialMatch(re2::StringPiece(pq.data(), pq.size()), re);
  };
  bool any = false;
  auto test = [&](bool ok) {
    any = any || ok;
    return ok;
  };
  for (const Header& h : headers_) {
    if (!test(header(h)) && !any_) return false;
    if (any && any_) return true;
  }
  if (path_) {
    if (!test(path(*path_)) && !any_) return false;
    if (any && any_) return true;
  }
  if (!method_.empty()) {
    if (!test(head.method == method_) && !any_) return false;
  }
  return any_ ? any : true;
}

}  // namespace siphon::agent::steal::http
