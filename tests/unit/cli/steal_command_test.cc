// `siphon steal` with HTTP filters, the real binary, against a scripted
// agent that plays the agent's side of a filtered steal (no root, no
// kernel): it answers the subscribe, opens one StolenRequest stream per
// request with the request's HTTP/1.1 bytes, and collects the response the
// CLI writes back. A small HTTP/1.1 server in the test is the --to. The
// agent runs on a thread of its own; so does each connection of the local
// server.
//
// Over 600 lines: the scripted agent these cases share is most of it.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cli/http_scan.h"
#include "siphon/status.h"
#include "tests/fakes/scripted_agent.h"
// The harness's process helpers are all this test takes from it; its Agent
// class (unused here) wants the agent binary's path.
#define SIPHON_AGENT_BIN "siphon-agent"
#include "tests/fakes/cli_process.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon {
namespace {

namespace asio = net::asio;
using fakes::closedAddress;
using fakes::pattern;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr uint64_t kSubscription = 7;  // the agent's id of the first subscription
const std::string kCli = SIPHON_CLI_BIN;
constexpr auto kWait = std::chrono::seconds(20);  // a hang guard, not a timing assertion

// What the CLI sent back on one stream.
struct StreamState {
  bool accepted = false;
  std::string bytes;
  bool half_closed = false;
  bool reset = false;
  v1::ErrorCode code = v1::OK;
};

// The scripted agent, with what each stream received kept for the test.
class StealAgent : public fakes::ScriptedAgent {
 public:
  using ScriptedAgent::ScriptedAgent;

  // Agent thread: woken on accepts and credit.
  std::vector<net::Signal*> waiters;
  void wakeWaiters() {
    for (net::Signal* w : waiters) w->notify();
  }

  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, StreamState> streams;  // under mu

