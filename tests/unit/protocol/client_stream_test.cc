// ClientStream with streams the agent opens for a mirror: records and gaps
// reach readEvent() in the order they were sent, read() refuses to pass a
// gap, a sink never takes bytes from after a gap before the gap is read,
// and credit comes back whatever path the bytes took. The agent is a
// ScriptedAgent (tests/fakes), so the test says exactly which frames come.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "siphon/client/client.h"
#include "siphon/status.h"
#include "tests/fakes/run_coroutine.h"
#include "tests/fakes/scripted_agent.h"

namespace siphon::client {
namespace {

namespace asio = net::asio;
using fakes::ScriptedAgent;

constexpr uint64_t kAgentSubscription = 7;

// A record as the client reads it: the direction byte, then the bytes.
std::string record(v1::Direction d, std::string_view bytes) {
  return std::string(1, static_cast<char>(d)) + std::string(bytes);
}

template <typename F>
void run(F body) {
  fakes::runCoroutine(std::move(body));
}

// A client subscribed to a mirror on a scripted agent, and the first stream
// the agent opens for it.
struct MirrorSetup {
  std::shared_ptr<ScriptedAgent> agent;
  std::shared_ptr<Client> client;
  std::shared_ptr<ClientStream> stream;
  v1::StreamOpen open;
  uint64_t agent_stream = 0;  // the stream's id, as the agent knows it
};

// Connects, subscribes, and has the agent open one mirrored stream; calls
// `before_accept(setup)` once the client has the stream and before it
// accepts it. Fills `setup`; on failure leaves setup.stream null.
net::awaitable<void> openMirror(asio::any_io_executor ex, MirrorSetup& setup,
                                std::function<void(MirrorSetup&)> before_accept) {
  setup.agent = std::make_shared<ScriptedAgent>(ex);
  ScriptedAgent& agent = *setup.agent;
  asio::co_spawn(
      ex, [a = setup.agent]() { return a->serve(); }, asio::detached);
  agent.on_request = [&agent](v1::Request r) {
    v1::Response response;
    response.set_request_id(r.request_id());
    response.mutable_subscribed()->set_subscription_id(kAgentSubscription);
    response.mutable_subscribed()->set_backend("tc");
    EXPECT_TRUE(r.has_mirror());
    agent.session().sendResponse(std::move(response));
    agent.wake();
  };

  ClientOptions options;
  options.endpoints = {agent.address()};
  options.reconnect = false;
  setup.client = Client::create(ex, options);
  absl::Status connected = co_await setup.client->connect();
  EXPECT_TRUE(connected.ok()) << connected;
  if (!connected.ok()) co_return;
  net::Signal opened(ex);
  setup.client->setStreamAcceptor([&](std::shared_ptr<ClientStream> stream, v1::StreamOpen open) {
    setup.stream = std::move(stream);
    setup.open = std::move(open);
    opened.notify();
  });
  v1::Request subscribe;
  subscribe.mutable_mirror()->set_port(80);
  subscribe.mutable_mirror()->set_both_directions(true);
  auto subscribed = co_await setup.client->call(subscribe);
  EXPECT_TRUE(subscribed.ok()) << subscribed.status();
  if (!subscribed.ok()) co_return;

  setup.agent_stream = agent.openMirrored(kAgentSubscription, /*mid_stream=*/true);
  while (!setup.stream) co_await opened.wait();
  setup.client->setStreamAcceptor(nullptr);
  if (before_accept) before_accept(setup);
  net::Signal accepted(ex);
  bool was_accepted = false;
  agent.on_accept = [&](v1::StreamAccept) {
    was_accepted = true;
    accepted.notify();
  };
  absl::Status s = setup.client->acceptStream(*setup.stream);
  EXPECT_TRUE(s.ok()) << s;
  while (!was_accepted) co_await accepted.wait();
  agent.on_accept = nullptr;
}

// The events of `stream` until its end, as text: "data <dir> <bytes>",
// "gap <dir> <bytes>", then "end" or "error <CODE>".
net::awaitable<std::vector<std::string>> drain(std::shared_ptr<ClientStream> stream_in) {
  const std::shared_ptr<ClientStream> stream = std::move(stream_in);
  std::vector<std::string> out;
  while (true) {
    auto event = co_await stream->readEvent();
    if (!event.ok()) {
      out.push_back(absl::StrCat("error ", errorCodeName(errorCodeOf(event.status()))));
      break;
    }
    if (!*event) {
      out.push_back("end");
      break;
    }
    if ((*event)->gap) {
      out.push_back(absl::StrCat("gap ", (*event)->gap->direction(), " ", (*event)->gap->bytes()));
    } else {
      const std::string& d = (*event)->data;
      out.push_back(absl::StrCat("data ", d.empty() ? -1 : int(d[0]), " ", d.substr(1)));
    }
  }
  co_return out;
}

TEST(ClientStreamTest, RecordsAndGapsArriveInOrderUnderTheClientsSubscriptionId) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    MirrorSetup m;
    co_await openMirror(ex, m, [](MirrorSetup& s) {
      // Before the accept: a gap needs no credit, so the agent may send it
      // now; it waits in the stream.
      EXPECT_TRUE(s.agent->sendGap(s.agent_stream, v1::CLIENT_TO_SERVER, 10).ok());
    });
    EXPECT_TRUE(m.stream);
    if (!m.stream) co_return;
    EXPECT_TRUE(m.open.has_mirrored());
    EXPECT_EQ(m.open.mirrored().subscription_id(), kAgentSubscription);
    EXPECT_TRUE(m.open.mirrored().started_mid_stream());
    EXPECT_EQ(m.open.mirrored().source().port(), 51234u);

