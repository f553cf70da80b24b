// The mirror service end to end in process and without root: a targetless
// agent whose capture source is a fake the test feeds with the events the
// real MirrorEngine would hand over (the kernel part is tested in
// tests/privileged/mirror*). The rest is real: subscriptions, unsubscribe
// routing, one stream per connection and subscription with flow control,
// records, gaps, ends, the per-subscription budget, mid-stream joins.
#include "agent/mirror/mirror_service.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <random>
#include <set>

#include "agent/server/server.h"
#include "siphon/client/client.h"
#include "siphon/status.h"
#include "tests/fakes/in_process_agent.h"

namespace siphon::agent::mirror {
namespace {

namespace asio = net::asio;
using fakes::eventually;

constexpr char kToken[] = "mirror-test-token";

// What the service asked of the capture side, and the way to feed it.
struct FakeCapture {
  std::mutex mu;
  std::vector<std::string> calls;  // "start", "add 80", "s2c 80", "no s2c 80", "remove 80", "stop"
  std::function<void(std::vector<MirrorEvent>)> deliver;
  std::atomic<size_t> released{0};
  std::atomic<bool> fail_start{false};

  void record(std::string s) {
    std::lock_guard<std::mutex> l(mu);
    calls.push_back(std::move(s));
  }
  bool saw(const std::string& s) {
    std::lock_guard<std::mutex> l(mu);
    return std::find(calls.begin(), calls.end(), s) != calls.end();
  }
  size_t count(const std::string& s) {
    std::lock_guard<std::mutex> l(mu);
    return static_cast<size_t>(std::count(calls.begin(), calls.end(), s));
  }
  void push(std::vector<MirrorEvent> batch) {
    std::function<void(std::vector<MirrorEvent>)> d;
    {
      std::lock_guard<std::mutex> l(mu);
      d = deliver;
    }
    ASSERT_TRUE(d) << "no source is running";
    d(std::move(batch));
  }
};

class FakeSource : public MirrorSource {
 public:
  explicit FakeSource(std::shared_ptr<FakeCapture> c) : c_(std::move(c)) {}
  ~FakeSource() override {
    c_->record("stop");
    std::lock_guard<std::mutex> l(c_->mu);
    c_->deliver = nullptr;
  }
  absl::Status addPort(uint16_t port) override {
    c_->record(absl::StrCat("add ", port));
    return absl::OkStatus();
  }
  absl::Status removePort(uint16_t port) override {
    c_->record(absl::StrCat("remove ", port));
    return absl::OkStatus();
  }
  void released(size_t bytes) override { c_->released += bytes; }
  void setServerToClient(uint16_t port, bool wanted) override {
    c_->record(absl::StrCat(wanted ? "s2c " : "no s2c ", port));
  }