  void onStreamAccept(v1::StreamAccept a) override {
    {
      std::lock_guard lock(mu);
      streams[a.stream_id()].accepted = true;
    }
    cv.notify_all();
    wakeWaiters();
  }
  void onStreamWritable(uint64_t) override { wakeWaiters(); }
  void onStreamData(uint64_t id, std::string_view payload) override {
    {
      std::lock_guard lock(mu);
      streams[id].bytes.append(payload);
    }
    session().consumed(id, payload.size());
    cv.notify_all();
  }
  void onStreamHalfClose(uint64_t id) override {
    {
      std::lock_guard lock(mu);
      streams[id].half_closed = true;
    }
    cv.notify_all();
  }
  void onStreamReset(uint64_t id, v1::Error e) override {
    {
      std::lock_guard lock(mu);
      streams[id].reset = true;
      streams[id].code = e.code();
    }
    cv.notify_all();
  }
};

// A StealAgent on its own thread. Every call runs on that thread.
class AgentThread {
 public:
  AgentThread() : work_(asio::make_work_guard(io_)), agent_(io_.get_executor()) {
    agent_.on_request = [this](v1::Request r) { onRequest(std::move(r)); };
    asio::co_spawn(io_, agent_.serve(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~AgentThread() {
    call([this] { agent_.close(); });
    io_.stop();
    thread_.join();
  }

  std::string address() const { return agent_.address(); }

  template <typename F>
  auto call(F f) -> decltype(f()) {
    return fakes::callOn(io_, std::move(f));
  }

  // Opens a StolenRequest stream of `subscription` and sends `bytes` as the
  // stream's credit allows, then half-closes unless told not to. Returns
  // the stream's id.
  uint64_t request(std::string method, std::string path, std::string bytes, bool half_close = true,
                   uint64_t subscription = kSubscription) {
    uint64_t id = call([&] {
      auto opened = agent_.openStolenRequest(subscription, method, path);
      EXPECT_TRUE(opened.ok()) << opened.status();
      return opened.ok() ? *opened : 0;
    });
    send(id, std::move(bytes), half_close);
    return id;
  }

  // More bytes on an open stream (after a 101), then maybe the half-close.
  void send(uint64_t id, std::string bytes, bool half_close) {
    asio::post(io_, [this, id, bytes = std::move(bytes), half_close]() mutable {
      asio::co_spawn(io_, sendAll(id, std::move(bytes), half_close), asio::detached);
    });
  }

  // Tells the client this agent drains (SIGTERM): with another --agent it
  // moves there.
  void drain() {
    call([&] {
      v1::Draining d;
      d.set_reason("SIGTERM");
      d.set_deadline_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count() +
                             25000);
      agent_.session().sendDraining(std::move(d));
      agent_.wake();
    });
  }

  void notice(v1::SubscriptionNotice n) {
    call([&] {
      agent_.session().sendNotice(std::move(n));
      agent_.wake();
    });
  }

  void targetRestarted(v1::TargetRestarted r) {
    call([&] {
      agent_.session().sendTargetRestarted(std::move(r));
      agent_.wake();
    });
  }

  // Waits until `pred` holds for the stream (or kWait passed); its state.
  StreamState waitFor(uint64_t id, const std::function<bool(const StreamState&)>& pred) {
    std::unique_lock lock(agent_.mu);
    agent_.cv.wait_until(lock, std::chrono::steady_clock::now() + kWait,
                         [&] { return pred(agent_.streams[id]); });
    return agent_.streams[id];
  }
  // The whole response: until the CLI half-closes or resets the stream.
  StreamState waitEnd(uint64_t id) {
    return waitFor(id, [](const StreamState& s) { return s.half_closed || s.reset; });
  }

  // The agent's answer to StealSubscribe: Subscribed, or this error.
  v1::ErrorCode refuse_with = v1::OK;
  std::string refuse_message;
  std::vector<v1::Request> requests;  // read through call()

 private:
  void onRequest(v1::Request r) {
    v1::Response response;
    response.set_request_id(r.request_id());
    if (r.has_steal() && refuse_with != v1::OK) {
      *response.mutable_error() = toProtoError(protoError(refuse_with, refuse_message));
    } else if (r.has_steal()) {
      response.mutable_subscribed()->set_subscription_id(next_subscription_++);
      response.mutable_subscribed()->set_backend("sk_lookup");
    } else if (r.has_unsubscribe()) {
      response.mutable_unsubscribed();
    } else {
      *response.mutable_error() = toProtoError(protoError(v1::UNIMPLEMENTED, "scripted"));
    }
    requests.push_back(std::move(r));
    agent_.session().sendResponse(std::move(response));
    agent_.wake();
  }

  net::awaitable<void> sendAll(uint64_t id, std::string bytes_in, bool half_close) {
    const std::string bytes = std::move(bytes_in);
    net::Signal wake(io_.get_executor());
    agent_.waiters.push_back(&wake);
    size_t off = 0;
    bool open = true;
    while (off < bytes.size() || half_close) {
      if (!agent_.session().streamOpen(id)) {
        open = false;
        break;
      }
      bool accepted;
      {
        std::lock_guard lock(agent_.mu);
        accepted = agent_.streams[id].accepted;
      }
      const size_t credit = accepted ? agent_.session().sendCredit(id, 1) : 0;
      if (!accepted || (off < bytes.size() && credit == 0)) {
        // Woken by the accept or by credit; the deadline only re-checks.
        co_await wake.wait(asio::steady_timer::clock_type::now() + std::chrono::milliseconds(50));
        continue;
      }
      if (off == bytes.size()) break;
      const size_t n = std::min({credit, bytes.size() - off, size_t{60000}});
      absl::Status s = agent_.session().sendData(id, bytes.substr(off, n));
      EXPECT_TRUE(s.ok()) << s;
      agent_.wake();
      off += n;
    }
    if (open && half_close) {
      EXPECT_TRUE(agent_.session().halfClose(id).ok());
      agent_.wake();
    }
    std::erase(agent_.waiters, &wake);
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  StealAgent agent_;
  uint64_t next_subscription_ = kSubscription;
  std::thread thread_;
};

// A small HTTP/1.1 server on 127.0.0.1:0: a thread per connection reads
// each request whole (cli::RequestScanner), records its bytes, and writes
// whatever `respond` says, as it is.
class LocalHttpServer {
 public:
  struct Answer {
    std::string bytes;        // written as they are
    bool close = false;       // then close the connection
    bool drop = false;        // close it without writing anything
    bool echo_after = false;  // then echo raw bytes until EOF (an upgrade)
    bool hang = false;        // write nothing, keep the connection open
  };
  using Respond = std::function<Answer(const std::string& request, int connection)>;
  struct Seen {
    int connection;
    std::string bytes;
  };

  explicit LocalHttpServer(Respond respond)
      : respond_(std::move(respond)), listener_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(listener_.get(), 16), 0);
    socklen_t len = sizeof a;
    ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    accepter_ = std::thread([this] { acceptLoop(); });
  }
  ~LocalHttpServer() {
    ::shutdown(listener_.get(), SHUT_RDWR);  // wakes accept()
    accepter_.join();
    {
      std::lock_guard lock(mu_);
      for (auto& fd : fds_) ::shutdown(fd.get(), SHUT_RDWR);
    }
    for (auto& t : threads_) t.join();
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::vector<Seen> requests() {
    std::lock_guard lock(mu_);
    return seen_;
  }
  int connections() {
    std::lock_guard lock(mu_);
    return static_cast<int>(fds_.size());
  }
  // Waits until `n` requests came (or kWait passed); whether they did.
  bool waitForRequests(size_t n) {
    std::unique_lock lock(mu_);
    return seen_cv_.wait_until(lock, std::chrono::steady_clock::now() + kWait,
                               [&] { return seen_.size() >= n; });
  }

 private:
  void acceptLoop() {
    while (true) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        return;
      }
      std::lock_guard lock(mu_);
      const int index = static_cast<int>(fds_.size());
      fds_.emplace_back(fd);
      threads_.emplace_back([this, fd, index] { serve(fd, index); });
    }
  }