    ScriptedAgent& a = *m.agent;
    const uint64_t id = m.agent_stream;
    EXPECT_TRUE(a.sendRecord(id, v1::CLIENT_TO_SERVER, "GET / HTTP/1.1\r\n").ok());
    EXPECT_TRUE(a.sendGap(id, v1::CLIENT_TO_SERVER, 12345).ok());
    EXPECT_TRUE(a.sendRecord(id, v1::CLIENT_TO_SERVER, "\r\n").ok());
    EXPECT_TRUE(a.sendRecord(id, v1::SERVER_TO_CLIENT, "HTTP/1.1 200 OK").ok());
    EXPECT_TRUE(a.sendGap(id, v1::SERVER_TO_CLIENT, 7).ok());
    EXPECT_TRUE(a.sendRecord(id, v1::CLIENT_TO_SERVER, "").ok());  // the client's FIN
    EXPECT_TRUE(a.sendRecord(id, v1::SERVER_TO_CLIENT, "").ok());
    EXPECT_TRUE(a.session().halfClose(id).ok());
    // Nothing can follow the half-close, gaps included.
    EXPECT_EQ(errorCodeOf(a.sendGap(id, v1::SERVER_TO_CLIENT, 1)), v1::STREAM_CLOSED);

    auto events = co_await drain(m.stream);
    EXPECT_EQ(events, (std::vector<std::string>{
                          "gap 1 10",
                          "data 1 GET / HTTP/1.1\r\n",
                          "gap 1 12345",
                          "data 1 \r\n",
                          "data 2 HTTP/1.1 200 OK",
                          "gap 2 7",
                          "data 1 ",
                          "data 2 ",
                          "end",
                      }));
    // The end stays the end.
    auto again = co_await m.stream->readEvent();
    EXPECT_TRUE(again.ok() && !*again);
    m.client->close();
    a.close();
  });
}

TEST(ClientStreamTest, ReadStopsAtAGapAndLeavesItForReadEvent) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    MirrorSetup m;
    co_await openMirror(ex, m, nullptr);
    if (!m.stream) co_return;
    ScriptedAgent& a = *m.agent;
    EXPECT_TRUE(a.sendRecord(m.agent_stream, v1::CLIENT_TO_SERVER, "one").ok());
    EXPECT_TRUE(a.sendGap(m.agent_stream, v1::CLIENT_TO_SERVER, 99).ok());
    EXPECT_TRUE(a.sendRecord(m.agent_stream, v1::CLIENT_TO_SERVER, "two").ok());

    auto first = co_await m.stream->read();
    EXPECT_TRUE(first.ok() && *first && **first == record(v1::CLIENT_TO_SERVER, "one"));
    for (int i = 0; i < 2; ++i) {  // every read() says it, none passes it
      auto r = co_await m.stream->read();
      EXPECT_EQ(errorCodeOf(r.status()), v1::FAILED_PRECONDITION) << r.status();
      EXPECT_NE(r.status().message().find("99 bytes client->server"), absl::string_view::npos)
          << r.status();
    }
    auto gap = co_await m.stream->readEvent();
    EXPECT_TRUE(gap.ok() && *gap && (*gap)->gap && (*gap)->gap->bytes() == 99u);
    auto second = co_await m.stream->read();
    EXPECT_TRUE(second.ok() && *second && **second == record(v1::CLIENT_TO_SERVER, "two"));
    m.client->close();
    a.close();
  });
}

