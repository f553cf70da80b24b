// The typed subscriptions (siphon/client/subscriptions.h) against a scripted
// agent (tests/fakes/scripted_agent.h), which sends exactly the frames a
// test names: a mirror's stream arriving with its Subscribed answer, its
// records, gap and FINs as MirrorEvents; a stolen HTTP request as a
// Connection; the session's loss as events.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "siphon/client/client.h"
#include "siphon/client/subscriptions.h"
#include "siphon/client/target.h"
#include "siphon/status.h"
#include "tests/fakes/run_coroutine.h"
#include "tests/fakes/scripted_agent.h"

namespace siphon::client {
namespace {

namespace asio = net::asio;
using fakes::ScriptedAgent;

constexpr uint64_t kAgentSubscription = 7;

template <typename F>
void run(F body) {
  fakes::runCoroutine(std::move(body));
}

// Answers every subscribe with kAgentSubscription, then calls `after(r)`.
void answerSubscribes(ScriptedAgent& agent, std::function<void(const v1::Request&)> after) {
  agent.on_request = [&agent, after](v1::Request r) {
    v1::Response response;
    response.set_request_id(r.request_id());
    response.mutable_subscribed()->set_subscription_id(kAgentSubscription);
    response.mutable_subscribed()->set_backend("tc");
    agent.session().sendResponse(std::move(response));
    agent.wake();
    if (after) after(r);
  };
}

TargetOptions optionsFor(const ScriptedAgent& agent) {
  TargetOptions o;
  o.endpoints = {agent.address()};
  o.reconnect = false;
  return o;
}

std::string describe(const MirrorEvent& e) {
  const char* dir = e.direction == Direction::kClientToServer   ? "c>s"
                    : e.direction == Direction::kServerToClient ? "s>c"
                                                                : "?";
  switch (e.kind) {
    case MirrorEvent::Kind::kData:
      return std::string("data ") + dir + " " + e.bytes;
    case MirrorEvent::Kind::kFin:
      return std::string("fin ") + dir;
    case MirrorEvent::Kind::kGap:
      return std::string("gap ") + dir + " " + std::to_string(e.gap_bytes);
  }
  return "?";
}

// The mirror's stream comes right behind its answer (before the caller of
// mirror() has its Subscription): it waits there, and its records, gap and
// ends come out as MirrorEvents in order.
TEST(TypedSubscriptionsTest, AMirrorsConnectionAndItsEventsInOrder) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    auto agent = std::make_shared<ScriptedAgent>(ex);
    asio::co_spawn(
        ex, [agent]() { return agent->serve(); }, asio::detached);
    uint64_t stream_id = 0;
    answerSubscribes(*agent, [&](const v1::Request& r) {
      EXPECT_TRUE(r.has_mirror() && r.mirror().both_directions());
      stream_id = agent->openMirrored(kAgentSubscription, /*mid_stream=*/true);
    });
    net::Signal accepted(ex);
    bool was_accepted = false;
    agent->on_accept = [&](v1::StreamAccept) {
      was_accepted = true;
      accepted.notify();
    };

    Target target = Target::create(ex, optionsFor(*agent));
    EXPECT_TRUE((co_await target.connect()).ok());
    Subscriptions subscriptions(target);
    MirrorSpec spec{80, true};
    auto sub = co_await subscriptions.mirror(spec);
    EXPECT_TRUE(sub.ok()) << sub.status();
    if (!sub.ok()) co_return;
    EXPECT_EQ(sub->id(), kAgentSubscription) << "the first session's ids are the agent's";
    EXPECT_EQ(sub->backend(), "tc");

    auto event = co_await sub->next();
    EXPECT_TRUE(event.ok()) << event.status();
    if (!event.ok()) co_return;
    EXPECT_EQ(event->kind, SubscriptionEvent::Kind::kMirrored);
    EXPECT_EQ(event->source.text(), "10.0.0.2:51234");
    EXPECT_EQ(event->destination.text(), "10.0.0.1:80");
    EXPECT_TRUE(event->mirrored.startedMidStream());
    while (!was_accepted) co_await accepted.wait();