  // Ends with shutdown(), not close(): the descriptor stays ours until the
  // destructor, so it cannot be reused under another thread's feet.
  void serve(int fd, int index) {
    cli::RequestScanner scan;
    std::string pending, current;
    char buf[65536];
    while (true) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      pending.append(buf, static_cast<size_t>(n));
      while (!pending.empty()) {
        auto used = scan.put(pending);
        if (!used.ok()) {
          ADD_FAILURE() << "the local server got a bad request: " << used.status();
          ::shutdown(fd, SHUT_RDWR);
          return;
        }
        current.append(pending, 0, *used);
        pending.erase(0, *used);
        if (!scan.done()) {
          if (*used == 0) break;
          continue;
        }
        Answer answer;
        {
          std::lock_guard lock(mu_);
          seen_.push_back({index, current});
        }
        seen_cv_.notify_all();
        answer = respond_(current, index);
        current.clear();
        scan.reset();
        if (answer.drop) {
          ::shutdown(fd, SHUT_RDWR);
          return;
        }
        if (answer.hang) continue;  // until the client or the destructor ends it
        harness::writeAll(fd, answer.bytes);
        if (answer.close) {
          ::shutdown(fd, SHUT_RDWR);
          return;
        }
        if (answer.echo_after) {
          echo(fd, std::move(pending));
          return;
        }
      }
    }
    ::shutdown(fd, SHUT_RDWR);
  }

  static void echo(int fd, std::string first) {
    if (!first.empty()) harness::writeAll(fd, first);
    char buf[65536];
    while (true) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      harness::writeAll(fd, buf, static_cast<size_t>(n));
    }
    ::shutdown(fd, SHUT_WR);  // the client's FIN, passed on
  }

  Respond respond_;
  harness::Fd listener_;
  uint16_t port_ = 0;
  std::thread accepter_;
  std::mutex mu_;
  std::vector<harness::Fd> fds_;  // one per connection, by index
  std::vector<std::thread> threads_;
  std::vector<Seen> seen_;
  std::condition_variable seen_cv_;
};

// `siphon --agent ADDR steal ...`, its stderr (and stdout) read as it runs.
class Steal : public fakes::CliProcess {
 public:
  Steal(const std::string& agent, std::vector<std::string> args)
      : Steal(std::vector<std::string>{agent}, std::move(args)) {}
  Steal(const std::vector<std::string>& agents, std::vector<std::string> args)
      : CliProcess(argv(agents, std::move(args))) {}

  // Reads stderr and stdout until `text` is in stderr (stdout with
  // waitForOut) or kWait passed.
  bool waitFor(const std::string& text) { return waitIn(err, text); }
  bool waitForOut(const std::string& text) { return waitIn(out, text); }

