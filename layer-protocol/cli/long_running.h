// What the CLI's long-running commands (steal, mirror, capture, connect,
// forward) share: SIGINT/SIGTERM as an orderly stop, the session's news
// (resumed, draining, moved to another agent, lost for good) from the
// Target's events, one wake-up for the command's main loop, and how the run
// ends (the lost-session line, the exit code).
//
// Call order: construct, set the hooks, start() before the first subscribe
// or stream (dying of a signal then would leave ports stolen until the
// agent's session grace runs out); the command's loop waits with wait()
// until stopRequested() or !lost().ok(); finish() at the end (or let the
// destructor do it). Every hook runs on the event loop, inside a signal
// handler's or the Target's dispatch: hooks only note and start work.
//
// Threads: the CommandEnv's executor.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "cli/command.h"
#include "cli/format.h"
#include "siphon/client/target.h"
#include "siphon/transport/asio.h"

namespace siphon::cli {

class LongRunning {
 public:
  // `name` prefixes the lost-session line ("steal: ..."). `print` takes the
  // lines about the session the helper writes itself (resumed); none when
  // unset, as for commands whose stderr is for other things.
  LongRunning(const CommandEnv& env, std::string name,
              std::function<void(std::string)> print = nullptr);
  // A `print` that writes each line to stderr as it is.
  static std::function<void(std::string)> toStderr();
  ~LongRunning();
  LongRunning(const LongRunning&) = delete;
  LongRunning& operator=(const LongRunning&) = delete;

  // The first SIGINT/SIGTERM (an orderly stop), and each one after it
  // (end what is open now). The signal number is passed on.
  std::function<void(int)> on_stop;
  std::function<void(int)> on_end;
  // Every LinkEvent, after the helper's own handling (kResumed printed,
  // kLost noted): the command's lines for kDraining and kMoved.
  std::function<void(const client::LinkEvent&)> on_event;

  // Arms the signals (SIGPIPE is ignored from then on: a closed stdout is a
  // write error, not a reason to die) and takes the Target's events.
  void start();
  // Disarms both; the hooks are not called any more. Idempotent.
  void finish();

  int signals() const { return signals_; }
  int lastSignal() const { return last_signal_; }
  bool stopRequested() const { return signals_ >= 1; }
  bool ending() const { return signals_ >= 2; }
  // Non-OK once the command cannot go on: the session is gone for good
  // (kAgentLost), or what the command said with end().
  const absl::Status& lost() const { return lost_; }
  bool running() const { return !stopRequested() && lost_.ok(); }

  // The command cannot go on (e.g. no port came back after a move): as a
  // lost session. The first reason counts.
  void end(absl::Status why);
  // A call or stream failed: AGENT_LOST counts as the session's loss only
  // when the Target itself is lost (a failover may have moved it on).
  void checkLost(const absl::Status& s);

  // Wakes wait(). One waiter only (net::Signal is one timer): the command's
  // main loop.
  void notify() { wake_.notify(); }
  net::awaitable<void> wait(
      net::asio::steady_timer::time_point deadline = net::asio::steady_timer::time_point::max());

  // The exit code for how the run ended: `ok_code` while lost() is OK;
  // else kExitUnreachable for AGENT_LOST and kExitError for the rest.
  int exitCode(int ok_code) const;
  // "NAME: why" on stderr for a non-OK lost(); nothing otherwise.
  void reportLost() const;

  const client::Target& target() const { return target_; }

 private:
  void arm();

  client::Target target_;
  std::string name_;
  std::function<void(std::string)> print_;
  bool json_;
  net::asio::signal_set signal_set_;
  net::Signal wake_;
  // What the signal and event handlers hold (weakly): they may outlive this.
  std::shared_ptr<LongRunning*> self_;
  int signals_ = 0;
  int last_signal_ = 0;
  absl::Status lost_;
  bool started_ = false;
};

// The exit code of a failed stream or call of a long-running command: a
// lost session is kExitUnreachable, anything the agent said about the work
// itself (a refused connect, a bad filter) kExitError.
int streamExitCode(const absl::Status& s);

}  // namespace siphon::cli
