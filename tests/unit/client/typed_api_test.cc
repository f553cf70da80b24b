// The typed client API (siphon/client/target.h, files.h, dns.h, env.h,
// connections.h) against the real agent in process over loopback: a
// targetless agent whose root is a scratch directory (RootedProcFs), so the
// files, hosts file and environment are the test's. No root.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/server/server.h"
#include "siphon/client/connections.h"
#include "siphon/client/dns.h"
#include "siphon/client/env.h"
#include "siphon/client/errors.h"
#include "siphon/client/files.h"
#include "siphon/client/target.h"
#include "tests/fakes/echo_server.h"
#include "tests/fakes/fake_proc_fs.h"
#include "tests/fakes/in_process_agent.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::client {
namespace {

namespace asio = net::asio;
using agent::files::testing::ScratchTree;

constexpr pid_t kSelfPid = 4242;
constexpr char kToken[] = "typed-api-token";

using agent::files::testing::fdsOpenOn;

class TypedApiTest : public ::testing::Test {
 protected:
  void start(fakes::InProcessAgent& agent, agent::FsMode mode = agent::FsMode::kReadWrite) {
    agent::AgentConfig config;
    config.token = kToken;
    config.fs_mode = mode;
    auto procfs = std::make_unique<fakes::RootedProcFs>(tree_.root());
    procfs->setSelfPid(kSelfPid);
    fakes::FakeProcess self;
    self.environ = std::string("SIPHON_ONE=1\0SIPHON_TWO=two\0PATH=/bin\0", 38);
    procfs->addProcess(kSelfPid, self);
    agent::TargetSpec spec;
    spec.mode = agent::TargetMode::kTargetless;
    agent.start(config, std::move(procfs), spec);
  }

  TargetOptions options(std::vector<std::string> endpoints) {
    TargetOptions o;
    o.endpoints = std::move(endpoints);
    o.token = kToken;
    o.client_name = "typed-api-test";
    o.failover_timeout = std::chrono::milliseconds(2000);
    return o;
  }

  ScratchTree tree_;
  fakes::InProcessAgent a_;
  fakes::InProcessAgent b_;
};

// A relay between a client and the agent, as a port-forward is: each chunk
// from the client held `delay` before it goes on (a slow path), the
// agent's bytes and its close passed back at once. With `half_close`, the
// client's FIN is passed on once its bytes went; without, never (a relay
// that does not carry a half-close).
class SlowRelay : public std::enable_shared_from_this<SlowRelay> {
 public:
  SlowRelay(const asio::any_io_executor& ex, std::chrono::milliseconds delay, bool half_close)
      : acceptor_(ex, {asio::ip::make_address("127.0.0.1"), 0}),
        client_(ex),
        agent_(ex),
        delay_(delay),
        half_close_(half_close) {}
  std::string address() const {
    return "127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
  }
  // The relay goes (kubectl killed): both connections closed as they are,
  // whatever they still held undelivered.
  void cut() {
    net::error_code ec;
    client_.close(ec);
    agent_.close(ec);
  }
  // Accepts one connection and relays it to `agent` ("127.0.0.1:PORT").
  net::awaitable<void> run(std::string agent) {
    auto self = shared_from_this();
    co_await acceptor_.async_accept(client_, net::use_awaitable);
    const auto colon = agent.rfind(':');
    co_await agent_.async_connect(
        {asio::ip::make_address(agent.substr(0, colon)),
         static_cast<uint16_t>(std::stoi(agent.substr(colon + 1)))},
        net::use_awaitable);
    asio::co_spawn(acceptor_.get_executor(), pump(self, client_, agent_, delay_, half_close_),
                   asio::detached);
    co_await pump(self, agent_, client_, std::chrono::milliseconds(0), true);
  }

