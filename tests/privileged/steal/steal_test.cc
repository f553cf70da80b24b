// Steal end to end, as root, with real traffic: a "pod" network namespace
// running busybox httpd (the application, answering "original" on port 80
// and "original-81" on 81), a "client" namespace joined to it by a veth pair
// (curl and the test's own sockets come from there, as from another pod),
// the real siphon-agent targeting the httpd by PID, and the real
// `siphon steal` bridging stolen connections to servers the test runs on
// the host's loopback.
//
// Every case runs for both backends (sk_lookup, iptables); the HTTP ones
// for IPv4 and IPv6. Every kernel object has a unique name and an RAII
// owner, so a failed assertion still kills the processes and deletes the
// namespaces. Without root every test skips with the reason.
//
// Over 600 lines: one area's end-to-end cases sharing the namespaces and agent of
// steal_fixture.h.
#include "tests/privileged/steal/steal_fixture.h"

namespace siphon {
namespace {

// ------------------------------------------------------------------ tests

TEST_P(StealTest, StolenWhileStealingOriginalAfter) {
  LocalServer local(httpAnswer("stolen\n"));
  EXPECT_EQ(curl(80), "original\n");
  Proc* s = steal({"--port", "80", "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 80 -> " + local.to() + " (backend " +
                                GetParam().backend + ")"));
  EXPECT_EQ(curl(80), "stolen\n");
  // From inside the pod too (a sidecar): its own addresses are stolen.
  const std::string loop =
      GetParam().family == AF_INET ? "http://127.0.0.1:80/" : "http://[::1]:80/";
  EXPECT_EQ(curlInPod(loop), "stolen\n");
  // A port nobody steals is untouched.
  EXPECT_EQ(curl(81), "original-81\n");
  EXPECT_EQ(curl(80), "stolen\n");
  EXPECT_GE(local.accepted(), 3);

  s->signal(SIGINT);
  EXPECT_EQ(s->finish(), 0) << s->err;
  EXPECT_THAT(s->err, HasSubstr("summary: 3 connections"));
  EXPECT_THAT(s->err, HasSubstr("open "));
  EXPECT_THAT(s->err, HasSubstr("close "));
  // The application has its port back: right away, not eventually.
  EXPECT_EQ(curl(80), "original\n");
  EXPECT_EQ(curlInPod(loop), "original\n");
  EXPECT_EQ(curl(81), "original-81\n");
}

// The agent's end of a stolen connection that closes first waits in
// TIME_WAIT on the application's port. Such sockets must not keep the
// application from binding its port again (a restart, a listener it
// re-creates, as iperf3 does after every test) once the steal is over.
TEST_P(StealTest, StolenConnectionsDoNotKeepTheApplicationFromRebindingItsPort) {
  constexpr uint16_t kPort = 8095;
  std::optional<LocalServer> app;
  app.emplace(httpAnswer("app\n"), pod_->name(), kPort);
  LocalServer local(httpAnswer("stolen\n"));
  Proc* s = steal({"--port", std::to_string(kPort), "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 8095"));
  // Each client reads to EOF before it closes (curl does not: it may close
  // as soon as the Content-Length is in, before the agent's FIN arrives,
  // and then the client's end, not the agent's, waits in TIME_WAIT).
  for (int i = 0; i < 5; ++i) {
    EXPECT_THAT(getToEof(kPort), testing::Optional(testing::EndsWith("\r\n\r\nstolen\n")));
  }
  s->signal(SIGINT);
  EXPECT_EQ(s->finish(), 0) << s->err;
  // The local server answered and closed first, so the agent's sockets did.
  // With sk_lookup they hold the application's port; with iptables, the
  // redirect target (the agent's listener port), so nothing to check there.
  if (std::string(GetParam().backend) == "sk_lookup") {
    Result tw = run({"ip", "netns", "exec", pod_->name(), "ss", "-Htan", "state", "time-wait",
                     "sport = :" + std::to_string(kPort)});
    EXPECT_NE(tw.out, "") << "no TIME_WAIT on the port: the case is not exercised";
  }
  // The application restarts: its bind (SO_REUSEADDR, as servers do) works.
  app.reset();
  app.emplace(httpAnswer("app again\n"), pod_->name(), kPort);
  EXPECT_EQ(curl(kPort), "app again\n");
}

TEST_P(StealTest, SecondSessionGetsPortBusy) {
  LocalServer local(httpAnswer("stolen\n"));
  Proc* first = steal({"--port", "80", "--to", local.to()});
  ASSERT_THAT(first->err, HasSubstr("stealing port 80"));
  Proc* second = steal({"--port", "80", "--to", local.to()});
  EXPECT_EQ(second->finish(), 1) << second->err;
  EXPECT_THAT(second->err, HasSubstr("already stolen by session"));
  // The first one still has it.
  EXPECT_EQ(curl(80), "stolen\n");
  // And a second session may take another port.
  LocalServer other(httpAnswer("stolen-81\n"));
  Proc* third = steal({"--port", "81", "--to", other.to()});
  ASSERT_THAT(third->err, HasSubstr("stealing port 81"));
  EXPECT_EQ(curl(81), "stolen-81\n");
  third->signal(SIGINT);
  EXPECT_EQ(third->finish(), 0) << third->err;
  EXPECT_EQ(curl(81), "original-81\n");
  EXPECT_EQ(curl(80), "stolen\n");
}

// kill -9 of the agent mid-steal: the application gets its port back
// within a second and nothing of ours remains in the pod.
TEST_P(StealTest, AgentKilledMidStealLeavesNothingBehind) {
  LocalServer local(httpAnswer("stolen\n"));
  Proc* s = steal({"--port", "80", "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 80"));
  EXPECT_EQ(curl(80), "stolen\n");
  if (GetParam().backend == "iptables") {
    Result save = run({"ip", "netns", "exec", pod_->name(), "iptables-save", "-t", "nat"});
    EXPECT_THAT(save.out, HasSubstr("SIPHON")) << "the iptables backend made no chains?";
  }
  ASSERT_GT(agent_->child().pid(), 0);
  ::kill(agent_->child().pid(), SIGKILL);
  ASSERT_TRUE(agent_->child().waitUntil(Clock::now() + kProcessDeadline).has_value());
  EXPECT_TRUE(originalWithin(std::chrono::milliseconds(1000)))
      << "the application did not get port 80 back within 1 s";
  EXPECT_EQ(curl(81), "original-81\n");
  // `siphon steal` notices, though no connection is open: once its resume
  // attempts run out (the 3 s session grace), it says so and exits 3.
  EXPECT_EQ(s->finish(), 3) << s->err;
  EXPECT_THAT(s->err, HasSubstr("lost"));
  // The guard (iptables) may still be finishing its last command.
  std::string left;
  fakes::eventually([&] { return (left = leftovers()).empty(); }, std::chrono::seconds(5),
                    std::chrono::milliseconds(20));
  EXPECT_EQ(left, "");
}

// SIGTERM of the agent mid-steal: a clean exit that undoes the steering
// itself (for iptables: the chains are removed by the agent, the guard has
// nothing left to do).
TEST_P(StealTest, AgentTerminatedMidStealGivesThePortBack) {
  LocalServer local(httpAnswer("stolen\n"));
  Proc* s = steal({"--port", "80", "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 80"));
  EXPECT_EQ(curl(80), "stolen\n");
  ASSERT_GT(agent_->child().pid(), 0);
  ::kill(agent_->child().pid(), SIGTERM);
  EXPECT_EQ(agent_->child().waitUntil(Clock::now() + kProcessDeadline), 0) << agent_->log();
  EXPECT_EQ(curl(80), "original\n");
  EXPECT_EQ(leftovers(), "");
  EXPECT_THAT(agent_->log(), HasSubstr("steal_unsubscribed"));
}

// SIGTERM with a stolen connection open (a drain): the port is the
// application's at once (every new connection reaches it, none is refused),
// the open connection goes on, and the agent exits 0 as soon as it closes.
TEST_P(StealTest, SigtermDrainsTheOpenConnectionAndGivesThePortBackAtOnce) {
  LocalServer local(echoServe);
  Proc* s = nullptr;
  Fd c = stealAndConnect(local, &s);
  ASSERT_GE(c.get(), 0);
  ASSERT_GT(agent_->child().pid(), 0);
  ::kill(agent_->child().pid(), SIGTERM);
  s->readUntil([](const std::string&, const std::string& err) {
    return err.find("agent draining") != std::string::npos;
  });
  EXPECT_THAT(s->err, HasSubstr("agent draining (SIGTERM): new connections go to the application"));
  // From here on, new connections are the application's, the first included.
  for (int i = 0; i < 5; ++i) EXPECT_EQ(curl(80), "original\n");
  // The stolen connection in flight still works, and holds the agent.
  EXPECT_EQ(echoOnce(c.get(), "during the drain"), "during the drain");
  EXPECT_FALSE(agent_->child().waitUntil(Clock::now() + std::chrono::milliseconds(300)).has_value())
      << "the agent did not wait for the open connection";
  c = Fd();  // closes it: nothing is in flight any more
  EXPECT_EQ(agent_->child().waitUntil(Clock::now() + kProcessDeadline), 0) << agent_->log();
  EXPECT_THAT(agent_->log(), HasSubstr("drain_started"));
  EXPECT_THAT(agent_->log(), HasSubstr("drained after SIGTERM"));
  EXPECT_EQ(curl(80), "original\n");
  EXPECT_EQ(leftovers(), "");
}

// `siphon steal` ending (SIGINT) with a connection open: the port is given
// back at once, and the open connection goes on until it closes. For the
// iptables backend this needs the chains' conntrack rule: without it,
// iptables-nft unhooks conntrack with the last REDIRECT and the kernel
// resets the connection.
TEST_P(StealTest, EndingTheStealKeepsTheOpenConnectionUntilItCloses) {
  LocalServer local(echoServe);
  Proc* s = nullptr;
  Fd c = stealAndConnect(local, &s);
  ASSERT_GE(c.get(), 0);
  s->signal(SIGINT);
  s->readUntil([](const std::string&, const std::string& err) {
    return err.find("stopping: waiting for 1 open connection") != std::string::npos;
  });
  ASSERT_THAT(s->err, HasSubstr("stopping: waiting for 1 open connection"));
  EXPECT_EQ(curl(80), "original\n");
  EXPECT_EQ(echoOnce(c.get(), "after the port went back"), "after the port went back");
  c = Fd();
  EXPECT_EQ(s->finish(), 0) << s->err;
  EXPECT_EQ(curl(80), "original\n");
}

// The target process exits: the agent exits 0 at once (pidfd) and takes
// its steering with it; the other application of the pod has its port back.
TEST_P(StealTest, TargetExitEndsTheAgentAndLeavesNothing) {
  LocalServer local(httpAnswer("stolen-81\n"));
  Proc* s = steal({"--port", "81", "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 81"));
  EXPECT_EQ(curl(81), "stolen-81\n");
  httpd80_.kill();  // the agent's target
  EXPECT_EQ(agent_->child().waitUntil(Clock::now() + kProcessDeadline), 0) << agent_->log();
  EXPECT_THAT(agent_->log(), HasSubstr("target_exited"));
  EXPECT_EQ(curl(81), "original-81\n");
  EXPECT_EQ(leftovers(), "");
  // siphon steal hears the agent end the session and says so.
  EXPECT_EQ(s->finish(), 3) << s->err;
}

// A connection still open at --drain-timeout is reset (never closed as if
// complete), and the agent exits 0 right then.
// A second signal during the drain ends the agent at once (well before the
// drain timeout), still leaving nothing behind in the target.
TEST_P(StealTest, SecondSignalEndsTheDrainAtOnceAndCleansUp) {
  ASSERT_GT(agent_->child().pid(), 0);
  ::kill(agent_->child().pid(), SIGTERM);
  ASSERT_EQ(agent_->child().waitUntil(Clock::now() + std::chrono::seconds(5)), 0) << agent_->log();
  ASSERT_NO_FATAL_FAILURE(startAgent({"--drain-timeout", "60s"}));

  LocalServer local(echoServe);
  Proc* s = nullptr;
  Fd c = stealAndConnect(local, &s);
  ASSERT_GE(c.get(), 0);
  ::kill(agent_->child().pid(), SIGTERM);
  ASSERT_TRUE(s->readUntil([](const std::string&, const std::string& err) {
    return err.find("agent draining") != std::string::npos;
  })) << s->err;
  // Still draining: the held connection is served.
  EXPECT_EQ(echoOnce(c.get(), "during"), "during");
  const auto t0 = Clock::now();
  ::kill(agent_->child().pid(), SIGINT);
  EXPECT_EQ(agent_->child().waitUntil(Clock::now() + kProcessDeadline), 0) << agent_->log();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_THAT(agent_->log(), HasSubstr("second signal"));
  EXPECT_EQ(curl(80), "original\n");
  EXPECT_EQ(leftovers(), "");
}

TEST_P(StealTest, DrainTimeoutResetsTheConnectionsStillOpen) {
  // The fixture's agent has no session: SIGTERM ends it at once.
  ASSERT_GT(agent_->child().pid(), 0);
  ::kill(agent_->child().pid(), SIGTERM);
  ASSERT_EQ(agent_->child().waitUntil(Clock::now() + std::chrono::seconds(5)), 0) << agent_->log();
  ASSERT_NO_FATAL_FAILURE(startAgent({"--drain-timeout", "1s"}));

  LocalServer local(echoServe);
  Proc* s = nullptr;
  Fd c = stealAndConnect(local, &s);
  ASSERT_GE(c.get(), 0);
  const auto t0 = Clock::now();
  ::kill(agent_->child().pid(), SIGTERM);
  EXPECT_EQ(agent_->child().waitUntil(Clock::now() + kProcessDeadline), 0) << agent_->log();
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(900));
  EXPECT_LT(took, std::chrono::seconds(5));
  char b;
  timeval tv{5, 0};
  ::setsockopt(c.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  errno = 0;
  EXPECT_EQ(::read(c.get(), &b, 1), -1);
  EXPECT_EQ(errno, ECONNRESET) << strerror(errno);
  EXPECT_THAT(agent_->log(), HasSubstr("drain_timeout"));
  EXPECT_EQ(curl(80), "original\n");
  EXPECT_EQ(leftovers(), "");
}

// Half-close: the remote client shuts down writing after its request and
// still receives the whole answer, which the local server sends only after
// it saw the request's end.
TEST_P(StealTest, HalfClosedClientGetsTheWholeAnswer) {
  const uint64_t kAnswer = 8 << 20;
  std::atomic<uint64_t> request_bytes{0};
  LocalServer local([&](int fd) {
    std::string req;
    if (!readAll(fd, &req)) return;  // to the client's EOF
    request_bytes = req.size();
    sendPattern(fd, 42, kAnswer);
  });
  Proc* s = steal({"--port", "80", "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 80"));
  int fd = connectFrom(client_->name(), podAddress(), 80);
  ASSERT_GE(fd, 0);
  const std::string req(100000, 'q');
  ASSERT_TRUE(writeAll(fd, req.data(), req.size()));
  ASSERT_EQ(::shutdown(fd, SHUT_WR), 0);
  bool eof = false;
  EXPECT_EQ(receivePattern(fd, 42, kAnswer, &eof), kAnswer);
  EXPECT_TRUE(eof);
  ::close(fd);
  EXPECT_EQ(request_bytes.load(), req.size());
}

// 500 concurrent stolen connections, each echoing its own data.
// `siphon steal` whose stderr nobody reads (a detached terminal, a pipe to
// a stopped reader): its per-connection lines fill the pipe after a few
// hundred connections, and must not stall the connections it bridges.
TEST_P(StealTest, UnreadStderrDoesNotStallConnections) {
  LocalServer local(echoServe);
  Proc* s = steal({"--port", "80", "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 80"));
  // ~130 bytes of lines per connection: 64 KiB of pipe is full after ~500.
  for (int i = 0; i < 1500; ++i) {
    Fd c(connectFrom(client_->name(), podAddress(), 80));
    ASSERT_GE(c.get(), 0) << "connection " << i << ": " << strerror(errno);
    const std::string msg = "m" + std::to_string(i);
    ASSERT_EQ(echoOnce(c.get(), msg), msg) << "connection " << i;
  }
  // The reader comes back: every line waited for it (the CLI queues up to
  // 1 MiB of them, then drops and counts: tests/unit/cli/line_writer_test),
  // and the steal ends cleanly.
  s->signal(SIGINT);
  EXPECT_EQ(s->finish(), 0) << s->err.substr(0, 2000);
  size_t closes = 0;
  for (size_t at = 0; (at = s->err.find("\nclose ", at)) != std::string::npos; ++at) ++closes;
  EXPECT_EQ(closes, 1500u);
  EXPECT_THAT(s->err, HasSubstr("summary: 1500 connections"));
}

TEST_P(StealTest, FiveHundredConcurrentConnectionsEchoTheirOwnData) {
  LocalServer local([](int fd) {
    char buf[65536];
    while (true) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      if (!writeAll(fd, buf, static_cast<size_t>(n))) break;
    }
    ::shutdown(fd, SHUT_WR);
  });
  Proc* s = steal({"--port", "80", "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 80"));
  constexpr int kConnections = 500;
  // Connect all first, so all 500 are open at once.
  std::vector<int> fds;
  for (int i = 0; i < kConnections; ++i) {
    int fd = connectFrom(client_->name(), podAddress(), 80);
    ASSERT_GE(fd, 0) << "connection " << i << ": " << std::strerror(errno);
    fds.push_back(fd);
  }
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kConnections; ++i) {
    threads.emplace_back([&, i] {
      const uint64_t size = 20000 + static_cast<uint64_t>(i) * 97;
      std::thread writer([&] { sendPattern(fds[i], 1000 + i, size); });
      bool eof = false;
      uint64_t got = receivePattern(fds[i], 1000 + i, size, &eof);
      writer.join();
      if (got == size && eof) ++good;
      ::close(fds[i]);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), kConnections);
  EXPECT_EQ(local.accepted(), kConnections);
}

// --flush-connections: a connection established before the steal is
// destroyed so its client reconnects (and is stolen); without the flag it
// would keep talking to the application.
TEST_P(StealTest, FlushConnectionsResetsEstablishedOnes) {
  LocalServer local(httpAnswer("stolen\n"));
  int held = connectFrom(client_->name(), podAddress(), 80);
  ASSERT_GE(held, 0);
  Proc* s = steal({"--port", "80", "--to", local.to(), "--flush-connections"});
  ASSERT_THAT(s->err, HasSubstr("stealing port 80"));
  // The held connection was destroyed on the pod's side: a reset (or EOF)
  // instead of an answer.
  const std::string req = "GET / HTTP/1.0\r\n\r\n";
  std::string resp;
  (void)writeAll(held, req.data(), req.size());
  (void)readAll(held, &resp);
  ::close(held);
  EXPECT_THAT(resp, Not(HasSubstr("original")));
  EXPECT_EQ(curl(80), "stolen\n");
}

// Health probes keep reaching the application (issue 22): connections
// from a --probe-source (the node, where the kubelet probes from) are never
// stolen, filtered or not; and a filtered steal never takes a kubelet
// probe (User-Agent kube-probe/...) unless its filter names User-Agent.
TEST_P(StealTest, ProbesKeepReachingTheApplication) {
  const bool v6 = GetParam().family == AF_INET6;
  const std::string probe_ip = v6 ? probe_ip6_ : probe_ip4_;
  std::vector<std::string> add = {"ip",   "-n",      client_->name(),
                                  "addr", "add",     probe_ip + (v6 ? "/64" : "/24"),
                                  "dev",  client_if_};
  if (v6) add.push_back("nodad");
  Result added = run(add);
  ASSERT_EQ(added.exit_code, 0) << added;
  // The agent again, told where probes come from (a single address: /32
  // or /128 by default).
  ::kill(agent_->child().pid(), SIGTERM);
  ASSERT_EQ(agent_->child().waitUntil(Clock::now() + std::chrono::seconds(5)), 0) << agent_->log();
  ASSERT_NO_FATAL_FAILURE(startAgent({"--probe-source", probe_ip}));
  auto curlFrom = [&](const std::string& source, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {"ip", "netns",      "exec", client_->name(), "curl", "-sS",
                                     "-g", "--max-time", "5",    "--interface",   source};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(podAddress().url(80));
    Result r = run(argv);
    return r.exit_code == 0 ? r.out : "curl exit " + std::to_string(r.exit_code) + ": " + r.err;
  };
  // The client's own address (curl would pick either once it has two).
  const std::string client_ip = v6 ? pod_ip6_.substr(0, pod_ip6_.size() - 1) + "2"
                                   : pod_ip4_.substr(0, pod_ip4_.size() - 1) + "2";
  // The probe address answers before anything (the route is there).
  EXPECT_EQ(curlFrom(probe_ip), "original\n");

  LocalServer local(httpAnswer("stolen\n"));
  Proc* s = steal({"--port", "80", "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 80"));
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(curlFrom(probe_ip), "original\n") << "probe " << i;
    EXPECT_EQ(curlFrom(client_ip), "stolen\n") << "client " << i;
  }
  s->signal(SIGINT);
  EXPECT_EQ(s->finish(), 0) << s->err;