// A sink takes payloads only while nothing is queued: a queued gap holds
// back the payloads after it, as queued data does.
TEST(ClientStreamTest, ASinkNeverGetsBytesFromAfterAnUnreadGap) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    MirrorSetup m;
    std::vector<std::string> sunk;
    size_t take_limit = std::string::npos;  // how much the sink takes of each payload
    net::Signal sink_called(ex);
    co_await openMirror(ex, m, [&](MirrorSetup& s) {
      s.stream->setSink([&](std::string_view payload) {
        size_t n = std::min(take_limit, payload.size());
        sunk.emplace_back(payload.substr(0, n));
        sink_called.notify();
        return n;
      });
    });
    if (!m.stream) co_return;
    ScriptedAgent& a = *m.agent;
    const uint64_t id = m.agent_stream;
    const auto c2s = v1::CLIENT_TO_SERVER;

    // The sink takes all of r1; the gap queues; r2 and r3 queue behind it.
    EXPECT_TRUE(a.sendRecord(id, c2s, "r1").ok());
    EXPECT_TRUE(a.sendGap(id, c2s, 5).ok());
    EXPECT_TRUE(a.sendRecord(id, c2s, "r2").ok());
    EXPECT_TRUE(a.sendRecord(id, c2s, "r3").ok());
    auto e1 = co_await m.stream->readEvent();
    EXPECT_TRUE(e1.ok() && *e1 && (*e1)->gap && (*e1)->gap->bytes() == 5u);
    EXPECT_EQ(sunk, (std::vector<std::string>{record(c2s, "r1")}));
    auto e2 = co_await m.stream->readEvent();
    EXPECT_TRUE(e2.ok() && *e2 && (*e2)->data == record(c2s, "r2"));
    auto e3 = co_await m.stream->readEvent();
    EXPECT_TRUE(e3.ok() && *e3 && (*e3)->data == record(c2s, "r3"));
    EXPECT_EQ(sunk.size(), 1u);

    // The queue is empty again: the sink is offered the next payload. It
    // takes 2 bytes; the rest queues, then a gap and r5 behind it.
    take_limit = 2;
    EXPECT_TRUE(a.sendRecord(id, c2s, "r4-rest").ok());
    EXPECT_TRUE(a.sendGap(id, c2s, 6).ok());
    EXPECT_TRUE(a.sendRecord(id, c2s, "r5").ok());
    while (sunk.size() < 2) co_await sink_called.wait();
    EXPECT_EQ(sunk[1], record(c2s, "r"));
    auto e4 = co_await m.stream->readEvent();
    EXPECT_TRUE(e4.ok() && *e4 && (*e4)->data == "4-rest");
    auto e5 = co_await m.stream->readEvent();
    EXPECT_TRUE(e5.ok() && *e5 && (*e5)->gap && (*e5)->gap->bytes() == 6u);
    auto e6 = co_await m.stream->readEvent();
    EXPECT_TRUE(e6.ok() && *e6 && (*e6)->data == record(c2s, "r5"));
    EXPECT_EQ(sunk.size(), 2u);
    m.client->close();
    a.close();
  });
}