 private:
  static net::awaitable<void> pump(std::shared_ptr<SlowRelay> keep, asio::ip::tcp::socket& from,
                                   asio::ip::tcp::socket& to, std::chrono::milliseconds delay,
                                   bool pass_fin) {
    const auto hold = keep;
    std::array<char, 16384> buf;
    asio::steady_timer t(from.get_executor());
    for (;;) {
      net::error_code ec;
      size_t n = co_await from.async_read_some(asio::buffer(buf),
                                               asio::redirect_error(net::use_awaitable, ec));
      if (ec) break;
      if (delay.count() > 0) {
        t.expires_after(delay);
        co_await t.async_wait(asio::redirect_error(net::use_awaitable, ec));
      }
      co_await asio::async_write(to, asio::buffer(buf.data(), n),
                                 asio::redirect_error(net::use_awaitable, ec));
      if (ec) break;
    }
    net::error_code ec;
    if (pass_fin) to.shutdown(asio::ip::tcp::socket::shutdown_send, ec);
  }

  asio::ip::tcp::acceptor acceptor_;
  asio::ip::tcp::socket client_, agent_;
  std::chrono::milliseconds delay_;
  bool half_close_;
};

TEST_F(TypedApiTest, CloseAndWaitReturnsOnceTheAgentHasReadTheGoaway) {
  // A session's end through a relay that is about to go (a kubectl
  // port-forward): closeAndWait returns once the agent closed its side,
  // having read the Goaway, so the relay may go; the agent then no longer
  // counts the session (a session cut before its Goaway would stay,
  // detached, for its grace). A relay that never passes the FIN on costs
  // the bound, and no more.
  start(a_);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target watcher = Target::create(ex, options({a_.address()}));
    EXPECT_TRUE((co_await watcher.connect()).ok());
    for (bool half_close : {true, false}) {
      auto relay = std::make_shared<SlowRelay>(
          ex, std::chrono::milliseconds(half_close ? 300 : 1000), half_close);
      asio::co_spawn(ex, relay->run(a_.address()), asio::detached);
      ClientOptions o;
      o.endpoints = {relay->address()};
      o.token = kToken;
      o.reconnect = false;
      auto slow = Client::create(ex, o);
      absl::Status connected = co_await slow->connect();
      EXPECT_TRUE(connected.ok()) << connected;
      if (!connected.ok()) co_return;
      auto info = co_await watcher.info();
      EXPECT_TRUE(info.ok() && info->sessions == 2) << half_close;
      co_await slow->closeAndWait(half_close ? std::chrono::seconds(30)
                                             : std::chrono::milliseconds(100));
      relay->cut();
      if (half_close) {
        // The agent had read the Goaway before it returned: it ends the
        // session, rather than keep it detached for its grace (minutes).
        uint32_t sessions = 0;
        asio::steady_timer t(ex);
        for (int i = 0; i < 500; ++i) {
          info = co_await watcher.info();
          sessions = info.ok() ? info->sessions : 0;
          if (sessions == 1) break;
          t.expires_after(std::chrono::milliseconds(20));
          co_await t.async_wait(net::use_awaitable);
        }
        EXPECT_EQ(sessions, 1u) << "the session was cut before its Goaway crossed";
      } else {
        // Returned at its bound (100 ms), long before the relay passed
        // even the Goaway on (2 s).
        info = co_await watcher.info();
        EXPECT_TRUE(info.ok() && info->sessions == 2) << "closeAndWait waited past its bound";
      }
    }
    watcher.close();
  });
}

