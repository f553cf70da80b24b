#include "agent/steal/http/filter.h"

#include <gtest/gtest.h>

#include "siphon/status.h"

namespace siphon::agent::steal::http {
namespace {

RequestHead get(std::string target, std::vector<std::pair<std::string, std::string>> headers = {}) {
  RequestHead h;
  h.method = "GET";
  h.target = std::move(target);
  h.headers = std::move(headers);
  return h;
}

std::shared_ptr<const RequestFilter> compiled(const v1::HttpFilter& f) {
  auto c = RequestFilter::compile(f);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

v1::HttpFilter header(const std::string& name, const std::string& regex) {
  v1::HttpFilter f;
  v1::HeaderFilter* h = f.add_headers();
  h->set_name(name);
  h->set_value_regex(regex);
  return f;
}

TEST(RequestFilter, HeaderNameIsCaseInsensitiveAndAnyValueMatches) {
  auto f = compiled(header("X-User", "^alice$"));
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->matches(get("/", {{"x-user", "alice"}})));
  EXPECT_TRUE(f->matches(get("/", {{"X-USER", "alice"}})));
  // Sent twice: any of the values.
  EXPECT_TRUE(f->matches(get("/", {{"x-user", "bob"}, {"X-User", "alice"}})));
  EXPECT_FALSE(f->matches(get("/", {{"x-user", "alicex"}})));
  EXPECT_FALSE(f->matches(get("/", {{"x-other", "alice"}})));
  EXPECT_FALSE(f->matches(get("/")));
  // Unanchored unless anchored.
  auto loose = compiled(header("x-user", "ali"));
  EXPECT_TRUE(loose->matches(get("/", {{"x-user", "malice"}})));
  // Header present with any value.
  auto present = compiled(header("x-debug", ""));
  EXPECT_TRUE(present->matches(get("/", {{"x-debug", ""}})));
  EXPECT_FALSE(present->matches(get("/")));
}

TEST(RequestFilter, PathIsMatchedThenPathAndQuery) {
  v1::HttpFilter f;
  f.set_path_regex("^/api/v2(/|$)");
  auto p = compiled(f);
  EXPECT_TRUE(p->matches(get("/api/v2/users?x=1")));
  EXPECT_TRUE(p->matches(get("/api/v2")));
  EXPECT_FALSE(p->matches(get("/api/v20")));
  // Absolute form: the path part.
  EXPECT_TRUE(p->matches(get("http://app.local/api/v2/x")));
  f.set_path_regex("user=alice");
  auto q = compiled(f);
  EXPECT_TRUE(q->matches(get("/search?user=alice&page=2")));
  EXPECT_FALSE(q->matches(get("/search?user=bob")));
  // "$" ends the path on the first try, so an anchored path ignores the query.
  f.set_path_regex("^/health$");
  EXPECT_TRUE(compiled(f)->matches(get("/health?verbose=1")));
}

TEST(RequestFilter, AllOfByDefaultAnyOfOnRequest) {
  v1::HttpFilter f = header("x-user", "^alice$");
  f.set_method("POST");
  f.set_path_regex("^/orders");
  auto all = compiled(f);
  RequestHead post = get("/orders", {{"x-user", "alice"}});
  post.method = "POST";
  EXPECT_TRUE(all->matches(post));
  RequestHead wrong_method = post;
  wrong_method.method = "GET";
  EXPECT_FALSE(all->matches(wrong_method));
  RequestHead wrong_path = post;
  wrong_path.target = "/users";
  EXPECT_FALSE(all->matches(wrong_path));
  EXPECT_EQ(all->description(), "header x-user: ^alice$ and path ^/orders and method POST");

  f.set_match_any(true);
  auto any = compiled(f);
  EXPECT_TRUE(any->matches(wrong_method));
  EXPECT_TRUE(any->matches(wrong_path));
  EXPECT_TRUE(any->matches(get("/orders/7")));
  RequestHead only_method = get("/x");
  only_method.method = "POST";
  EXPECT_TRUE(any->matches(only_method));
  EXPECT_FALSE(any->matches(get("/x", {{"x-user", "bob"}})));
  EXPECT_EQ(any->description(), "header x-user: ^alice$ or path ^/orders or method POST");
}

TEST(RequestFilter, MethodIsExact) {
  v1::HttpFilter f;
  f.set_method("DELETE");
  auto d = compiled(f);
  RequestHead r = get("/");
  r.method = "DELETE";
  EXPECT_TRUE(d->matches(r));
  r.method = "delete";
  EXPECT_FALSE(d->matches(r));
}

TEST(RequestFilter, BadFiltersAreRefusedWithTheReason) {
  auto bad_regex = RequestFilter::compile(header("x-user", "(alice"));
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_EQ(errorCodeOf(bad_regex.status()), v1::INVALID_ARGUMENT);
  EXPECT_NE(bad_regex.status().message().find("(alice"), absl::string_view::npos)
      << bad_regex.status();
  EXPECT_NE(bad_regex.status().message().find("missing )"), absl::string_view::npos)
      << bad_regex.status();

  auto bad_name = RequestFilter::compile(header("x user", "a"));
  ASSERT_FALSE(bad_name.ok());
  EXPECT_NE(bad_name.status().message().find("not an HTTP token"), absl::string_view::npos);

  v1::HttpFilter m;
  m.set_method("GET /");
  EXPECT_EQ(errorCodeOf(RequestFilter::compile(m).status()), v1::INVALID_ARGUMENT);

  v1::HttpFilter empty;
  empty.set_match_any(true);
  auto none = RequestFilter::compile(empty);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no header, path or method"), absl::string_view::npos);

  // RE2 refuses what would take exponential time elsewhere (backreferences).
  v1::HttpFilter p;
  p.set_path_regex("(a+)\\1");
  EXPECT_EQ(errorCodeOf(RequestFilter::compile(p).status()), v1::INVALID_ARGUMENT);
}

TEST(RequestFilter, HostileInputStaysLinear) {
  // A pattern that backtracks catastrophically in a backtracking engine.
  v1::HttpFilter f = header("x-user", "^(a+)+$");
  auto c = compiled(f);
  std::string value(100000, 'a');
  value += '!';
  EXPECT_FALSE(c->matches(get("/", {{"x-user", value}})));
}

TEST(RequestFilter, KubeletProbesAreNeverTakenUnlessTheFilterNamesUserAgent) {
  v1::HttpFilter everything;  // a path test every request passes
  everything.set_path_regex("^/");
  auto f = compiled(everything);
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->matches(get("/healthz", {{"user-agent", "curl/7.88"}})));
  EXPECT_FALSE(f->matches(get("/healthz", {{"User-Agent", "kube-probe/1.29"}})));
  EXPECT_FALSE(f->matches(get("/healthz", {{"user-agent", "kube-probe/1.30+"}})));
  // Only the start counts.
  EXPECT_TRUE(f->matches(get("/healthz", {{"user-agent", "not-kube-probe/1.29"}})));
  // A filter that names User-Agent decides for itself.
  auto ua = compiled(header("User-Agent", "^kube-probe/"));
  ASSERT_TRUE(ua);
  EXPECT_TRUE(ua->matches(get("/healthz", {{"user-agent", "kube-probe/1.29"}})));
  v1::HttpFilter any = header("user-agent", "^nothing-like-it$");
  any.set_path_regex("^/");
  any.set_match_any(true);
  auto any_f = compiled(any);
  EXPECT_TRUE(any_f->matches(get("/", {{"user-agent", "kube-probe/1.29"}})));
}

}  // namespace
}  // namespace siphon::agent::steal::http