 private:
  std::shared_ptr<FakeCapture> c_;
};

// ---- events as the engine hands them over ----

ConnectionInfo connection(uint64_t id, uint16_t client_port, uint16_t server_port,
                          bool mid_stream = false) {
  ConnectionInfo c;
  c.id = id;
  c.client = Endpoint{IpAddress::v4(10, 0, 0, 2), client_port};
  c.server = Endpoint{IpAddress::v4(10, 0, 0, 1), server_port};
  c.started_mid_stream = mid_stream;
  return c;
}

MirrorEvent opened(const ConnectionInfo& c) {
  MirrorEvent e;
  e.kind = MirrorEvent::Kind::kOpened;
  e.connection = c.id;
  e.info = c;
  return e;
}

MirrorEvent data(uint64_t id, Direction d, std::string_view bytes) {
  MirrorEvent e;
  e.kind = MirrorEvent::Kind::kData;
  e.connection = id;
  e.direction = d;
  e.record.push_back(static_cast<char>(directionByte(d)));
  e.record.append(bytes);
  return e;
}

MirrorEvent gap(uint64_t id, Direction d, uint64_t bytes) {
  MirrorEvent e;
  e.kind = MirrorEvent::Kind::kGap;
  e.connection = id;
  e.direction = d;
  e.gap_bytes = bytes;
  return e;
}

MirrorEvent ended(uint64_t id, Direction d) {
  MirrorEvent e;
  e.kind = MirrorEvent::Kind::kEnd;
  e.connection = id;
  e.direction = d;
  return e;
}

MirrorEvent closed(uint64_t id, CloseReason reason) {
  MirrorEvent e;
  e.kind = MirrorEvent::Kind::kClosed;
  e.connection = id;
  e.reason = reason;
  return e;
}

constexpr Direction kUp = Direction::kClientToServer;
constexpr Direction kDown = Direction::kServerToClient;

std::string randomBytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// ---- the client side ----

// Mirrored streams the agent opened to one client, accepted as they come.
struct Streams {
  explicit Streams(asio::any_io_executor e) : signal(e) {}
  net::Signal signal;
  std::vector<std::pair<std::shared_ptr<client::ClientStream>, v1::StreamOpen>> got;
};

std::shared_ptr<Streams> acceptAll(const std::shared_ptr<client::Client>& c,
                                   const asio::any_io_executor& ex) {
  auto s = std::make_shared<Streams>(ex);
  std::weak_ptr<client::Client> weak = c;
  c->setStreamAcceptor([s, weak](std::shared_ptr<client::ClientStream> stream, v1::StreamOpen open) {
    if (auto client = weak.lock()) {
      EXPECT_TRUE(client->acceptStream(*stream).ok());
    }
    s->got.emplace_back(std::move(stream), std::move(open));
    s->signal.notify();
  });
  return s;
}

net::awaitable<bool> waitStreams(Streams& s, size_t n) {
  co_return co_await fakes::eventually([&] { return s.got.size() >= n; });
}

// Everything one mirrored stream delivered, until its end.
struct Transcript {
  std::string up, down;          // bytes per direction
  uint64_t up_gap = 0, down_gap = 0;
  bool up_fin = false, down_fin = false;
  std::string order;             // "U" "D" "u" "d" (fins) "G"
  absl::Status end;              // OK: half-close; else the reset
};

// `up_received`, when given, follows the client-to-server bytes read so far
// (the reader and the test run on one executor: a plain counter).
net::awaitable<Transcript> readAll(std::shared_ptr<client::ClientStream> stream,
                                   size_t* up_received = nullptr) {
  const auto s = std::move(stream);
  Transcript t;
  while (true) {
    auto ev = co_await s->readEvent();
    if (!ev.ok()) {
      t.end = ev.status();
      break;
    }
    if (!ev->has_value()) break;
    const client::StreamEvent& e = **ev;
    if (e.gap) {
      (e.gap->direction() == v1::CLIENT_TO_SERVER ? t.up_gap : t.down_gap) += e.gap->bytes();
      t.order += "G";
      continue;
    }
    EXPECT_FALSE(e.data.empty());
    if (e.data.empty()) continue;
    const bool up = e.data[0] == static_cast<char>(v1::CLIENT_TO_SERVER);
    if (e.data.size() == 1) {
      (up ? t.up_fin : t.down_fin) = true;
      t.order += up ? "u" : "d";
    } else {
      (up ? t.up : t.down).append(e.data, 1);
      if (up && up_received != nullptr) *up_received = t.up.size();
      if (t.order.empty() || t.order.back() != (up ? 'U' : 'D')) t.order += up ? "U" : "D";
    }
  }
  co_return t;
}

net::awaitable<absl::StatusOr<uint64_t>> subscribe(const std::shared_ptr<client::Client>& c,
                                                   uint32_t port, bool both) {
  v1::Request r;
  r.mutable_mirror()->set_port(port);
  r.mutable_mirror()->set_both_directions(both);
  auto resp = co_await c->call(r);
  if (!resp.ok()) co_return resp.status();
  EXPECT_EQ(resp->subscribed().backend(), "tc");
  co_return resp->subscribed().subscription_id();
}

net::awaitable<absl::Status> unsubscribe(const std::shared_ptr<client::Client>& c, uint64_t id) {
  v1::Request r;
  r.mutable_unsubscribe()->set_subscription_id(id);
  auto resp = co_await c->call(r);
  co_return resp.status();
}

class MirrorServiceTest : public testing::Test {
 protected:
  void start(MirrorServiceOptions options = {}) {
    AgentConfig config;
    config.token = kToken;
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    auto capture = capture_;
    agent_.start(config, std::make_unique<RealProcFs>(), spec, [capture, options](Server& server) {
      auto service = makeMirrorService(
          server.serviceContext(),
          [capture](std::function<void(std::vector<MirrorEvent>)> deliver,
                     std::shared_ptr<MirrorEngineState>)
              -> absl::StatusOr<std::unique_ptr<MirrorSource>> {
            if (capture->fail_start) {
              return protoError(v1::PERMISSION_DENIED, "the fake kernel says no");
            }
            capture->record("start");
            {
              std::lock_guard<std::mutex> l(capture->mu);
              capture->deliver = std::move(deliver);
            }
            return std::unique_ptr<MirrorSource>(new FakeSource(capture));
          },
          options);
      server.services().addRequest(v1::Request::kMirror, service);
      server.services().routeUnsubscribe();
    });
  }