    EXPECT_TRUE(agent->sendRecord(stream_id, v1::CLIENT_TO_SERVER, "GET /").ok());
    EXPECT_TRUE(agent->sendGap(stream_id, v1::SERVER_TO_CLIENT, 42).ok());
    EXPECT_TRUE(agent->sendRecord(stream_id, v1::SERVER_TO_CLIENT, "200").ok());
    EXPECT_TRUE(agent->sendRecord(stream_id, v1::CLIENT_TO_SERVER, "").ok());
    EXPECT_TRUE(agent->session().halfClose(stream_id).ok());
    agent->wake();

    std::vector<std::string> seen;
    MirroredConnection mirrored = event->mirrored;
    while (true) {
      auto e = co_await mirrored.next();
      EXPECT_TRUE(e.ok()) << e.status();
      if (!e.ok() || !e->has_value()) break;
      seen.push_back(describe(**e));
    }
    EXPECT_EQ(seen, (std::vector<std::string>{"data c>s GET /", "gap s>c 42", "data s>c 200",
                                              "fin c>s"}));
    target.close();
  });
}

// A filtered steal's request is a Connection: the request's bytes in, one
// response out. Then the agent goes: the subscription and the Target hear it.
TEST(TypedSubscriptionsTest, AStolenRequestThenTheSessionsLoss) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    auto agent = std::make_shared<ScriptedAgent>(ex);
    asio::co_spawn(
        ex, [agent]() { return agent->serve(); }, asio::detached);
    answerSubscribes(*agent, nullptr);
    std::string response;
    uint64_t stream_id = 0;
    net::Signal accepted(ex);
    agent->on_accept = [&](v1::StreamAccept a) {
      stream_id = a.stream_id();
      accepted.notify();
    };

    Target target = Target::create(ex, optionsFor(*agent));
    std::vector<LinkEvent> link_events;
    target.setEventHandler([&](const LinkEvent& e) { link_events.push_back(e); });
    EXPECT_TRUE((co_await target.connect()).ok());
    Subscriptions subscriptions(target);
    StealSpec spec;
    spec.port = 8080;
    spec.filter = HttpFilter{{{"x-user", "^me$"}}, "", "", false};
    auto sub = co_await subscriptions.steal(spec);
    EXPECT_TRUE(sub.ok()) << sub.status();
    if (!sub.ok()) co_return;
    auto opened = agent->openStolenRequest(kAgentSubscription, "GET", "/hello");
    EXPECT_TRUE(opened.ok()) << opened.status();

    auto event = co_await sub->next();
    EXPECT_TRUE(event.ok()) << event.status();
    if (!event.ok()) co_return;
    EXPECT_EQ(event->kind, SubscriptionEvent::Kind::kRequest);
    EXPECT_EQ(event->request.method, "GET");
    EXPECT_EQ(event->request.path, "/hello");
    EXPECT_EQ(event->connection.kind(), Connection::Kind::kStolen);
    EXPECT_EQ(event->connection.remote().text(), "10.0.0.2:51234");
    while (stream_id == 0) co_await accepted.wait();

    // The agent's bytes (the request), then the program's answer.
    EXPECT_TRUE(agent->session().sendData(stream_id, "GET /hello HTTP/1.1\r\n\r\n").ok());
    agent->wake();
    auto request = co_await event->connection.read();
    EXPECT_TRUE(request.ok() && request->has_value()) << request.status();
    if (request.ok() && request->has_value()) {
      EXPECT_EQ(**request, "GET /hello HTTP/1.1\r\n\r\n");
    }
    EXPECT_TRUE((co_await event->connection.write("HTTP/1.1 204 No Content\r\n\r\n")).ok());

    agent->close();
    auto lost = co_await sub->next();
    EXPECT_TRUE(lost.ok()) << lost.status();
    if (lost.ok()) {
      EXPECT_EQ(lost->kind, SubscriptionEvent::Kind::kLost);
      EXPECT_EQ(errorCode(lost->status), ErrorCode::kAgentLost) << lost->status;
    }
    auto after = co_await sub->next();
    EXPECT_EQ(errorCode(after.status()), ErrorCode::kAgentLost) << after.status();
    EXPECT_FALSE(link_events.empty());
    if (!link_events.empty()) {
      EXPECT_EQ(link_events.back().kind, LinkEvent::Kind::kLost);
    }
    EXPECT_EQ(errorCode(target.lostStatus()), ErrorCode::kAgentLost);
    auto read_after = co_await event->connection.read();
    EXPECT_EQ(errorCode(read_after.status()), ErrorCode::kAgentLost) << read_after.status();
  });
}