  // A filter that takes every request: kubelet probes still go to the
  // application, from any address; other clients are stolen.
  s = steal({"--port", "80", "--to", local.to(), "--filter-path", "^/"});
  ASSERT_THAT(s->err, HasSubstr("stealing"));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(curlFrom(client_ip, {"-A", "kube-probe/1.30"}), "original\n") << "kubelet " << i;
    EXPECT_EQ(curlFrom(client_ip), "stolen\n") << "client " << i;
    EXPECT_EQ(curlFrom(probe_ip), "original\n") << "probe source " << i;
  }
  s->signal(SIGINT);
  EXPECT_EQ(s->finish(), 0) << s->err;
}

INSTANTIATE_TEST_SUITE_P(Backends, StealTest,
                         ::testing::Values(Param{"sk_lookup", AF_INET},
                                           Param{"sk_lookup", AF_INET6}, Param{"iptables", AF_INET},
                                           Param{"iptables", AF_INET6}),
                         paramName);

// ---------------------------------------------------------------- 1 GiB

class StealBulkTest : public StealTest {};

// A GiB each way through one stolen connection, every byte checked (a
// quarter of it under the sanitizers: the same code, every buffer and
// window wrapped many times over, in a quarter of the run's minutes).
TEST_P(StealBulkTest, OneGibibyteEachWayArrivesByteExact) {
  constexpr uint64_t kGiB = fakes::kSanitizedBuild ? 1ull << 28 : 1ull << 30;
  std::atomic<uint64_t> upload_good{0};
  std::atomic<bool> upload_eof{false};
  LocalServer local([&](int fd) {
    // Download: the local server sends a GiB while reading the upload.
    std::thread down([fd] { sendPattern(fd, 7, kGiB); });
    bool eof = false;
    upload_good = receivePattern(fd, 8, kGiB, &eof);
    upload_eof = eof;
    down.join();
  });
  Proc* s = steal({"--port", "80", "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 80"));
  int fd = connectFrom(client_->name(), podAddress(), 80);
  ASSERT_GE(fd, 0);
  std::thread up([fd] { sendPattern(fd, 8, kGiB); });
  bool eof = false;
  uint64_t download_good = receivePattern(fd, 7, kGiB, &eof);
  up.join();
  ::close(fd);
  EXPECT_EQ(download_good, kGiB);
  EXPECT_TRUE(eof);
  // The local server finishes reading once the stream's EOF reached it.
  const auto deadline = Clock::now() + kProcessDeadline;
  while (!upload_eof && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(upload_good.load(), kGiB);
  EXPECT_TRUE(upload_eof.load());
  s->signal(SIGINT);
  EXPECT_EQ(s->finish(), 0) << s->err;
  EXPECT_THAT(s->err, HasSubstr("in=" + std::to_string(kGiB)));
}

INSTANTIATE_TEST_SUITE_P(Backends, StealBulkTest,
                         ::testing::Values(Param{"sk_lookup", AF_INET},
                                           Param{"iptables", AF_INET6}),
                         paramName);


// SIGTERM of the agent while wrk makes a new connection per request
// (Connection: close) to the stolen port: not one request fails, not one
// connection is refused, reset or left hanging. The stolen ones are
// answered by the local server, those after the switch by the application,
// and the ones caught in the middle (in the agent's accept queue, or in
// their handshake while the steering went) by the application through the
// passthrough; the agent exits 0 as soon as the last one is done.
TEST_P(StealDrainLoadTest, SigtermUnderLoadFailsNoRequest) {
  constexpr auto kDrainTimeout = std::chrono::seconds(8);
  ASSERT_NO_FATAL_FAILURE(restartAgent({"--drain-timeout", "8s"}));
  LocalServer app(httpKeepAlive("original\n"), pod_->name(), kLoadPort);
  LocalServer local(httpKeepAlive("stolen\n"));
  Proc* s = steal({"--port", std::to_string(kLoadPort), "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 8080"));
  ASSERT_EQ(curl(kLoadPort), "stolen\n");

  auto stop_reading = drainOutput(s);
  auto wrk = startWrk(6, {"-H", "Connection: close"});
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const int app_before = app.accepted();
  const int stolen_before = local.accepted();
  const auto t0 = Clock::now();
  ::kill(agent_->child().pid(), SIGTERM);
  auto code = agent_->child().waitUntil(t0 + kDrainTimeout + std::chrono::seconds(2));
  const int64_t exit_ms = msSince(t0);
  WrkCounts w = wrk.get();
  stop_reading();
  std::cerr << "wrk: " << w.raw << "the local server accepted " << local.accepted() << " ("
            << stolen_before << " before SIGTERM), the application " << app.accepted() << " ("
            << app_before << " before); the agent exited " << exit_ms << " ms after SIGTERM\n";

  EXPECT_EQ(code, 0) << "the agent did not exit 0 within the drain deadline";
  EXPECT_LT(exit_ms, std::chrono::milliseconds(kDrainTimeout).count());
  EXPECT_THAT(agent_->log(), HasSubstr("drained after SIGTERM"));
  EXPECT_THAT(agent_->log(), Not(HasSubstr("drain_timeout")));
  ASSERT_TRUE(w.parsed) << w;
  EXPECT_EQ(w.connect, 0) << w;
  EXPECT_EQ(w.read, 0) << w;
  EXPECT_EQ(w.write, 0) << w;
  EXPECT_EQ(w.timeout, 0) << w;
  EXPECT_EQ(w.non2xx, 0) << w;
  EXPECT_EQ(w.other, 0) << w;
  EXPECT_EQ(w.stolen + w.original, w.requests) << w;
  // Both answered, the application only once the switch began.
  EXPECT_GT(stolen_before, 0);
  EXPECT_GT(w.stolen, 0) << w;
  EXPECT_GT(w.original, 0) << w;
  EXPECT_EQ(app_before, 0);
  EXPECT_EQ(curl(kLoadPort), "original\n");
  EXPECT_EQ(leftovers(), "");
}

// The same with keep-alive (no Connection: close): wrk's 16 connections are
// stolen once and never end, so the drain keeps serving them until
// --drain-timeout and then resets them (never a clean close that could
// pass for a complete answer). wrk counts one socket error per connection
// and reconnects, to the application. A graceful HTTP close (Connection:
// close on the next answer) needs the HTTP-aware steal.
TEST_P(StealDrainLoadTest, SigtermUnderKeepAliveLoadResetsHeldConnectionsAtTheDrainTimeout) {
  constexpr auto kDrainTimeout = std::chrono::seconds(2);
  ASSERT_NO_FATAL_FAILURE(restartAgent({"--drain-timeout", "2s"}));
  LocalServer app(httpKeepAlive("original\n"), pod_->name(), kLoadPort);
  LocalServer local(httpKeepAlive("stolen\n"));
  Proc* s = steal({"--port", std::to_string(kLoadPort), "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 8080"));

  auto stop_reading = drainOutput(s);
  auto wrk = startWrk(5, {});
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto t0 = Clock::now();
  ::kill(agent_->child().pid(), SIGTERM);
  auto code = agent_->child().waitUntil(t0 + kDrainTimeout + std::chrono::seconds(3));
  const int64_t exit_ms = msSince(t0);
  WrkCounts w = wrk.get();
  stop_reading();
  std::cerr << "wrk: " << w.raw << "the local server accepted " << local.accepted()
            << " connections, the application " << app.accepted() << "; the agent exited "
            << exit_ms << " ms after SIGTERM\n";

  EXPECT_EQ(code, 0);
  EXPECT_GE(exit_ms, std::chrono::milliseconds(kDrainTimeout).count() - 100);
  EXPECT_THAT(agent_->log(), HasSubstr("drain_timeout"));
  // The ports went back long before the drain timeout reset the held
  // connections: wrk's reconnects then reach the application. (Deleting the
  // REDIRECTs made each iptables-nft-restore wait for the kernel's RCU
  // grace period, 2 s under this load: the agent exited at the timeout
  // with the rule still there, and every reconnect was refused.)
  const std::string log = agent_->log();
  EXPECT_LT(log.find("steal_drain_steering_removed"), log.find("drain_timeout")) << log;
  ASSERT_TRUE(w.parsed) << w;
  // Only the 16 kept-alive connections were stolen (and wrk's first
  // connect, which only checks the address), each reset once at the drain
  // timeout; wrk made its new ones to the application.
  EXPECT_LE(local.accepted(), 17);
  EXPECT_GT(w.socketErrors(), 0) << w;
  EXPECT_LE(w.socketErrors(), 16) << w;
  EXPECT_EQ(w.connect, 0) << w;
  EXPECT_EQ(w.timeout, 0) << w;
  EXPECT_EQ(w.non2xx, 0) << w;
  EXPECT_EQ(w.other, 0) << w;
  EXPECT_GT(w.stolen, 0) << w;
  EXPECT_GT(w.original, 0) << w;
  EXPECT_GE(app.accepted(), 1);
  EXPECT_LE(app.accepted(), 16);
  EXPECT_EQ(leftovers(), "");
}

INSTANTIATE_TEST_SUITE_P(Backends, StealDrainLoadTest,
                         ::testing::Values(Param{"sk_lookup", AF_INET},
                                           Param{"iptables", AF_INET6}),
                         paramName);

}  // namespace
}  // namespace siphon