  // A connected client that accepts every stream the agent opens.
  struct Mirrorer {
    std::shared_ptr<client::Client> client;
    std::shared_ptr<Streams> streams;
  };
  net::awaitable<Mirrorer> connected(const asio::any_io_executor& ex) {
    client::ClientOptions o;
    o.endpoints = {agent_.address()};
    o.token = kToken;
    Mirrorer m{client::Client::create(ex, o), nullptr};
    m.streams = acceptAll(m.client, ex);
    EXPECT_TRUE((co_await m.client->connect()).ok());
    co_return m;
  }

  std::shared_ptr<FakeCapture> capture_ = std::make_shared<FakeCapture>();
  fakes::InProcessAgent agent_;
};

TEST_F(MirrorServiceTest, ConnectionArrivesAsRecordsGapsAndEndsInOrder) {
  start();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto [both, both_streams] = co_await connected(ex);
    auto [requests, request_streams] = co_await connected(ex);
    auto a = co_await subscribe(both, 80, true);
    auto b = co_await subscribe(requests, 80, false);
    EXPECT_TRUE(a.ok() && b.ok());
    EXPECT_NE(*a, *b);
    // One source, the port added once.
    EXPECT_EQ(capture_->count("start"), 1u);
    EXPECT_EQ(capture_->count("add 80"), 1u);

    const ConnectionInfo c = connection(7, 40000, 80);
    capture_->push({opened(c), data(7, kUp, "GET / HTTP/1.1\r\n\r\n"),
                    data(7, kDown, "HTTP/1.1 200 OK\r\n"), gap(7, kDown, 100),
                    data(7, kDown, "tail"), ended(7, kUp), ended(7, kDown),
                    closed(7, CloseReason::kFin)});
    // Another port's connection reaches nobody.
    capture_->push({opened(connection(8, 40001, 81)), data(8, kUp, "x")});

    EXPECT_TRUE(co_await waitStreams(*both_streams, 1));
    EXPECT_TRUE(co_await waitStreams(*request_streams, 1));
    if (both_streams->got.empty() || request_streams->got.empty()) co_return;
    const v1::StreamOpen& open = both_streams->got[0].second;
    EXPECT_TRUE(open.has_mirrored());
    EXPECT_EQ(open.mirrored().subscription_id(), *a);
    EXPECT_EQ(open.mirrored().source().ip(), "10.0.0.2");
    EXPECT_EQ(open.mirrored().source().port(), 40000u);
    EXPECT_EQ(open.mirrored().destination().port(), 80u);
    EXPECT_FALSE(open.mirrored().started_mid_stream());

    Transcript t = co_await readAll(both_streams->got[0].first);
    EXPECT_TRUE(t.end.ok()) << t.end;
    EXPECT_EQ(t.up, "GET / HTTP/1.1\r\n\r\n");
    EXPECT_EQ(t.down, "HTTP/1.1 200 OK\r\ntail");
    EXPECT_EQ(t.down_gap, 100u);
    EXPECT_EQ(t.order, "UDGDud");
    EXPECT_TRUE(t.up_fin && t.down_fin);

    // Without both_directions: the client's bytes and their end only.
    Transcript r = co_await readAll(request_streams->got[0].first);
    EXPECT_TRUE(r.end.ok()) << r.end;
    EXPECT_EQ(r.up, "GET / HTTP/1.1\r\n\r\n");
    EXPECT_EQ(r.down, "");
    EXPECT_EQ(r.down_gap, 0u);
    EXPECT_EQ(r.order, "Uu");
    EXPECT_EQ(request_streams->got.size(), 1u);

    // Every record handed over was released back to the source.
    size_t total = 0;
    for (auto s : {"GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\n", "tail", "x"}) {
      total += std::string_view(s).size() + 1;
    }
    EXPECT_TRUE(co_await eventually([&] { return capture_->released.load() == total; }))
        << capture_->released.load() << " of " << total;
    both->close();
    requests->close();
  });
}