// Credit comes back for every byte, whether a sink took it or readEvent()
// did, with gaps in between: 4 of the largest windows' worth get through.
// Were the bytes readEvent() takes not returned, the agent would run out of
// credit and the test time out.
TEST(ClientStreamTest, CreditComesBackThroughSinkAndReadEventAroundGaps) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    MirrorSetup m;
    uint64_t sunk = 0;
    uint64_t calls = 0;
    co_await openMirror(ex, m, [&](MirrorSetup& s) {
      // Every third payload the sink refuses: it and what follows queue.
      s.stream->setSink([&](std::string_view payload) -> size_t {
        if (++calls % 3 == 0) return 0;
        sunk += payload.size();
        return payload.size();
      });
    });
    if (!m.stream) co_return;
    ScriptedAgent& a = *m.agent;
    const uint64_t id = m.agent_stream;
    const uint64_t total = 4 * uint64_t{protocol::SessionLimits{}.max_stream_window};
    const std::string chunk(8191, 'x');  // plus the direction byte: 8 KiB records

    // The agent sends as its credit allows, a gap after every 5th record.
    uint64_t sent = 0, records = 0, gaps = 0;
    net::Signal writable(ex);
    a.on_writable = [&](uint64_t) { writable.notify(); };
    auto sender = [&]() -> net::awaitable<void> {
      while (sent < total) {
        size_t credit = a.session().sendCredit(id, chunk.size() + 1);
        if (credit < chunk.size() + 1) {
          co_await writable.wait(asio::steady_timer::clock_type::now() +
                                 std::chrono::milliseconds(50));
          continue;
        }
        EXPECT_TRUE(a.sendRecord(id, v1::CLIENT_TO_SERVER, chunk).ok());
        sent += chunk.size() + 1;
        if (++records % 5 == 0) {
          EXPECT_TRUE(a.sendGap(id, v1::CLIENT_TO_SERVER, records).ok());
          ++gaps;
        }
      }
      EXPECT_TRUE(a.session().halfClose(id).ok());
      a.wake();
    };
    asio::co_spawn(ex, sender, asio::detached);

    uint64_t read = 0, gaps_read = 0, gap_sum = 0, last_gap = 0;
    while (true) {
      auto e = co_await m.stream->readEvent();
      EXPECT_TRUE(e.ok()) << e.status();
      if (!e.ok() || !*e) break;
      if ((*e)->gap) {
        ++gaps_read;
        gap_sum += (*e)->gap->bytes();
        EXPECT_GT((*e)->gap->bytes(), last_gap);  // in the order sent
        last_gap = (*e)->gap->bytes();
      } else {
        read += (*e)->data.size();
      }
    }
    EXPECT_EQ(sent, total);
    EXPECT_EQ(read + sunk, total);
    EXPECT_GT(sunk, 0u);
    EXPECT_GT(read, 0u);
    EXPECT_EQ(gaps_read, gaps);
    EXPECT_EQ(gap_sum, 5 * gaps * (gaps + 1) / 2);
    m.client->close();
    a.close();
  });
}

TEST(ClientStreamTest, AResetEndsReadEventWithThePeersCode) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    MirrorSetup m;
    co_await openMirror(ex, m, nullptr);
    if (!m.stream) co_return;
    ScriptedAgent& a = *m.agent;
    EXPECT_TRUE(a.sendRecord(m.agent_stream, v1::CLIENT_TO_SERVER, "x").ok());
    EXPECT_TRUE(a.sendGap(m.agent_stream, v1::CLIENT_TO_SERVER, 3).ok());
    v1::Error error;
    error.set_code(v1::TIMEOUT);
    error.set_message("idle");
    a.session().resetStream(m.agent_stream, error);
    a.wake();
    auto events = co_await drain(m.stream);
    // What came before the reset is still read, then the reset.
    EXPECT_EQ(events, (std::vector<std::string>{"data 1 x", "gap 1 3", "error TIMEOUT"}));
    m.client->close();
    a.close();
  });
}

// Polls until `weak` has expired, for up to 10 s (a hang guard).
net::awaitable<bool> expires(const std::weak_ptr<Client>& weak) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  for (int i = 0; i < 1000 && !weak.expired(); ++i) {
    t.expires_after(std::chrono::milliseconds(10));
    co_await t.async_wait(net::use_awaitable);
  }
  co_return weak.expired();
}

// A handler usually holds what holds its client: here the acceptor keeps
// the stream it was given, and the stream keeps its client. The client
// drops its handlers when it is closed, or lost for good, so neither way is
// the client kept forever.
TEST(ClientStreamTest, AClosedOrLostClientDropsItsHandlersAndIsFreed) {
  for (const bool close : {true, false}) {
    SCOPED_TRACE(close ? "closed" : "lost");
    run([close](asio::any_io_executor ex) -> net::awaitable<void> {
      MirrorSetup m;
      co_await openMirror(ex, m, nullptr);
      if (!m.stream) co_return;
      auto held = std::make_shared<std::vector<std::shared_ptr<ClientStream>>>();
      held->push_back(std::move(m.stream));
      m.client->setStreamAcceptor(
          [held](std::shared_ptr<ClientStream> s, v1::StreamOpen) { held->push_back(s); });
      m.client->setLostHandler([held](const absl::Status&) {});
      const std::weak_ptr<Client> weak = m.client;
      if (close) {
        m.client->close();
      } else {
        m.agent->close();  // no reconnect (openMirror): lost for good
      }
      m.client.reset();
      held.reset();
      EXPECT_TRUE(co_await expires(weak)) << "the client outlived its close or loss";
      if (close) m.agent->close();
    });
  }
}