// A Subscription the program lets go of gives its port back on the agent:
// an Unsubscribe for the agent's id goes out without anyone waiting for it
// (before, the subscription was only forgotten locally, and the port stayed
// stolen for the session's life). An explicit unsubscribe() sends one too,
// and dropping that Subscription afterwards sends nothing more.
TEST(TypedSubscriptionsTest, DroppingASubscriptionUnsubscribesOnTheAgent) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    auto agent = std::make_shared<ScriptedAgent>(ex);
    asio::co_spawn(
        ex, [agent]() { return agent->serve(); }, asio::detached);
    std::vector<v1::Request> requests;
    net::Signal got(ex);
    answerSubscribes(*agent, [&](const v1::Request& r) {
      requests.push_back(r);
      got.notify();
    });

    Target target = Target::create(ex, optionsFor(*agent));
    EXPECT_TRUE((co_await target.connect()).ok());
    Subscriptions subscriptions(target);
    {
      StealSpec spec;
      spec.port = 8080;
      auto sub = co_await subscriptions.steal(spec);
      EXPECT_TRUE(sub.ok()) << sub.status();
      EXPECT_TRUE(sub.ok() && sub->status().ok()) << (sub.ok() ? sub->status() : sub.status());
    }  // dropped here
    const auto deadline = asio::steady_timer::clock_type::now() + std::chrono::seconds(5);
    while (requests.size() < 2 && asio::steady_timer::clock_type::now() < deadline) {
      co_await got.wait(deadline);
    }
    EXPECT_EQ(requests.size(), 2u);
    if (requests.size() >= 2) {
      EXPECT_TRUE(requests[0].has_steal());
      EXPECT_TRUE(requests[1].has_unsubscribe()) << requests[1].DebugString();
      EXPECT_EQ(requests[1].unsubscribe().subscription_id(), kAgentSubscription);
    }

    // unsubscribe() then a drop: one Unsubscribe, not two.
    MirrorSpec mirror{81, false};
    auto sub = co_await subscriptions.mirror(mirror);
    EXPECT_TRUE(sub.ok()) << sub.status();
    if (!sub.ok()) co_return;
    EXPECT_TRUE((co_await sub->unsubscribe()).ok());
    EXPECT_EQ(errorCode(sub->status()), ErrorCode::kCancelled) << sub->status();
    *sub = Subscription();
    // Let anything a drop would have spawned run and reach the agent.
    asio::steady_timer settle(ex, std::chrono::milliseconds(200));
    co_await settle.async_wait(net::use_awaitable);
    EXPECT_EQ(requests.size(), 4u);  // steal, unsubscribe, mirror, unsubscribe
    if (requests.size() >= 4) {
      EXPECT_TRUE(requests[3].has_unsubscribe());
    }
    target.close();
  });
}

// A filter's overlap notice comes out as a kOverlap event with its parts
// (who took the requests, how many, the first of them) and its text, after
// the Subscriptions object that subscribed is gone; a notice for a
// subscription the client does not hold is dropped.
TEST(TypedSubscriptionsTest, AnOverlapNoticeIsAnEventWithItsParts) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    auto agent = std::make_shared<ScriptedAgent>(ex);
    asio::co_spawn(
        ex, [agent]() { return agent->serve(); }, asio::detached);
    answerSubscribes(*agent, nullptr);
    Target target = Target::create(ex, optionsFor(*agent));
    EXPECT_TRUE((co_await target.connect()).ok());
    absl::StatusOr<Subscription> sub = absl::UnknownError("not subscribed");
    {
      Subscriptions subscriptions(target);
      StealSpec spec;
      spec.port = 8080;
      spec.filter = HttpFilter{{{"x-user", "^me$"}}, "", "", false};
      sub = co_await subscriptions.steal(spec);
    }
    EXPECT_TRUE(sub.ok()) << sub.status();
    if (!sub.ok()) co_return;

    v1::SubscriptionNotice stray;
    stray.set_subscription_id(kAgentSubscription + 1);
    stray.mutable_overlap()->set_requests(9);
    agent->session().sendNotice(stray);
    v1::SubscriptionNotice notice;
    notice.set_subscription_id(kAgentSubscription);
    v1::FilterOverlap& o = *notice.mutable_overlap();
    o.set_taken_by(3);
    o.set_taken_by_client("alice@laptop");
    o.set_requests(2);
    o.set_method("POST");
    o.set_path("/orders");
    agent->session().sendNotice(notice);
    agent->wake();

    auto event = co_await sub->next();
    EXPECT_TRUE(event.ok()) << event.status();
    if (!event.ok()) co_return;
    EXPECT_EQ(event->kind, SubscriptionEvent::Kind::kOverlap);
    EXPECT_EQ(event->overlap.taken_by, 3u);
    EXPECT_EQ(event->overlap.taken_by_client, "alice@laptop");
    EXPECT_EQ(event->overlap.requests, 2u);
    EXPECT_EQ(event->overlap.method, "POST");
    EXPECT_EQ(event->overlap.path, "/orders");
    EXPECT_EQ(event->text,
              "2 request(s) this filter matched (first POST /orders) went to the earlier "
              "subscription 3 of alice@laptop");
    target.close();
  });
}

