#include "cli/long_running.h"

#include <signal.h>

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cli/exit_codes.h"
#include "cli/steal_spec.h"
#include "siphon/client/errors.h"

namespace siphon::cli {

namespace asio = net::asio;
using client::ErrorCode;
using client::LinkEvent;

int streamExitCode(const absl::Status& s) {
  return client::errorCode(s) == ErrorCode::kAgentLost ? kExitUnreachable : kExitError;
}

LongRunning::LongRunning(const CommandEnv& env, std::string name,
                         std::function<void(std::string)> print)
    : target_(env.target),
      name_(std::move(name)),
      print_(std::move(print)),
      json_(env.json),
      signal_set_(env.client->executor()),
      wake_(env.client->executor()),
      self_(std::make_shared<LongRunning*>(this)) {}

LongRunning::~LongRunning() { finish(); }

std::function<void(std::string)> LongRunning::toStderr() {
  return [](std::string line) {
    if (!line.empty() && line.back() != '\n') line.push_back('\n');
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  };
}

void LongRunning::start() {
  if (started_) return;
  started_ = true;
  ::signal(SIGPIPE, SIG_IGN);
  net::error_code ignored;
  signal_set_.add(SIGINT, ignored);
  signal_set_.add(SIGTERM, ignored);
  arm();
  std::weak_ptr<LongRunning*> weak = self_;
  target_.setEventHandler([weak](const LinkEvent& e) {
    auto self = weak.lock();
    if (!self) return;
    LongRunning& lr = **self;
    switch (e.kind) {
      case LinkEvent::Kind::kResumed:
        if (lr.print_) {
          lr.print_(resumedLine(lr.target_.endpoint(), std::string(e.status.message()), lr.json_));
        }
        break;
      case LinkEvent::Kind::kLost:
        lr.end(e.status);
        break;
      case LinkEvent::Kind::kDraining:
      case LinkEvent::Kind::kMoved:
      case LinkEvent::Kind::kTargetRestarted:
        break;
    }
    if (lr.on_event) lr.on_event(e);
    lr.notify();
  });
}

void LongRunning::arm() {
  std::weak_ptr<LongRunning*> weak = self_;
  signal_set_.async_wait([weak](net::error_code ec, int signo) {
    auto self = weak.lock();
    if (ec || !self) return;
    LongRunning& lr = **self;
    ++lr.signals_;
    lr.last_signal_ = signo;
    lr.arm();  // the next one ends what is open
    if (lr.signals_ == 1) {
      if (lr.on_stop) lr.on_stop(signo);
    } else if (lr.on_end) {
      lr.on_end(signo);
    }
    lr.notify();
  });
}

void LongRunning::finish() {
  if (!started_) return;
  started_ = false;
  net::error_code ignored;
  signal_set_.cancel(ignored);
  signal_set_.clear(ignored);
  target_.setEventHandler(nullptr);
  on_stop = nullptr;
  on_end = nullptr;
  on_event = nullptr;
}

void LongRunning::end(absl::Status why) {
  if (!lost_.ok() || why.ok()) return;
  lost_ = std::move(why);
  notify();
}

void LongRunning::checkLost(const absl::Status& s) {
  if (client::errorCode(s) != ErrorCode::kAgentLost) return;
  if (absl::Status lost = target_.lostStatus(); !lost.ok()) end(std::move(lost));
}

net::awaitable<void> LongRunning::wait(asio::steady_timer::time_point deadline) {
  co_await wake_.wait(deadline);
}

int LongRunning::exitCode(int ok_code) const {
  if (lost_.ok()) return ok_code;
  return client::errorCode(lost_) == ErrorCode::kAgentLost ? kExitUnreachable : kExitError;
}

void LongRunning::reportLost() const {
  if (!lost_.ok()) printError(absl::StrCat(name_, ": ", lost_.message()));
}

}  // namespace siphon::cli