TEST_F(MirrorServiceTest, ResetsAndTimeoutsEndTheStreamWithTheirReason) {
  start();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto [c, streams] = co_await connected(ex);
    EXPECT_TRUE((co_await subscribe(c, 80, true)).ok());
    capture_->push({opened(connection(1, 40000, 80)), data(1, kUp, "abc"),
                    closed(1, CloseReason::kReset), opened(connection(2, 40001, 80)),
                    closed(2, CloseReason::kIdle)});
    EXPECT_TRUE(co_await waitStreams(*streams, 2));
    if (streams->got.size() < 2) co_return;
    Transcript reset = co_await readAll(streams->got[0].first);
    EXPECT_EQ(reset.up, "abc");  // the bytes before the reset still arrive
    EXPECT_EQ(errorCodeOf(reset.end), v1::ERRNO) << reset.end;
    EXPECT_NE(reset.end.message().find("reset"), absl::string_view::npos) << reset.end;
    Transcript idle = co_await readAll(streams->got[1].first);
    EXPECT_EQ(errorCodeOf(idle.end), v1::TIMEOUT) << idle.end;
    c->close();
  });
}

// A subscription that comes while a connection is open joins it on its next
// event, flagged; one that came first is not.
TEST_F(MirrorServiceTest, LateSubscriptionJoinsOpenConnectionsMidStream) {
  start();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto [early, early_streams] = co_await connected(ex);
    auto [late, late_streams] = co_await connected(ex);
    EXPECT_TRUE((co_await subscribe(early, 80, false)).ok());
    capture_->push({opened(connection(3, 40000, 80)), data(3, kUp, "before ")});
    EXPECT_TRUE(co_await waitStreams(*early_streams, 1));
    EXPECT_TRUE((co_await subscribe(late, 80, false)).ok());
    capture_->push({data(3, kUp, "after"), ended(3, kUp), closed(3, CloseReason::kFin)});
    EXPECT_TRUE(co_await waitStreams(*late_streams, 1));
    if (early_streams->got.empty() || late_streams->got.empty()) co_return;
    EXPECT_FALSE(early_streams->got[0].second.mirrored().started_mid_stream());
    EXPECT_TRUE(late_streams->got[0].second.mirrored().started_mid_stream());
    EXPECT_EQ((co_await readAll(early_streams->got[0].first)).up, "before after");
    EXPECT_EQ((co_await readAll(late_streams->got[0].first)).up, "after");
    early->close();
    late->close();
  });
}

// A client that does not read loses bytes for itself only, and is told
// exactly how many: delivered + gaps == what was mirrored. The reading
// client of the same port gets everything.
TEST_F(MirrorServiceTest, SlowClientLosesOnlyItsOwnCopyAndGapsAddUp) {
  MirrorServiceOptions options;
  options.subscription_buffer = 256 << 10;
  start(options);
  constexpr size_t kChunk = 16 << 10;
  constexpr size_t kChunks = 512;  // 8 MiB: far above window + budget
  const std::string payload = randomBytes(kChunk * kChunks, 9);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto [slow, slow_streams] = co_await connected(ex);
    auto [fast, fast_streams] = co_await connected(ex);
    EXPECT_TRUE((co_await subscribe(slow, 80, false)).ok());
    EXPECT_TRUE((co_await subscribe(fast, 80, false)).ok());
    capture_->push({opened(connection(5, 40000, 80))});
    EXPECT_TRUE(co_await waitStreams(*fast_streams, 1));
    EXPECT_TRUE(co_await waitStreams(*slow_streams, 1));
    if (fast_streams->got.empty() || slow_streams->got.empty()) co_return;

    // The fast one reads as it comes; the slow one reads nothing until the
    // whole transfer was handed over.
    Transcript fast_t;
    bool fast_done = false;
    size_t fast_received = 0;
    asio::co_spawn(
        ex,
        // The streams by init-capture: clang 14 cannot capture a structured
        // binding implicitly.
        [&, streams = fast_streams]() -> net::awaitable<void> {
          fast_t = co_await readAll(streams->got[0].first, &fast_received);
          fast_done = true;
        },
        asio::detached);
    for (size_t i = 0; i < kChunks; ++i) {
      capture_->push({data(5, kUp, std::string_view(payload).substr(i * kChunk, kChunk))});
      // Paced like traffic the fast reader keeps up with: every 8 chunks
      // (128 KiB) the source waits until the service took them and the fast
      // reader is within 64 KiB of them, so it never holds more than 192 KiB
      // of its 256 KiB budget however the machine schedules it. (Pacing on
      // the source alone let a descheduled reader fall behind and gap on a
      // loaded machine.) The slow one reads nothing and must gap.
      if (i % 8 == 7) {
        EXPECT_TRUE(co_await eventually([&] {
          return capture_->released.load() >= (i + 1) * (kChunk + 1) &&
                 fast_received + (64 << 10) >= (i + 1) * kChunk;
        }));
      }
    }
    capture_->push({ended(5, kUp), closed(5, CloseReason::kFin)});
    EXPECT_TRUE(co_await eventually([&] { return fast_done; }));
    Transcript slow_t = co_await readAll(slow_streams->got[0].first);

    EXPECT_TRUE(fast_t.end.ok()) << fast_t.end;
    EXPECT_EQ(fast_t.up_gap, 0u);
    EXPECT_TRUE(fast_t.up == payload) << fast_t.up.size() << " of " << payload.size();

    EXPECT_TRUE(slow_t.end.ok()) << slow_t.end;
    EXPECT_GT(slow_t.up_gap, 0u);
    EXPECT_EQ(slow_t.up.size() + slow_t.up_gap, payload.size());
    // What did arrive is the payload's beginning, byte for byte, and the
    // rest, if any, its tail after the holes (checked by prefix here).
    EXPECT_TRUE(payload.compare(0, std::min<size_t>(slow_t.up.size(), 256 << 10), slow_t.up, 0,
                                std::min<size_t>(slow_t.up.size(), 256 << 10)) == 0);
    slow->close();
    fast->close();
  });
}