 private:
  static std::vector<std::string> argv(const std::vector<std::string>& agents,
                                       std::vector<std::string> args) {
    std::vector<std::string> argv = {kCli};
    for (const auto& a : agents) {
      argv.push_back("--agent");
      argv.push_back(a);
    }
    argv.push_back("steal");
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  bool waitIn(const std::string& where, const std::string& text) {
    return readUntil([&] { return where.find(text) != std::string::npos; });
  }
};

std::string get(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: app\r\nX-User: alice\r\n\r\n";
}
// A request with a Content-Length body.
std::string withBody(const std::string& method, const std::string& path, const std::string& body) {
  return method + " " + path +
         " HTTP/1.1\r\nHost: app\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         body;
}
std::string ok(const std::string& body, const std::string& extra = "") {
  return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra +
         "\r\n" + body;
}

// The start of each request's line.
std::string line(const std::string& method, const std::string& path, const std::string& to) {
  return "request 10.0.0.2:51234 " + method + " " + path + " -> " + to + ": ";
}

TEST(StealCommand, FilterFlagsGoToTheAgentAndIntoTheStealingLine) {
  AgentThread agent;
  LocalHttpServer server([](const std::string&, int) { return LocalHttpServer::Answer{}; });
  Steal s(agent.address(),
          {"--port", "80", "--to", server.address(), "--port", "81", "--to", server.address(),
           "--filter-header", "X-User: ^alice$", "--filter-header", "x-tenant:a", "--filter-path",
           "^/api/", "--filter-method", "POST", "--filter-any"});
  ASSERT_TRUE(s.waitFor("stealing port 81")) << s.err;
  const std::string filter =
      "filter header X-User: ^alice$ or header x-tenant: a or path ^/api/ or method POST";
  EXPECT_THAT(s.err, HasSubstr("stealing port 80 -> " + server.address() + " (backend sk_lookup, " +
                               filter + ")\n"));
  EXPECT_THAT(s.err, HasSubstr("stealing port 81 -> " + server.address() + " (backend sk_lookup, " +
                               filter + ")\n"));
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
  EXPECT_THAT(s.err, HasSubstr("summary: 0 connections, 0 requests, in=0 bytes, out=0 bytes\n"));

  auto requests = agent.call([&] { return agent.requests; });
  ASSERT_EQ(requests.size(), 4u);  // two steals, two unsubscribes
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(requests[i].has_steal());
    EXPECT_EQ(requests[i].steal().port(), 80u + i);
    ASSERT_TRUE(requests[i].steal().has_http_filter());
    const v1::HttpFilter& f = requests[i].steal().http_filter();
    ASSERT_EQ(f.headers_size(), 2);
    EXPECT_EQ(f.headers(0).name(), "X-User");
    EXPECT_EQ(f.headers(0).value_regex(), "^alice$");
    EXPECT_EQ(f.headers(1).name(), "x-tenant");
    EXPECT_EQ(f.headers(1).value_regex(), "a");
    EXPECT_EQ(f.path_regex(), "^/api/");
    EXPECT_EQ(f.method(), "POST");
    EXPECT_TRUE(f.match_any());
  }
  EXPECT_TRUE(requests[2].has_unsubscribe());
  EXPECT_TRUE(requests[3].has_unsubscribe());
}

TEST(StealCommand, WithoutFiltersTheSubscribeAndTheLinesAreAsBefore) {
  AgentThread agent;
  Steal s(agent.address(), {"--port", "80", "--to", "127.0.0.1:9"});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
  EXPECT_EQ(s.err,
            "stealing port 80 -> 127.0.0.1:9 (backend sk_lookup)\n"
            "summary: 0 connections, in=0 bytes, out=0 bytes\n");
  auto requests = agent.call([&] { return agent.requests; });
  ASSERT_GE(requests.size(), 1u);
  EXPECT_FALSE(requests[0].steal().has_http_filter());
}

TEST(StealCommand, TheAgentsRefusalIsPrintedAsOtherRefusals) {
  AgentThread agent;
  agent.call([&] {
    agent.refuse_with = v1::INVALID_ARGUMENT;
    agent.refuse_message = "bad --filter-path regex '(': missing )";
  });
  Steal s(agent.address(), {"--port", "80", "--to", "127.0.0.1:9", "--filter-path", "("});
  EXPECT_EQ(s.finish(), 1) << s.err;
  EXPECT_THAT(s.err, HasSubstr("siphon: steal port 80 failed: INVALID_ARGUMENT: bad --filter-path "
                               "regex '(': missing )"));
  EXPECT_THAT(s.err, Not(HasSubstr("stealing port")));
}

TEST(StealCommand, BadFilterFlagsAreUsageErrors) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--filter-header", "X-User alice"},
           {"--filter-header", "X User: alice"},
           {"--filter-header", ": alice"},
           {"--filter-path", ""},
           {"--filter-path", "^/a", "--filter-path", "^/b"},
           {"--filter-method", "GE T"},
           {"--filter-method", "GET", "--filter-method", "POST"},
           {"--filter-any"},
       }) {
    std::vector<std::string> argv = {kCli,     "--agent", "127.0.0.1:1", "steal",
                                     "--port", "80",      "--to",        "127.0.0.1:9"};
    argv.insert(argv.end(), args.begin(), args.end());
    harness::Result r = harness::run(argv, harness::cleanEnv());
    EXPECT_EQ(r.exit_code, 2) << r;
    EXPECT_THAT(r.err, HasSubstr("siphon: ")) << r;
  }
}