// A subscribe whose answer does not come in time fails with TIMEOUT, but
// the agent made the subscription and answers late: the client undoes it
// with an Unsubscribe of the agent's id (before, the port stayed stolen for
// the session's life), and a stream of it that comes meanwhile is reset, not
// left waiting for a Subscription nobody holds.
TEST(TypedSubscriptionsTest, ALateSubscribedAnswerIsUnsubscribedAndItsStreamsReset) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    auto agent = std::make_shared<ScriptedAgent>(ex);
    asio::co_spawn(
        ex, [agent]() { return agent->serve(); }, asio::detached);
    std::vector<v1::Request> requests;
    std::optional<v1::Request> steal;
    std::vector<uint64_t> resets;
    net::Signal got(ex);
    agent->on_request = [&](v1::Request r) {
      requests.push_back(r);
      if (r.has_steal()) {
        steal = r;  // answered by the test, late
      } else {
        v1::Response response;
        response.set_request_id(r.request_id());
        response.mutable_unsubscribed();
        agent->session().sendResponse(std::move(response));
        agent->wake();
      }
      got.notify();
    };
    agent->on_reset = [&](uint64_t id, v1::Error) {
      resets.push_back(id);
      got.notify();
    };

    TargetOptions o = optionsFor(*agent);
    o.call_timeout = std::chrono::milliseconds(300);
    Target target = Target::create(ex, o);
    EXPECT_TRUE((co_await target.connect()).ok());
    Subscriptions subscriptions(target);
    StealSpec spec;
    spec.port = 8080;
    spec.filter = HttpFilter{{{"x-user", "^me$"}}, "", "", false};
    auto sub = co_await subscriptions.steal(spec);
    EXPECT_EQ(errorCode(sub.status()), ErrorCode::kTimeout) << sub.status();
    EXPECT_TRUE(steal.has_value());
    if (!steal) co_return;

    // The agent's answer, then a request of the subscription at once.
    v1::Response answer;
    answer.set_request_id(steal->request_id());
    answer.mutable_subscribed()->set_subscription_id(kAgentSubscription);
    answer.mutable_subscribed()->set_backend("sk_lookup");
    agent->session().sendResponse(std::move(answer));
    auto opened = agent->openStolenRequest(kAgentSubscription, "GET", "/late");
    EXPECT_TRUE(opened.ok()) << opened.status();

    const auto deadline = asio::steady_timer::clock_type::now() + std::chrono::seconds(5);
    auto unsubscribed = [&] {
      for (const auto& r : requests) {
        if (r.has_unsubscribe() && r.unsubscribe().subscription_id() == kAgentSubscription) {
          return true;
        }
      }
      return false;
    };
    while ((resets.empty() || !unsubscribed()) &&
           asio::steady_timer::clock_type::now() < deadline) {
      co_await got.wait(deadline);
    }
    EXPECT_TRUE(unsubscribed());
    if (opened.ok()) {
      EXPECT_EQ(resets, std::vector<uint64_t>{*opened});
    }
    target.close();
  });
}

}  // namespace
}  // namespace siphon::client