TEST_F(MirrorServiceTest, UnsubscribeEndsStreamsAndTheLastOneStopsTheSource) {
  start();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto [a, a_streams] = co_await connected(ex);
    auto b = (co_await connected(ex)).client;
    auto ida = co_await subscribe(a, 80, false);
    auto idb = co_await subscribe(b, 80, false);
    auto idc = co_await subscribe(b, 443, false);
    EXPECT_TRUE(ida.ok() && idb.ok() && idc.ok());
    // Not yours, or no such subscription: NOT_FOUND.
    EXPECT_EQ(errorCodeOf(co_await unsubscribe(a, *idb)), v1::NOT_FOUND);
    EXPECT_EQ(errorCodeOf(co_await unsubscribe(a, 999)), v1::NOT_FOUND);

    capture_->push({opened(connection(9, 40000, 80)), data(9, kUp, "hello")});
    EXPECT_TRUE(co_await waitStreams(*a_streams, 1));
    EXPECT_TRUE((co_await unsubscribe(a, *ida)).ok());
    if (!a_streams->got.empty()) {
      Transcript t = co_await readAll(a_streams->got[0].first);
      EXPECT_EQ(errorCodeOf(t.end), v1::CANCELLED) << t.end;
    }
    // b still mirrors 80: the port stays.
    EXPECT_FALSE(capture_->saw("remove 80"));
    EXPECT_TRUE((co_await unsubscribe(b, *idb)).ok());
    EXPECT_TRUE(co_await eventually([&] { return capture_->saw("remove 80"); }));
    EXPECT_FALSE(capture_->saw("stop"));
    // b's session ends: its last port goes, and with it the source.
    b->close();
    EXPECT_TRUE(co_await eventually([&] { return capture_->saw("stop"); }));
    EXPECT_TRUE(capture_->saw("remove 443"));
    // A new subscription starts a new source.
    EXPECT_TRUE((co_await subscribe(a, 80, false)).ok());
    EXPECT_EQ(capture_->count("start"), 2u);
    a->close();
  });
}

// The source copies a port's server->client bytes only while a
// subscription of the port wants them (--both): told at each subscribe,
// and when the last such subscription goes while others stay.
TEST_F(MirrorServiceTest, TheSourceIsToldWhetherAnyoneWantsTheServersBytes) {
  start();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto a = (co_await connected(ex)).client;
    auto b = (co_await connected(ex)).client;
    auto one_way = co_await subscribe(a, 80, false);
    EXPECT_TRUE(one_way.ok());
    EXPECT_TRUE(co_await eventually([&] { return capture_->saw("no s2c 80"); }));
    EXPECT_FALSE(capture_->saw("s2c 80"));
    auto both = co_await subscribe(b, 80, true);
    EXPECT_TRUE(both.ok());
    EXPECT_TRUE(co_await eventually([&] { return capture_->saw("s2c 80"); }));
    // The one-way subscription goes: the other still wants them.
    EXPECT_TRUE((co_await unsubscribe(a, *one_way)).ok());
    EXPECT_EQ(capture_->count("no s2c 80"), 1u);
    auto again = co_await subscribe(a, 80, false);
    EXPECT_TRUE(again.ok());
    EXPECT_TRUE(co_await eventually([&] { return capture_->count("s2c 80") == 2; }));
    // The --both one goes, the one-way one stays: no longer wanted.
    EXPECT_TRUE((co_await unsubscribe(b, *both)).ok());
    EXPECT_TRUE(co_await eventually([&] { return capture_->count("no s2c 80") == 2; }));
    EXPECT_FALSE(capture_->saw("remove 80"));
    a->close();
    b->close();
  });
}