TEST_F(TypedApiTest, FilesReadWriteStatAndList) {
  tree_.file("etc/hostname", "pod-host\n");
  std::string big(3 * 1024 * 1024 + 17, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  tree_.file("data/big", big);
  start(a_);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options({a_.address()}));
    absl::Status connected = co_await target.connect();
    EXPECT_TRUE(connected.ok()) << connected;
    if (!connected.ok()) co_return;
    Files files(target);

    auto file = co_await files.open("/etc/hostname");
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) co_return;
    EXPECT_TRUE(file->alive().ok());
    auto data = co_await file->pread(0, 100);
    EXPECT_TRUE(data.ok()) << data.status();
    if (data.ok()) {
      EXPECT_EQ(data->data, "pod-host\n");
      EXPECT_TRUE(data->eof);
    }
    auto st = co_await file->stat();
    EXPECT_TRUE(st.ok() && st->isRegular() && st->size == 9) << st.status();
    EXPECT_TRUE((co_await file->close()).ok());
    EXPECT_EQ(errnoValue(file->alive()), EBADF);
    EXPECT_EQ(errnoValue((co_await file->pread(0, 1)).status()), EBADF) << "closed";

    // A file larger than one read, pipelined; the same bytes back.
    auto whole = co_await files.readFile("/data/big", /*depth=*/4, /*chunk=*/256 * 1024);
    EXPECT_TRUE(whole.ok()) << whole.status();
    if (whole.ok()) {
      EXPECT_TRUE(*whole == big) << "sizes " << whole->size() << " " << big.size();
    }

    // Pipelined writes, then the file as the kernel has it.
    absl::Status wrote = co_await files.writeFile("/data/copy", big, 0600, /*depth=*/4);
    EXPECT_TRUE(wrote.ok()) << wrote;
    EXPECT_TRUE(ScratchTree::read(tree_.inRoot("data/copy")) == big);

    EXPECT_TRUE((co_await files.mkdir("/data/dir")).ok());
    EXPECT_TRUE((co_await files.rename("/data/copy", "/data/dir/moved")).ok());
    auto entries = co_await files.readdir("/data/dir");
    EXPECT_TRUE(entries.ok()) << entries.status();
    std::vector<std::string> names;
    if (entries.ok()) {
      for (const auto& e : *entries) names.push_back(e.name);
    }
    EXPECT_NE(std::find(names.begin(), names.end(), "moved"), names.end());
    auto dirstat = co_await files.stat("/data/dir");
    EXPECT_TRUE(dirstat.ok() && dirstat->isDirectory()) << dirstat.status();

    // Errors carry the errno.
    auto missing = co_await files.open("/no/such/file");
    EXPECT_EQ(errorCode(missing.status()), ErrorCode::kErrno);
    EXPECT_EQ(errnoValue(missing.status()), ENOENT) << missing.status();
    EXPECT_EQ(errnoValue(co_await files.unlink("/etc")), EISDIR);
    target.close();
  });
}

// A handle not closed is closed when the last File goes.
// Piped reads (File::startPread with `piped`, what the mount uses) in
// flight across a transport cut: each is answered once, with the file's
// bytes (the agent replays what the client had not acked; a pipe half
// filled when the cut came is dropped and the answer received again), and
// the session resumes once.
TEST_F(TypedApiTest, PipedReadsInFlightSurviveATransportCut) {
  constexpr uint32_t kChunk = 512 * 1024;
  std::string big(8 * kChunk, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 13 + i / 4096);
  tree_.file("data/big", big);
  start(a_);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options({a_.address()}));
    absl::Status connected = co_await target.connect();
    EXPECT_TRUE(connected.ok()) << connected;
    if (!connected.ok()) co_return;
    Files files(target);
    auto file = co_await files.open("/data/big");
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) co_return;
    std::vector<Pending<FileData>> parts;
    for (uint32_t i = 0; i < 8; ++i) parts.push_back(file->startPread(i * kChunk, kChunk, true));
    auto first = co_await parts[0].get();
    target.client()->cutTransportForTest();
    std::vector<absl::StatusOr<FileData>> got;
    got.push_back(std::move(first));
    for (size_t i = 1; i < parts.size(); ++i) got.push_back(co_await parts[i].get());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(got[i].ok()) << i << ": " << got[i].status();
      if (!got[i].ok()) continue;
      std::string bytes = got[i]->data;
      if (got[i]->piped) {
        auto rest = got[i]->piped->materialize();
        EXPECT_TRUE(rest.ok()) << rest.status();
        if (rest.ok()) bytes += *rest;
      }
      EXPECT_TRUE(bytes == big.substr(i * kChunk, kChunk)) << "part " << i << ": " << bytes.size();
    }
    // Answers that had all arrived before the cut need no resume; a call
    // made after it is answered only once the session has resumed.
    auto after = co_await file->pread(0, 16);
    EXPECT_TRUE(after.ok() && after->data == big.substr(0, 16)) << after.status();
    EXPECT_EQ(target.client()->resumeCountForTest(), 1u);
    EXPECT_TRUE((co_await file->close()).ok());
  });
}