// Chunked both ways: the local server gets the agent's bytes exactly, the
// agent gets the server's exactly, chunk extensions and trailers included.
TEST(StealCommand, ARequestAndItsResponseAreCarriedByteForByte) {
  AgentThread agent;
  const std::string response =
      "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nX-Server: local\r\n\r\n"
      "4\r\nabcd\r\n1a;note=x\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: t\r\n\r\n";
  LocalHttpServer server(
      [&](const std::string&, int) { return LocalHttpServer::Answer{response}; });
  Steal s(agent.address(),
          {"--port", "80", "--to", server.address(), "--filter-header", "x-user: alice"});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;
  EXPECT_THAT(s.err, HasSubstr("(backend sk_lookup, filter header x-user: alice)\n"));

  const std::string request =
      "POST /upload?x=1 HTTP/1.1\r\nHost: app\r\nX-User: alice\r\nTransfer-Encoding: chunked\r\n"
      "\r\n3\r\none\r\n5;ext\r\nthree\r\n0\r\nX-Done: yes\r\n\r\n";
  const uint64_t id = agent.request("POST", "/upload?x=1", request);
  StreamState got = agent.waitEnd(id);
  EXPECT_TRUE(got.half_closed);
  EXPECT_FALSE(got.reset);
  EXPECT_EQ(got.bytes, response);
  auto seen = server.requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].bytes, request);

  const std::string done = line("POST", "/upload?x=1", server.address()) +
                           "201 in=" + std::to_string(request.size()) +
                           " out=" + std::to_string(response.size()) + "\n";
  ASSERT_TRUE(s.waitFor(done)) << s.err;
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
  EXPECT_THAT(s.err,
              HasSubstr("summary: 0 connections, 1 request, in=" + std::to_string(request.size()) +
                        " bytes, out=" + std::to_string(response.size()) + " bytes\n"));
}

// Several MiB each way, streamed (Content-Length both ways).
TEST(StealCommand, BodiesOfSeveralMebibytesArriveWhole) {
  AgentThread agent;
  const std::string response_body = pattern(7, 6 << 20);
  const std::string response = ok(response_body, "Content-Type: application/octet-stream\r\n");
  LocalHttpServer server(
      [&](const std::string&, int) { return LocalHttpServer::Answer{response}; });
  Steal s(agent.address(), {"--port", "80", "--to", server.address(), "--filter-method", "PUT"});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;

  const std::string body = pattern(3, 5 << 20);
  const std::string request = withBody("PUT", "/blob", body);
  const uint64_t id = agent.request("PUT", "/blob", request);
  StreamState got = agent.waitEnd(id);
  EXPECT_TRUE(got.half_closed);
  EXPECT_EQ(got.bytes.size(), response.size());
  EXPECT_TRUE(got.bytes == response) << "the response differs";
  auto seen = server.requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].bytes.size(), request.size());
  EXPECT_TRUE(seen[0].bytes == request) << "the request differs";
  ASSERT_TRUE(s.waitFor(line("PUT", "/blob", server.address()) +
                        "200 in=" + std::to_string(request.size()) +
                        " out=" + std::to_string(response.size()) + "\n"))
      << s.err;
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
}

// Requests one after another go on one local connection while the server
// keeps it alive; a Connection: close answer ends it.
TEST(StealCommand, KeepAliveConnectionsToTheLocalServerAreReused) {
  AgentThread agent;
  LocalHttpServer server([](const std::string& request, int connection) {
    const std::string path = request.substr(4, request.find(' ', 4) - 4);
    const std::string body = path + " on " + std::to_string(connection);
    if (path == "/last") return LocalHttpServer::Answer{ok(body, "Connection: close\r\n"), true};
    return LocalHttpServer::Answer{ok(body)};
  });
  Steal s(agent.address(),
          {"--port", "80", "--to", server.address(), "--filter-header", "X-User:"});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;

  for (const std::string path : {"/a", "/b", "/last", "/after"}) {
    const uint64_t id = agent.request("GET", path, get(path));
    StreamState got = agent.waitEnd(id);
    EXPECT_TRUE(got.half_closed) << path;
    EXPECT_THAT(got.bytes, StartsWith("HTTP/1.1 200 OK\r\n")) << path;
    // Each request's line comes once its connection is back in the pool.
    ASSERT_TRUE(s.waitFor(line("GET", path, server.address()) + "200 ")) << s.err;
  }
  auto seen = server.requests();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].connection, 0);
  EXPECT_EQ(seen[1].connection, 0);
  EXPECT_EQ(seen[2].connection, 0);
  EXPECT_EQ(seen[3].connection, 1);  // after the Connection: close
  EXPECT_EQ(server.connections(), 2);
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
  EXPECT_THAT(s.err, HasSubstr("4 requests, in="));
}