// After a failover the mirror is made again on the other agent under the
// same subscription id, and that agent's connections come as new streams.
// One that comes before the resubscription's answer waits (parked), with
// what was sent on it meanwhile, and is handed over under the client's id.
TEST(ClientStreamTest, AfterAFailoverTheNewAgentsMirrorStreamsArriveUnderTheSameId) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    auto a = std::make_shared<ScriptedAgent>(ex);
    auto b = std::make_shared<ScriptedAgent>(ex);
    asio::co_spawn(
        ex, [a]() { return a->serve(); }, asio::detached);
    asio::co_spawn(
        ex, [b]() { return b->serve(); }, asio::detached);
    std::vector<v1::Request> seen_by_b;
    auto answer = [](ScriptedAgent& agent, const v1::Request& r, uint64_t id) {
      v1::Response response;
      response.set_request_id(r.request_id());
      response.mutable_subscribed()->set_subscription_id(id);
      response.mutable_subscribed()->set_backend("tc");
      agent.session().sendResponse(std::move(response));
      agent.wake();
    };
    a->on_request = [&](v1::Request r) { answer(*a, r, kAgentSubscription); };
    b->on_request = [&](v1::Request r) {
      seen_by_b.push_back(r);
      // The new agent's first connection, and a gap on it, before its
      // answer to the resubscribe.
      uint64_t id = b->openMirrored(9);
      EXPECT_TRUE(b->sendGap(id, v1::CLIENT_TO_SERVER, 42).ok());
      answer(*b, r, 9);
    };

    ClientOptions options;
    options.endpoints = {a->address(), b->address()};
    auto c = Client::create(ex, options);
    absl::Status connected = co_await c->connect();
    EXPECT_TRUE(connected.ok()) << connected;
    if (!connected.ok()) co_return;
    std::vector<std::pair<std::shared_ptr<ClientStream>, v1::StreamOpen>> streams;
    net::Signal opened(ex);
    c->setStreamAcceptor([&](std::shared_ptr<ClientStream> s, v1::StreamOpen open) {
      streams.emplace_back(std::move(s), std::move(open));
      opened.notify();
    });
    std::optional<FailoverEvent> moved;
    c->setFailoverHandler([&](const FailoverEvent& e) {
      moved = e;
      opened.notify();
    });
    v1::Request subscribe;
    subscribe.mutable_mirror()->set_port(80);
    auto subscribed = co_await c->call(subscribe);
    EXPECT_TRUE(subscribed.ok()) << subscribed.status();
    if (!subscribed.ok()) co_return;
    const uint64_t id = subscribed->subscribed().subscription_id();
    a->openMirrored(kAgentSubscription);
    while (streams.empty()) co_await opened.wait();
    EXPECT_TRUE(c->acceptStream(*streams[0].first).ok());

    a->close();  // the agent is gone: refused from now on
    const auto deadline = asio::steady_timer::clock_type::now() + std::chrono::seconds(10);
    while ((!moved || streams.size() < 2) && asio::steady_timer::clock_type::now() < deadline) {
      co_await opened.wait(deadline);
    }
    EXPECT_TRUE(moved.has_value());
    EXPECT_EQ(streams.size(), 2u);
    if (!moved || streams.size() < 2) co_return;
    EXPECT_EQ(moved->subscriptions.size(), 1u);
    EXPECT_EQ(seen_by_b.size(), 1u);
    if (moved->subscriptions.size() != 1 || seen_by_b.size() != 1) co_return;
    EXPECT_EQ(moved->subscriptions[0].first, id);
    EXPECT_TRUE(moved->subscriptions[0].second.ok());
    EXPECT_EQ(seen_by_b[0].mirror().port(), 80u);

    // The old agent's stream ends with the agent.
    auto old_end = co_await streams[0].first->readEvent();
    EXPECT_EQ(errorCodeOf(old_end.status()), v1::AGENT_LOST) << old_end.status();
    // The new one is the same subscription's, with what came while parked.
    EXPECT_EQ(streams[1].second.mirrored().subscription_id(), id);
    EXPECT_TRUE(c->acceptStream(*streams[1].first).ok());
    auto gap = co_await streams[1].first->readEvent();
    EXPECT_TRUE(gap.ok() && *gap && (*gap)->gap && (*gap)->gap->bytes() == 42u);
    c->close();
    b->close();
  });
}

}  // namespace
}  // namespace siphon::client