TEST_F(TypedApiTest, ADroppedFileIsClosedOnTheAgent) {
  tree_.file("etc/motd", "hello");
  start(a_);
  const std::string host_path = tree_.inRoot("etc/motd");
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options({a_.address()}));
    EXPECT_TRUE((co_await target.connect()).ok());
    Files files(target);
    {
      auto file = co_await files.open("/etc/motd");
      EXPECT_TRUE(file.ok()) << file.status();
      EXPECT_TRUE(co_await fakes::eventually([&] { return fdsOpenOn(host_path) == 1; }));
    }
    EXPECT_TRUE(co_await fakes::eventually([&] { return fdsOpenOn(host_path) == 0; }))
        << "the agent still holds the file";
    target.close();
  });
}

// File handles die with their session: after a failover a File of the lost
// agent answers EBADF (naming that agent) and is never reopened on the new
// one; a new open works there.
TEST_F(TypedApiTest, AFileDiesWithItsSession) {
  tree_.file("etc/hostname", "pod-host\n");
  start(a_);
  start(b_);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options({a_.address(), b_.address()}));
    std::vector<LinkEvent> events;
    target.setEventHandler([&events](const LinkEvent& e) { events.push_back(e); });
    EXPECT_TRUE((co_await target.connect()).ok());
    Files files(target);
    auto old_file = co_await files.open("/etc/hostname");
    EXPECT_TRUE(old_file.ok()) << old_file.status();
    if (!old_file.ok()) co_return;

    a_.stop();
    EXPECT_TRUE(co_await fakes::eventually(
        [&] { return !events.empty() && events.back().kind == LinkEvent::Kind::kMoved; }));
    if (events.empty()) co_return;
    EXPECT_EQ(events.back().from, a_.address());
    EXPECT_EQ(events.back().to, b_.address());
    EXPECT_EQ(target.endpoint(), b_.address());

    absl::Status alive = old_file->alive();
    EXPECT_EQ(errnoValue(alive), EBADF) << alive;
    EXPECT_NE(alive.message().find(a_.address()), absl::string_view::npos) << alive;
    auto stale = co_await old_file->pread(0, 10);
    EXPECT_EQ(errnoValue(stale.status()), EBADF) << stale.status();

    auto new_file = co_await files.open("/etc/hostname");
    EXPECT_TRUE(new_file.ok()) << new_file.status();
    if (new_file.ok()) {
      EXPECT_NE(new_file->handle(), old_file->handle());
      auto data = co_await new_file->pread(0, 100);
      EXPECT_EQ(data.ok() ? data->data : "?", "pod-host\n");
    }
    EXPECT_EQ(errnoValue(co_await old_file->close()), EBADF);
    EXPECT_TRUE(target.lostStatus().ok());
    target.close();
  });
}