// The server drops an idle keep-alive connection just as a request reaches
// it (here: it reads the request, then closes without a word): the request
// is sent again on a new connection, once, and answered.
TEST(StealCommand, APooledConnectionThatDiesBeforeAnsweringIsRetriedOnce) {
  AgentThread agent;
  LocalHttpServer server([](const std::string& request, int connection) {
    if (request.starts_with("GET /second") && connection == 0) {
      return LocalHttpServer::Answer{"", false, /*drop=*/true};
    }
    return LocalHttpServer::Answer{ok("served on " + std::to_string(connection))};
  });
  Steal s(agent.address(), {"--port", "80", "--to", server.address(), "--filter-path", "."});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;

  uint64_t first = agent.request("GET", "/first", get("/first"));
  EXPECT_EQ(agent.waitEnd(first).bytes, ok("served on 0"));
  ASSERT_TRUE(s.waitFor(line("GET", "/first", server.address()) + "200 ")) << s.err;

  uint64_t second = agent.request("GET", "/second", get("/second"));
  StreamState got = agent.waitEnd(second);
  EXPECT_TRUE(got.half_closed);
  EXPECT_EQ(got.bytes, ok("served on 1"));
  ASSERT_TRUE(s.waitFor(line("GET", "/second", server.address()) + "200 in=")) << s.err;
  auto seen = server.requests();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].connection, 0);
  EXPECT_EQ(seen[1].bytes, get("/second"));
  EXPECT_EQ(seen[2].connection, 1);
  EXPECT_EQ(seen[2].bytes, get("/second"));
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
  EXPECT_THAT(s.err, HasSubstr("2 requests, in="));  // no failure counted
}

// The HTTP client gets a 502 naming the local server and why, not a reset.
TEST(StealCommand, AnUnreachableLocalServerIsAnswered502) {
  AgentThread agent;
  const std::string dead = closedAddress();
  Steal s(agent.address(), {"--port", "80", "--to", dead, "--filter-header", "x-user: alice"});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;

  // A body the CLI reads and drops: the agent is not left waiting on credit.
  const std::string body(300000, 'b');
  const std::string request = withBody("POST", "/x", body);
  const uint64_t id = agent.request("POST", "/x", request);
  StreamState got = agent.waitEnd(id);
  EXPECT_TRUE(got.half_closed);
  EXPECT_FALSE(got.reset);
  const std::string text = "siphon steal: the local server " + dead + " did not answer: connect " +
                           dead + ": Connection refused\n";
  EXPECT_EQ(got.bytes,
            "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: " +
                std::to_string(text.size()) + "\r\n\r\n" + text);
  ASSERT_TRUE(s.waitFor(line("POST", "/x", dead) + "502 in=" + std::to_string(request.size()) +
                        " out=" + std::to_string(got.bytes.size()) + " (connect " + dead +
                        ": Connection refused)\n"))
      << s.err;
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
  EXPECT_THAT(s.err, HasSubstr("summary: 0 connections, 1 request (1 failed), "));
}

// A server that accepts and closes without answering gets the client a 502
// as well.
TEST(StealCommand, ALocalServerThatClosesWithoutAnsweringIsAnswered502) {
  AgentThread agent;
  LocalHttpServer server([](const std::string&, int) {
    return LocalHttpServer::Answer{"", false, /*drop=*/true};
  });
  Steal s(agent.address(), {"--port", "80", "--to", server.address(), "--filter-path", "."});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;
  StreamState got = agent.waitEnd(agent.request("GET", "/", get("/")));
  EXPECT_THAT(got.bytes, StartsWith("HTTP/1.1 502 Bad Gateway\r\n"));
  EXPECT_THAT(got.bytes, HasSubstr("the local server " + server.address() +
                                   " did not answer: closed the connection without answering"));
  ASSERT_TRUE(s.waitFor(line("GET", "/", server.address()) + "502 ")) << s.err;
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
}

// A response cut short once it has begun resets the stream: the HTTP
// client's connection is aborted, never handed a truncated body as whole.
TEST(StealCommand, AResponseCutShortResetsTheStream) {
  AgentThread agent;
  LocalHttpServer server([](const std::string&, int) {
    return LocalHttpServer::Answer{"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
                                   /*close=*/true};
  });
  Steal s(agent.address(), {"--port", "80", "--to", server.address(), "--filter-path", "."});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;
  StreamState got = agent.waitEnd(agent.request("GET", "/", get("/")));
  EXPECT_TRUE(got.reset);
  EXPECT_FALSE(got.half_closed);
  ASSERT_TRUE(s.waitFor(line("GET", "/", server.address()) + "200 ")) << s.err;
  EXPECT_THAT(s.err, HasSubstr("cut its response short"));
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
  EXPECT_THAT(s.err, HasSubstr("1 request (1 failed)"));
}

