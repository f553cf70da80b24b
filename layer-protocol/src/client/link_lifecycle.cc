#include "client/link_lifecycle.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "siphon/status.h"

namespace siphon::client {

using std::chrono::milliseconds;
using Kind = LinkLifecycle::Step::Kind;

namespace {

bool retryable(v1::ErrorCode code) { return code == v1::UNAVAILABLE || code == v1::TIMEOUT; }

milliseconds leftUntil(protocol::TimePoint deadline, protocol::TimePoint now) {
  return std::chrono::duration_cast<milliseconds>(deadline - now);
}

}  // namespace

LinkLifecycle LinkLifecycle::connect(std::vector<std::string> endpoints) {
  return LinkLifecycle(Goal::kConnect, std::move(endpoints));
}

LinkLifecycle LinkLifecycle::resume(std::string endpoint, milliseconds within, bool bounded,
                                    Backoff backoff) {
  LinkLifecycle l(Goal::kResume, {std::move(endpoint)});
  l.within_ = within;
  l.bounded_ = bounded;
  l.backoff_ = backoff;
  return l;
}

LinkLifecycle LinkLifecycle::move(const std::vector<std::string>& endpoints,
                                  const std::string& from, bool draining, milliseconds within,
                                  Backoff backoff) {
  // The other endpoints in order after the one left, then (not when it
  // drains) that one again: a replacement agent may answer at its address.
  std::vector<std::string> order;
  const size_t at = std::find(endpoints.begin(), endpoints.end(), from) - endpoints.begin();
  for (size_t i = 1; i <= endpoints.size(); ++i) {
    const std::string& ep = endpoints[(at + i) % endpoints.size()];
    if (ep == from && draining) continue;
    order.push_back(ep);
  }
  LinkLifecycle l(Goal::kMove, std::move(order));
  l.within_ = within;
  l.backoff_ = backoff;
  return l;
}

LinkLifecycle::Step LinkLifecycle::start(protocol::TimePoint now) {
  next_wait_ = backoff_.initial;
  deadline_ = now + within_;
  switch (goal_) {
    case Goal::kConnect:
      if (order_.empty()) return fail(protoError(v1::INVALID_ARGUMENT, "no agent address given"));
      return dial(now);
    case Goal::kResume:
      last_ = protoError(v1::UNAVAILABLE, "no reconnect attempt made");
      return next(now);
    case Goal::kMove:
      return next(now);
  }
  return fail(protoError(v1::INTERNAL, "unknown goal"));
}

LinkLifecycle::Step LinkLifecycle::dial(protocol::TimePoint now) {
  state_ = State::kDialing;
  Step s;
  s.kind = Kind::kDial;
  s.endpoint = order_[at_];
  if (goal_ == Goal::kResume && bounded_) {
    // Moving on is bounded by the deadline: no attempt may outlast it.
    limit_ = std::max(leftUntil(deadline_, now), milliseconds(1));
  }
  s.limit = limit_;
  return s;
}

LinkLifecycle::Step LinkLifecycle::onDialed(const absl::Status& status, bool refused,
                                            protocol::TimePoint now) {
  if (status.ok()) {
    state_ = State::kHandshaking;
    Step s;
    s.kind = Kind::kHandshake;
    s.endpoint = order_[at_];
    s.resume = goal_ == Goal::kResume;
    s.limit = limit_;
    return s;
  }
  if (goal_ == Goal::kResume) {
    if (refused) {
      // Nothing listens there: the agent, and the session with it, is gone.
      return fail(
          protoError(v1::UNAVAILABLE, absl::StrCat(status.message(), ": the agent is gone")));
    }
    // Any other failure to reach it (even TLS's) may pass: try again.
    last_ = status;
    return wait();
  }
  return failed(status, now);
}

LinkLifecycle::Step LinkLifecycle::onHandshake(const absl::Status& status,
                                               protocol::TimePoint now) {
  if (status.ok()) return done();
  if (goal_ == Goal::kResume) return failed(status, now);
  // A new session's handshake that timed out or was cut names its agent.
  const v1::ErrorCode code = errorCodeOf(status);
  if (retryable(code)) {
    return failed(protoError(code, absl::StrCat(order_[at_], ": ", status.message())), now);
  }
  return failed(status, now);
}

LinkLifecycle::Step LinkLifecycle::failed(const absl::Status& why, protocol::TimePoint now) {
  const v1::ErrorCode code = errorCodeOf(why);
  switch (goal_) {
    case Goal::kConnect: {
      const bool full = code == v1::TOO_MANY_SESSIONS || code == v1::AGENT_DRAINING;
      if (!retryable(code) && !full) return fail(why);
      if (full && order_.size() == 1) return fail(why);
      if (full) {
        if (busy_.ok()) busy_ = why;
        failures_.push_back(absl::StrCat(order_[at_], ": ", why.message()));
      } else {
        failures_.push_back(std::string(why.message()));
      }
      return next(now);
    }
    case Goal::kResume:
      if (!retryable(code)) return fail(why);  // the agent's final answer
      last_ = why;
      return wait();
    case Goal::kMove:
      failures_.push_back(std::string(why.message()));
      return next(now);
  }
  return fail(why);
}

LinkLifecycle::Step LinkLifecycle::next(protocol::TimePoint now) {
  switch (goal_) {
    case Goal::kConnect:
      // Only after a failure: the next endpoint.
      if (++at_ < order_.size()) return dial(now);
      if (!busy_.ok()) {
        return fail(protoError(errorCodeOf(busy_), absl::StrCat("no agent took the session: ",
                                                                absl::StrJoin(failures_, "; "))));
      }
      return fail(protoError(v1::UNAVAILABLE, absl::StrCat("cannot reach the agent: ",
                                                           absl::StrJoin(failures_, "; "))));
    case Goal::kResume:
      if (now >= deadline_) {
        return fail(protoError(
            errorCodeOf(last_),
            absl::StrCat("no resume within ", within_.count(), " ms: ", last_.message())));
      }
      return dial(now);
    case Goal::kMove:
      if (state_ == State::kDialing || state_ == State::kHandshaking) {
        // An endpoint of the round failed: the next one, or a wait.
        if (++at_ < order_.size()) return dial(now);
        return wait();
      }
      // A new round.
      if (order_.empty() || now >= deadline_) {
        return fail(protoError(v1::UNAVAILABLE, absl::StrJoin(failures_, "; ")));
      }
      failures_.clear();
      at_ = 0;
      return dial(now);
  }
  return fail(protoError(v1::INTERNAL, "unknown goal"));
}

LinkLifecycle::Step LinkLifecycle::wait() {
  state_ = State::kWaiting;
  Step s;
  s.kind = Kind::kWait;
  s.wait = next_wait_;
  next_wait_ = std::min(next_wait_ * 2, backoff_.max);
  return s;
}

LinkLifecycle::Step LinkLifecycle::onWaited(protocol::TimePoint now) { return next(now); }

LinkLifecycle::Step LinkLifecycle::done() {
  state_ = State::kDone;
  Step s;
  s.kind = Kind::kDone;
  s.endpoint = order_[at_];
  return s;
}

LinkLifecycle::Step LinkLifecycle::fail(absl::Status why) {
  state_ = State::kFailed;
  Step s;
  s.kind = Kind::kFail;
  s.status = std::move(why);
  return s;
}

AfterTransport afterTransport(bool closing, const absl::Status& goaway, bool reconnect,
                              const absl::Status& transport_end) {
  if (closing) return {AfterTransport::Kind::kStop, absl::OkStatus()};
  if (!goaway.ok()) return {AfterTransport::Kind::kLose, goaway};
  if (!reconnect) return {AfterTransport::Kind::kLose, transport_end};
  return {AfterTransport::Kind::kResume, transport_end};
}

absl::Status linkLostStatus(const std::string& endpoint, const absl::Status& why) {
  // The code stays AGENT_LOST (what every caller checks); the text names a
  // typed cause, above all an expired session.
  const v1::ErrorCode cause = errorCodeOf(why);
  std::string text;
  if (cause == v1::SESSION_EXPIRED) {
    text = absl::StrCat("the session expired (SESSION_EXPIRED): the agent at ", endpoint,
                        " no longer holds it, as it was not resumed within the agent's grace "
                        "period: ",
                        why.message());
  } else if (cause == v1::UNAVAILABLE || cause == v1::TIMEOUT || cause == v1::AGENT_LOST) {
    text = absl::StrCat("session with the agent at ", endpoint, " lost: ", why.message());
  } else {
    text = absl::StrCat("session with the agent at ", endpoint, " lost (", errorCodeName(cause),
                        "): ", why.message());
  }
  return protoError(v1::AGENT_LOST, text);
}

}  // namespace siphon::client