// Watches through the real agent: a change in the target reaches the
// changes handler by name; after a failover the handler hears that the
// watches are gone, and watching again on the new agent works.
TEST_F(TypedApiTest, WatchesPushChangesAndAreLostWithAFailover) {
  tree_.file("logs/app.log", "1\n");
  start(a_);
  start(b_);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options({a_.address(), b_.address()}));
    std::vector<LinkEvent> events;
    target.setEventHandler([&events](const LinkEvent& e) { events.push_back(e); });
    EXPECT_TRUE((co_await target.connect()).ok());
    Files files(target);
    std::vector<FileChanges> seen;
    files.setChangesHandler([&seen](const FileChanges& c) { seen.push_back(c); });
    auto saw = [&](uint64_t watch, const std::string& name, bool FileChange::*what) {
      for (const auto& c : seen) {
        for (const auto& f : c.changes) {
          if (f.watch == watch && f.name == name && f.*what) return true;
        }
      }
      return false;
    };

    auto watch = co_await files.watch("/logs");
    EXPECT_TRUE(watch.ok()) << watch.status();
    if (!watch.ok()) co_return;
    std::ofstream(tree_.inRoot("logs/app.log"), std::ios::app) << "2\n";
    EXPECT_TRUE(co_await fakes::eventually([&] { return saw(*watch, "app.log", &FileChange::content); }));
    tree_.file("logs/new.log", "n");
    EXPECT_TRUE(co_await fakes::eventually([&] { return saw(*watch, "new.log", &FileChange::created); }));
    EXPECT_EQ(errnoValue((co_await files.watch("/logs/missing")).status()), ENOENT);
    EXPECT_TRUE((co_await files.unwatch(*watch)).ok());
    EXPECT_EQ(errnoValue(co_await files.unwatch(*watch)), EINVAL);
    auto again = co_await files.watch("/logs");
    EXPECT_TRUE(again.ok()) << again.status();

    a_.stop();
    EXPECT_TRUE(co_await fakes::eventually(
        [&] { return !events.empty() && events.back().kind == LinkEvent::Kind::kMoved; }));
    EXPECT_TRUE(std::any_of(seen.begin(), seen.end(),
                            [](const FileChanges& c) { return c.watches_lost; }))
        << "a failover loses the watches, and says so";
    seen.clear();
    auto moved = co_await files.watch("/logs");
    EXPECT_TRUE(moved.ok()) << moved.status();
    if (moved.ok()) {
      std::filesystem::remove(tree_.inRoot("logs/new.log"));
      EXPECT_TRUE(co_await fakes::eventually([&] { return saw(*moved, "new.log", &FileChange::removed); }));
    }
    target.close();
  });
}

// A listing in one round trip (the agent closes the directory itself)
// takes no handle on either side: files opened after many listings work
// on, and their handles are theirs.
TEST_F(TypedApiTest, ListingsInOneRoundTripTakeNoHandle) {
  tree_.file("d/a", "alpha");
  tree_.file("d/b", "beta");
  start(a_);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options({a_.address()}));
    EXPECT_TRUE((co_await target.connect()).ok());
    Files files(target);
    std::vector<File> open;
    for (int i = 0; i < 12; ++i) {
      auto all = co_await files.list("/d", true);
      EXPECT_TRUE(all.ok()) << all.status();
      EXPECT_EQ(all.ok() ? all->size() : 0u, 4u);
      auto f = co_await files.open(i % 2 == 0 ? "/d/a" : "/d/b", O_RDWR);
      EXPECT_TRUE(f.ok()) << f.status();
      if (f.ok()) open.push_back(*f);
    }
    for (size_t i = 0; i < open.size(); ++i) {
      EXPECT_TRUE((co_await open[i].fsync(false)).ok()) << "file " << i;
      auto data = co_await open[i].pread(0, 10);
      EXPECT_EQ(data.ok() ? data->data : "?", i % 2 == 0 ? "alpha" : "beta") << "file " << i;
    }
    for (auto& f : open) EXPECT_TRUE((co_await f.close()).ok());
    target.close();
  });
}

TEST_F(TypedApiTest, DnsFromTheTargetsHostsFile) {
  tree_.file("etc/hosts", "10.1.2.3 db.example db\n127.0.0.1 localhost\n");
  tree_.file("etc/resolv.conf", "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n");
  start(a_);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options({a_.address()}));
    EXPECT_TRUE((co_await target.connect()).ok());
    Dns dns(target);
    auto found = co_await dns.lookup("db.example", AddressFamily::kIpv4);
    EXPECT_TRUE(found.ok()) << found.status();
    if (found.ok()) {
      EXPECT_TRUE(found->ok()) << dnsResultName(found->result);
      EXPECT_EQ(found->addresses, std::vector<std::string>{"10.1.2.3"});
    }
    auto names = co_await dns.reverse("10.1.2.3");
    EXPECT_TRUE(names.ok()) << names.status();
    if (names.ok()) {
      EXPECT_TRUE(names->ok()) << dnsResultName(names->result);
      EXPECT_NE(std::find(names->names.begin(), names->names.end(), "db.example"),
                names->names.end());
    }
    auto bad = co_await dns.reverse("not-an-address");
    EXPECT_FALSE(bad.ok() && bad->ok());
    target.close();
  });
}