// After a 101 the stream and the local connection carry raw bytes both
// ways, and a FIN each way.
TEST(StealCommand, AnUpgradeTurnsTheStreamIntoRawBytesBothWays) {
  AgentThread agent;
  const std::string switching =
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
  LocalHttpServer server([&](const std::string&, int) {
    return LocalHttpServer::Answer{switching, false, false, /*echo_after=*/true};
  });
  Steal s(agent.address(), {"--port", "80", "--to", server.address(), "--filter-path", "^/ws"});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;

  const std::string request =
      "GET /ws HTTP/1.1\r\nHost: app\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
  // No half-close: after the request the stream goes on as the connection.
  const uint64_t id = agent.request("GET", "/ws", request, /*half_close=*/false);
  StreamState got = agent.waitFor(
      id, [&](const StreamState& st) { return st.bytes.size() >= switching.size() || st.reset; });
  ASSERT_EQ(got.bytes, switching);

  const std::string ping = pattern(11, 200000);
  agent.send(id, ping, /*half_close=*/false);
  got = agent.waitFor(id, [&](const StreamState& st) {
    return st.bytes.size() >= switching.size() + ping.size() || st.reset;
  });
  EXPECT_TRUE(got.bytes == switching + ping) << "the echo differs";
  EXPECT_FALSE(got.half_closed);

  agent.send(id, "bye", /*half_close=*/true);
  got = agent.waitEnd(id);
  EXPECT_TRUE(got.half_closed);  // the server's FIN, after our own
  EXPECT_FALSE(got.reset);
  EXPECT_TRUE(got.bytes == switching + ping + "bye");
  const std::string in = std::to_string(request.size() + ping.size() + 3);
  const std::string out = std::to_string(got.bytes.size());
  ASSERT_TRUE(
      s.waitFor(line("GET", "/ws", server.address()) + "101 in=" + in + " out=" + out + "\n"))
      << s.err;
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
}

// A HEAD's response has no body whatever its Content-Length says, and a
// 100 Continue comes before the final response: both leave the connection
// clean for the next request.
TEST(StealCommand, HeadAndInterimResponsesEndWhereTheyShould) {
  AgentThread agent;
  const std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n";
  const std::string continued =
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
  LocalHttpServer server([&](const std::string& request, int) {
    return LocalHttpServer::Answer{request.starts_with("HEAD") ? head : continued};
  });
  Steal s(agent.address(), {"--port", "80", "--to", server.address(), "--filter-path", "."});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;

  StreamState got =
      agent.waitEnd(agent.request("HEAD", "/h", "HEAD /h HTTP/1.1\r\nHost: app\r\n\r\n"));
  EXPECT_TRUE(got.half_closed);
  EXPECT_EQ(got.bytes, head);
  ASSERT_TRUE(s.waitFor(line("HEAD", "/h", server.address()) + "200 ")) << s.err;

  got = agent.waitEnd(agent.request(
      "POST", "/c",
      "POST /c HTTP/1.1\r\nHost: app\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"));
  EXPECT_TRUE(got.half_closed);
  EXPECT_EQ(got.bytes, continued);
  ASSERT_TRUE(s.waitFor(line("POST", "/c", server.address()) + "200 ")) << s.err;
  auto seen = server.requests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].connection, 0);
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
}

// The first signal waits for requests in flight, the second ends them:
// the stream is reset (the HTTP client's connection aborted).
TEST(StealCommand, ASecondSignalEndsRequestsInFlight) {
  AgentThread agent;
  LocalHttpServer server([](const std::string&, int) {
    LocalHttpServer::Answer a;
    a.hang = true;
    return a;
  });
  Steal s(agent.address(), {"--port", "80", "--to", server.address(), "--filter-path", "."});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;
  const uint64_t id = agent.request("GET", "/slow", get("/slow"));
  ASSERT_TRUE(server.waitForRequests(1));
  s.signal(SIGINT);
  ASSERT_TRUE(s.waitFor("stopping: waiting for 0 open connections and 1 request")) << s.err;
  s.signal(SIGINT);
  StreamState got = agent.waitEnd(id);
  EXPECT_TRUE(got.reset);
  EXPECT_EQ(got.code, v1::CANCELLED);
  EXPECT_EQ(s.finish(), 0) << s.err;
  EXPECT_THAT(s.err, HasSubstr(line("GET", "/slow", server.address()) +
                               "reset in=" + std::to_string(get("/slow").size()) +
                               " out=0 (ended by siphon steal (interrupted))\n"));
  EXPECT_THAT(s.err, HasSubstr("1 request (1 failed)"));
}

// Failover: the port is stolen again on the other agent with the same
// filter, and that agent's stolen requests are served as before.
TEST(StealCommand, AfterAFailoverTheNewAgentGetsTheSameFilter) {
  AgentThread first, second;
  LocalHttpServer server([](const std::string&, int) { return LocalHttpServer::Answer{ok("hi")}; });
  Steal s({first.address(), second.address()},
          {"--port", "80", "--to", server.address(), "--filter-header", "x-user: ^alice$",
           "--filter-method", "GET"});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;
  first.drain();
  ASSERT_TRUE(s.waitFor("moved to agent " + second.address())) << s.err;

  auto requests = second.call([&] { return second.requests; });
  ASSERT_GE(requests.size(), 1u);
  ASSERT_TRUE(requests[0].has_steal());
  const v1::HttpFilter& f = requests[0].steal().http_filter();
  ASSERT_EQ(f.headers_size(), 1);
  EXPECT_EQ(f.headers(0).name(), "x-user");
  EXPECT_EQ(f.headers(0).value_regex(), "^alice$");
  EXPECT_EQ(f.method(), "GET");
  EXPECT_FALSE(f.match_any());

  StreamState got = second.waitEnd(second.request("GET", "/", get("/")));
  EXPECT_EQ(got.bytes, ok("hi"));
  ASSERT_TRUE(s.waitFor(line("GET", "/", server.address()) + "200 ")) << s.err;
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
}