// A drain does not wait for mirrors: they hold nothing the application
// needs. Their streams end at once with AGENT_DRAINING and the program is
// unloaded.
TEST_F(MirrorServiceTest, DrainEndsMirroredStreamsAtOnce) {
  start();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto [c, streams] = co_await connected(ex);
    EXPECT_TRUE((co_await subscribe(c, 80, true)).ok());
    capture_->push({opened(connection(4, 40000, 80)), data(4, kUp, "in flight")});
    EXPECT_TRUE(co_await waitStreams(*streams, 1));
    if (streams->got.empty()) co_return;
    // The drain once the bytes arrived (before, they may still wait at the
    // agent for the stream's acceptance: the next test).
    auto first = co_await streams->got[0].first->readEvent();
    EXPECT_TRUE(first.ok() && first->has_value()) << first.status();
    if (!first.ok() || !first->has_value()) co_return;
    EXPECT_EQ((*first)->data, std::string(1, static_cast<char>(v1::CLIENT_TO_SERVER)) + "in flight");
    agent_.server().requestDrain("test");
    Transcript t = co_await readAll(streams->got[0].first);
    EXPECT_EQ(t.up, "");
    EXPECT_EQ(errorCodeOf(t.end), v1::AGENT_DRAINING) << t.end;
    EXPECT_EQ(t.end.message().find("not delivered"), absl::string_view::npos) << t.end;
    EXPECT_TRUE(co_await eventually([&] { return capture_->saw("stop"); }));
    c->close();
  });
}

// Bytes the agent still holds when a drain ends the stream (here: the
// client never accepts it, so nothing can be sent) are not lost silently:
// the reset says how many (and the service counts them as a gap).
TEST_F(MirrorServiceTest, ADrainCountsTheBytesItDidNotDeliver) {
  start();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    client::ClientOptions o;
    o.endpoints = {agent_.address()};
    o.token = kToken;
    auto c = client::Client::create(ex, o);
    auto held = std::make_shared<std::vector<std::shared_ptr<client::ClientStream>>>();
    c->setStreamAcceptor([held](std::shared_ptr<client::ClientStream> stream, v1::StreamOpen) {
      held->push_back(std::move(stream));  // never accepted
    });
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_TRUE((co_await subscribe(c, 80, false)).ok());
    capture_->push({opened(connection(6, 40000, 80)), data(6, kUp, "twelve bytes")});
    EXPECT_TRUE(co_await eventually([&] { return !held->empty(); }));
    EXPECT_TRUE(co_await eventually([&] { return capture_->released.load() > 0; }));
    if (held->empty()) co_return;
    agent_.server().requestDrain("test");
    auto ev = co_await held->front()->readEvent();
    EXPECT_FALSE(ev.ok());
    if (ev.ok()) co_return;
    EXPECT_EQ(errorCodeOf(ev.status()), v1::AGENT_DRAINING) << ev.status();
    EXPECT_NE(ev.status().message().find("12 mirrored bytes not delivered"),
              absl::string_view::npos)
        << ev.status();
    c->close();
  });
}

TEST_F(MirrorServiceTest, BadSubscriptionsAreRefused) {
  start();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto [c, streams] = co_await connected(ex);
    EXPECT_EQ(errorCodeOf((co_await subscribe(c, 0, false)).status()), v1::INVALID_ARGUMENT);
    EXPECT_EQ(errorCodeOf((co_await subscribe(c, 70000, false)).status()), v1::INVALID_ARGUMENT);
    capture_->fail_start = true;
    auto failed = co_await subscribe(c, 80, false);
    EXPECT_EQ(errorCodeOf(failed.status()), v1::PERMISSION_DENIED) << failed.status();
    EXPECT_NE(failed.status().message().find("mirror port 80"), absl::string_view::npos)
        << failed.status();
    capture_->fail_start = false;
    EXPECT_TRUE((co_await subscribe(c, 80, false)).ok());
    c->close();
  });
}

}  // namespace
}  // namespace siphon::agent::mirror