TEST_F(TypedApiTest, EnvOfTheTarget) {
  start(a_);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options({a_.address()}));
    EXPECT_TRUE((co_await target.connect()).ok());
    Env env(target);
    // GCC 12: no braced lists in a co_await's arguments.
    std::vector<std::string> include;
    include.push_back("SIPHON_*");
    auto vars = co_await env.get(std::move(include));
    EXPECT_TRUE(vars.ok()) << vars.status();
    EXPECT_EQ(vars.ok() ? vars->size() : 0u, 2u);
    if (vars.ok() && vars->size() == 2) {
      EXPECT_EQ((*vars)[0].name, "SIPHON_ONE");
      EXPECT_EQ((*vars)[1].value, "two");
    }
    auto one = co_await env.value("SIPHON_TWO");
    EXPECT_EQ(one.value_or("?"), "two");
    auto none = co_await env.value("NOT_THERE");
    EXPECT_EQ(errorCode(none.status()), ErrorCode::kNotFound) << none.status();

    auto info = co_await target.info();
    EXPECT_TRUE(info.ok()) << info.status();
    if (info.ok()) {
      EXPECT_EQ(info->mode, "targetless");
      EXPECT_NE(std::find(info->features.begin(), info->features.end(), "FEATURE_FILES"),
                info->features.end());
    }
    auto sessions = co_await target.sessions();
    EXPECT_TRUE(sessions.ok()) << sessions.status();
    EXPECT_EQ(sessions.ok() ? sessions->size() : 0u, 1u);
    if (sessions.ok() && sessions->size() == 1) {
      EXPECT_TRUE((*sessions)[0].current);
      EXPECT_EQ((*sessions)[0].client_name, "typed-api-test");
    }
    target.close();
  });
}

int tcpListener() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(fd, 16), 0);
  return fd;
}

TEST_F(TypedApiTest, OutgoingTcpWithHalfClose) {
  fakes::EchoServer echo(tcpListener(), fakes::EchoServer::Kind::kStream);
  start(a_);
  const uint16_t port = echo.port();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options({a_.address()}));
    EXPECT_TRUE((co_await target.connect()).ok());
    Connections connections(target);
    auto conn = co_await connections.connectTcp("127.0.0.1", port);
    EXPECT_TRUE(conn.ok()) << conn.status();
    if (!conn.ok()) co_return;
    EXPECT_EQ(conn->kind(), Connection::Kind::kTcp);
    EXPECT_EQ(conn->remote().port, port);
    EXPECT_EQ(conn->remote().text(), "127.0.0.1:" + std::to_string(port));
    const std::string payload(200 * 1024, 'x');
    EXPECT_TRUE((co_await conn->write(payload)).ok());
    // "No more from me": the echo answers all of it, then ends its side.
    EXPECT_TRUE(conn->halfClose().ok());
    std::string got;
    while (true) {
      auto chunk = co_await conn->read();
      EXPECT_TRUE(chunk.ok()) << chunk.status();
      if (!chunk.ok() || !chunk->has_value()) break;
      got += **chunk;
    }
    EXPECT_EQ(got.size(), payload.size());

    // A port nobody listens on: the agent says so, typed.
    int closed = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(closed, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    ::getsockname(closed, reinterpret_cast<sockaddr*>(&a), &len);
    auto refused = co_await connections.connectTcp("127.0.0.1", ntohs(a.sin_port));
    EXPECT_EQ(errorCode(refused.status()), ErrorCode::kUnavailable) << refused.status();
    EXPECT_NE(refused.status().message().find("Connection refused"), absl::string_view::npos)
        << refused.status();
    ::close(closed);
    target.close();
  });
}