TEST(StealCommand, OverlapNoticesArePrinted) {
  AgentThread agent;
  Steal s(agent.address(),
          {"--port", "80", "--to", "127.0.0.1:9", "--filter-header", "x-user: alice", "--json"});
  // --json: the lines go to stdout.
  ASSERT_TRUE(s.waitForOut("\"filter\":\"header x-user: alice\"}\n")) << s.out << s.err;
  v1::SubscriptionNotice n;
  n.set_subscription_id(kSubscription);
  n.mutable_overlap()->set_taken_by(3);
  n.mutable_overlap()->set_taken_by_client("bob");
  n.mutable_overlap()->set_requests(4);
  n.mutable_overlap()->set_method("GET");
  n.mutable_overlap()->set_path("/x");
  agent.notice(n);
  ASSERT_TRUE(s.waitForOut("\"event\":\"overlap\"")) << s.out;
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
  EXPECT_THAT(s.out,
              HasSubstr("{\"event\":\"overlap\",\"port\":80,\"requests\":4,\"taken_by\":3,"
                        "\"taken_by_client\":\"bob\",\"method\":\"GET\",\"path\":\"/x\"}\n"));
}

// The agent adopted the target's restarted container: one line, and the
// steal goes on (a request after it is still served).
TEST(StealCommand, ATargetRestartIsALineAndTheStealGoesOn) {
  AgentThread agent;
  LocalHttpServer server([](const std::string&, int) { return LocalHttpServer::Answer{ok("hi")}; });
  Steal s(agent.address(), {"--port", "80", "--to", server.address()});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;
  v1::TargetRestarted r;
  r.mutable_target()->set_pid(4301);
  r.mutable_target()->set_container_id("abc");
  r.set_previous_pid(4242);
  r.set_restarts(1);
  r.set_down_ms(812);
  agent.targetRestarted(r);
  ASSERT_TRUE(s.waitFor("target restarted: pid 4242 -> 4301 (container abc), down 812 ms; the "
                        "steal goes on\n"))
      << s.err;
  StreamState got = agent.waitEnd(agent.request("GET", "/", get("/")));
  EXPECT_EQ(got.bytes, ok("hi"));
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
}

TEST(StealCommand, ATargetRestartIsAJsonLine) {
  AgentThread agent;
  Steal s(agent.address(), {"--port", "80", "--to", "127.0.0.1:9", "--json"});
  ASSERT_TRUE(s.waitForOut("\"event\":\"stealing\"")) << s.out << s.err;
  v1::TargetRestarted r;
  r.mutable_target()->set_pid(4301);
  r.set_previous_pid(4242);
  r.set_restarts(2);
  r.set_down_ms(5);
  agent.targetRestarted(r);
  ASSERT_TRUE(s.waitForOut("\"event\":\"target_restarted\"")) << s.out;
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
  EXPECT_THAT(s.out, HasSubstr("{\"event\":\"target_restarted\",\"previous_pid\":4242,\"pid\":4301,"
                               "\"container_id\":\"\",\"down_ms\":5,\"restarts\":2}\n"));
}

TEST(StealCommand, OverlapNoticesArePrintedAsText) {
  AgentThread agent;
  Steal s(agent.address(), {"--port", "80", "--to", "127.0.0.1:9", "--filter-path", "^/x"});
  ASSERT_TRUE(s.waitFor("stealing port 80")) << s.err;
  v1::SubscriptionNotice n;
  n.set_subscription_id(kSubscription);
  n.mutable_overlap()->set_taken_by(3);
  n.mutable_overlap()->set_taken_by_client("bob");
  n.mutable_overlap()->set_requests(1);
  n.mutable_overlap()->set_method("GET");
  n.mutable_overlap()->set_path("/x/1");
  agent.notice(n);
  ASSERT_TRUE(
      s.waitFor("overlap: 1 request to port 80 matching this filter went to subscription "
                "3 of client \"bob\" (first: GET /x/1)\n"))
      << s.err;
  s.signal(SIGINT);
  EXPECT_EQ(s.finish(), 0) << s.err;
}

}  // namespace
}  // namespace siphon
