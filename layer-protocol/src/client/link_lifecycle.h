// The life of a client's Link, as decisions without I/O: which agent to
// dial, with what time limit, whether the handshake opens a session or
// resumes one, when to wait before trying again, and when to give up with
// which status. Like protocol::Session, it is fed what happened (and the
// time) and answers with what to do; client/link.cc does the dialling, the
// handshakes and the waits around it (Client::runLifecycle).
//
// Three goals, each a LinkLifecycle of its own:
//  - kConnect: a new session on the first endpoint that takes one. A
//    Reject is final (another endpoint of the same target would answer the
//    same), except TOO_MANY_SESSIONS and AGENT_DRAINING, where the next one
//    may have room; with one endpoint those are final too.
//  - kResume: the same session again on the agent that holds it, with
//    backoff, until `within` (the session grace, or with another agent to
//    move to the keepalive timeout, each attempt then bounded by what is
//    left of it). A refused connection ends it at once (nothing listens
//    there, so the session is gone); so does any answer but UNAVAILABLE or
//    TIMEOUT.
//  - kMove: a new session on another agent (failover): rounds over the
//    other endpoints in order after the one left, then that one again
//    unless it drains (a replacement may answer at its address), with
//    backoff between rounds, until `within`.
//
// Call order: start() once, then for each step the call that answers it:
//   kDial      -> onDialed(status, refused, now)
//   kHandshake -> onHandshake(status, now)
//   kWait      -> onWaited(now)
//   kDone, kFail: the end; state() says which, and no call may follow.
// A step's endpoint and limit are for that step only.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "siphon/protocol/session.h"

namespace siphon::client {

// Waits between attempts: `initial`, doubled after each, at most `max`.
struct LinkBackoff {
  std::chrono::milliseconds initial{100};
  std::chrono::milliseconds max{2000};
};

class LinkLifecycle {
 public:
  enum class Goal { kConnect, kResume, kMove };
  enum class State { kIdle, kDialing, kHandshaking, kWaiting, kDone, kFailed };

  using Backoff = LinkBackoff;

  struct Step {
    enum class Kind { kDial, kHandshake, kWait, kDone, kFail };
    Kind kind = Kind::kFail;
    std::string endpoint;  // kDial, kHandshake
    bool resume = false;   // kHandshake: resume the session rather than open one
    // kDial, kHandshake: a bound on the step (the connect or handshake
    // timeout is the smaller of it and the option's); 0: the options' own.
    std::chrono::milliseconds limit{0};
    std::chrono::milliseconds wait{0};  // kWait
    absl::Status status;                // kFail: why
  };

  static LinkLifecycle connect(std::vector<std::string> endpoints);
  // `bounded`: each attempt is limited by what is left of `within`.
  static LinkLifecycle resume(std::string endpoint, std::chrono::milliseconds within, bool bounded,
                              Backoff backoff);
  static LinkLifecycle move(const std::vector<std::string>& endpoints, const std::string& from,
                            bool draining, std::chrono::milliseconds within, Backoff backoff);

  Step start(protocol::TimePoint now);
  Step onDialed(const absl::Status& status, bool refused, protocol::TimePoint now);
  Step onHandshake(const absl::Status& status, protocol::TimePoint now);
  Step onWaited(protocol::TimePoint now);

  Goal goal() const { return goal_; }
  State state() const { return state_; }
  // kMove: why each endpoint of the last round failed ("" when none tried).
  const std::vector<std::string>& failures() const { return failures_; }
  // The endpoints a move tries, in order (the round).
  const std::vector<std::string>& order() const { return order_; }

 private:
  LinkLifecycle(Goal goal, std::vector<std::string> order)
      : goal_(goal), order_(std::move(order)) {}

  Step dial(protocol::TimePoint now);
  Step failed(const absl::Status& why, protocol::TimePoint now);
  Step next(protocol::TimePoint now);  // the next endpoint, round or attempt
  Step wait();
  Step done();
  Step fail(absl::Status why);

  Goal goal_;
  State state_ = State::kIdle;
  std::vector<std::string> order_;
  size_t at_ = 0;  // index into order_
  std::chrono::milliseconds within_{0};
  bool bounded_ = false;
  Backoff backoff_;
  std::chrono::milliseconds next_wait_{0};
  protocol::TimePoint deadline_{};
  std::chrono::milliseconds limit_{0};  // of the attempt under way (kResume)
  absl::Status last_;                   // kResume: the last retryable failure
  std::vector<std::string> failures_;
  absl::Status busy_;  // kConnect: the first full or draining agent's answer
};

// What follows the end of a Link's transport.
struct AfterTransport {
  enum class Kind {
    kStop,    // the client is closing: nothing
    kLose,    // the session is gone: `why` (the agent's Goaway, or no resume wanted)
    kResume,  // try to resume it
  } kind;
  absl::Status why;
};
AfterTransport afterTransport(bool closing, const absl::Status& goaway, bool reconnect,
                              const absl::Status& transport_end);

// The AGENT_LOST status a lost Link's calls and streams fail with; its
// text names the typed cause (above all an expired session).
absl::Status linkLostStatus(const std::string& endpoint, const absl::Status& why);

}  // namespace siphon::client