// Directory batches carry the agent's exact end flag, stats pipeline (their
// answers in any order), and the read limit is the session's.
TEST_F(TypedApiTest, DirectoryBatchesPipelinedStatsAndTheReadLimit) {
  for (int i = 0; i < 5; ++i) tree_.file("list/f" + std::to_string(i), std::string(i, 'x'));
  tree_.symlink("list/link", "f3");
  agent::AgentConfig config;
  config.token = kToken;
  config.fs_mode = agent::FsMode::kReadOnly;
  config.limits.max_read_size = 4096;
  auto procfs = std::make_unique<fakes::RootedProcFs>(tree_.root());
  procfs->setSelfPid(kSelfPid);
  procfs->addProcess(kSelfPid, fakes::FakeProcess{});
  agent::TargetSpec spec;
  spec.mode = agent::TargetMode::kTargetless;
  a_.start(config, std::move(procfs), spec);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options({a_.address()}));
    EXPECT_TRUE((co_await target.connect()).ok());
    Files files(target);
    EXPECT_EQ(files.maxReadSize(), 4096u);

    // 5 files, the link, "." and "..": four batches of two, the last one
    // (and only it) at the end.
    auto dir = co_await files.openDirectory("/list");
    EXPECT_TRUE(dir.ok()) << dir.status();
    if (!dir.ok()) co_return;
    std::vector<std::string> names;
    std::vector<bool> eofs;
    for (int i = 0; i < 10; ++i) {
      auto batch = co_await dir->nextBatch(2);
      EXPECT_TRUE(batch.ok()) << batch.status();
      if (!batch.ok()) break;
      EXPECT_LE(batch->entries.size(), 2u);
      for (const auto& e : batch->entries) names.push_back(e.name);
      eofs.push_back(batch->eof);
      if (batch->eof) break;
    }
    EXPECT_EQ(eofs, (std::vector<bool>{false, false, false, true}));
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{".", "..", "f0", "f1", "f2", "f3", "f4", "link"}));
    EXPECT_TRUE((co_await dir->close()).ok());

    // lstat of every name in flight at once, plus one that is not there;
    // taken last to first.
    std::vector<Pending<FileStat>> stats;
    for (int i = 0; i < 5; ++i) stats.push_back(files.startLstat("/list/f" + std::to_string(i)));
    stats.push_back(files.startLstat("/list/link"));
    stats.push_back(files.startLstat("/list/missing"));
    auto missing = co_await stats[6].get();
    EXPECT_EQ(errnoValue(missing.status()), ENOENT) << missing.status();
    auto link = co_await stats[5].get();
    EXPECT_TRUE(link.ok() && link->isSymlink()) << link.status();
    for (int i = 4; i >= 0; --i) {
      auto st = co_await stats[i].get();
      EXPECT_TRUE(st.ok() && st->isRegular()) << st.status();
      EXPECT_EQ(st.ok() ? st->size : -1, i);
    }
    // startStat follows the link to f3.
    Pending<FileStat> follow = files.startStat("/list/link");
    auto followed = co_await follow.get();
    EXPECT_TRUE(followed.ok() && followed->isRegular()) << followed.status();
    EXPECT_EQ(followed.ok() ? followed->size : -1, 3);
    target.close();
  });
}

// The calls a FUSE mount needs beyond the basics: links, fsync, readdir with
// stats and extended attributes, on the real agent.
TEST_F(TypedApiTest, LinksFsyncReaddirPlusAndXattrs) {
  tree_.file("d/f", "abc");
  ASSERT_EQ(::mkfifo(tree_.inRoot("d/fifo").c_str(), 0600), 0);
  // Whether /tmp takes user.* attributes (tmpfs before Linux 6.6 does not).
  const bool xattrs = ::setxattr(tree_.inRoot("d/f").c_str(), "user.probe", "1", 1, 0) == 0;
  if (xattrs) ::removexattr(tree_.inRoot("d/f").c_str(), "user.probe");
  start(a_);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options({a_.address()}));
    EXPECT_TRUE((co_await target.connect()).ok());
    Files files(target);

    EXPECT_TRUE((co_await files.symlink("/d/f", "/d/sl")).ok());
    EXPECT_EQ((co_await files.readlink("/d/sl")).value_or("?"), "/d/f");
    EXPECT_EQ(errnoValue(co_await files.symlink("x", "/d/sl")), EEXIST);
    EXPECT_TRUE((co_await files.link("/d/f", "/d/hard")).ok());
    auto hard = co_await files.stat("/d/hard");
    EXPECT_EQ(hard.ok() ? hard->nlink : 0u, 2u) << hard.status();
    EXPECT_EQ(errnoValue(co_await files.link("/d/missing", "/d/h2")), ENOENT);
    EXPECT_TRUE((co_await files.mknod("/d/fifo2", S_IFIFO | 0600, 0)).ok());
    EXPECT_EQ(errnoValue(co_await files.mknod("/d/null", S_IFCHR | 0666, 0x103)), EPERM);

    auto file = co_await files.open("/d/f", O_WRONLY);
    EXPECT_TRUE(file.ok()) << file.status();
    if (file.ok()) {
      EXPECT_TRUE((co_await file->fsync(false)).ok());
      EXPECT_TRUE((co_await file->fsync(true)).ok());
      EXPECT_TRUE((co_await file->close()).ok());
      EXPECT_EQ(errnoValue(co_await file->fsync(false)), EBADF) << "closed";
    }

    // Every entry with its lstat, in one batch.
    auto dir = co_await files.openDirectory("/d");
    EXPECT_TRUE(dir.ok()) << dir.status();
    if (!dir.ok()) co_return;
    auto batch = co_await dir->nextBatchPlus();
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok()) co_return;
    EXPECT_TRUE(batch->eof);
    EXPECT_EQ(batch->entries.size(), 7u) << ". .. f fifo sl hard fifo2";
    for (const DirEntry& e : batch->entries) {
      EXPECT_TRUE(e.stat.has_value()) << e.name;
      if (!e.stat || e.name == ".." || e.name == ".") continue;
      // A named path, not a ?: temporary in the co_await (GCC 12 destroys
      // those twice).
      std::string path = "/d/" + e.name;
      auto want = co_await files.lstat(std::move(path));
      EXPECT_TRUE(want.ok()) << want.status();
      if (!want.ok()) continue;
      EXPECT_EQ(e.stat->ino, want->ino) << e.name;
      EXPECT_EQ(e.stat->mode, want->mode) << e.name;
      EXPECT_EQ(e.stat->size, want->size) << e.name;
      EXPECT_EQ(e.stat->nlink, want->nlink) << e.name;
    }
    EXPECT_TRUE((co_await dir->close()).ok());
    auto plain = co_await files.readdir("/d");
    EXPECT_TRUE(plain.ok() && !plain->empty() && !plain->front().stat) << "nextBatch has none";

    if (!xattrs) {
      target.close();
      co_return;  // the xattr half needs a file system that takes user.*
    }
    EXPECT_EQ(errnoValue((co_await files.getxattr("/d/f", "user.a")).status()), ENODATA);
    const std::string value("1\0002", 3);
    EXPECT_TRUE((co_await files.setxattr("/d/f", "user.a", value, 0)).ok());
    EXPECT_TRUE((co_await files.setxattr("/d/f", "user.b", "", XATTR_CREATE)).ok());
    EXPECT_EQ(errnoValue(co_await files.setxattr("/d/f", "user.b", "", XATTR_CREATE)), EEXIST);
    EXPECT_EQ((co_await files.getxattr("/d/f", "user.a")).value_or("?"), value);
    EXPECT_EQ((co_await files.getxattr("/d/sl", "user.a", true)).value_or("?").size(), 3u);
    auto names = co_await files.listxattr("/d/f");
    EXPECT_TRUE(names.ok()) << names.status();
    if (names.ok()) {
      std::vector<std::string> user;
      for (const auto& n : *names) {
        if (n.rfind("user.", 0) == 0) user.push_back(n);
      }
      std::sort(user.begin(), user.end());
      EXPECT_EQ(user, (std::vector<std::string>{"user.a", "user.b"}));
    }
    EXPECT_TRUE((co_await files.removexattr("/d/f", "user.a")).ok());
    EXPECT_EQ(errnoValue(co_await files.removexattr("/d/f", "user.a")), ENODATA);
    target.close();
  });
}

}  // namespace
}  // namespace siphon::client
