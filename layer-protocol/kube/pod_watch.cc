#include "kube/pod_watch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "kube/json_read.h"
#include "kube/kubectl.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::kube {

namespace asio = net::asio;
using Descriptor = asio::posix::stream_descriptor;
using Clock = asio::steady_timer::clock_type;
using namespace std::chrono_literals;

namespace {

constexpr std::chrono::milliseconds kFirstBackoff = 200ms;
constexpr std::chrono::milliseconds kLastBackoff = 5s;
// A watch that lasted this long was no failure, however it ended.
constexpr auto kHealthy = 10s;
// Failures in a row before they are reported (a watch's end, one relist
// refused now and then, are routine); then about once a minute.
constexpr int kReportAfter = 3;
constexpr int kReportEvery = 12;

}  // namespace

std::vector<std::string> JsonObjectSplitter::feed(std::string_view data) {
  std::vector<std::string> objects;
  for (char c : data) {
    if (depth_ == 0) {
      if (c != '{') continue;  // whitespace between objects
      depth_ = 1;
      current_ = "{";
      continue;
    }
    current_ += c;
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
    } else if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if ((c == '}' || c == ']') && --depth_ == 0) {
      objects.push_back(std::move(current_));
      current_.clear();
    }
  }
  return objects;
}

std::shared_ptr<PodWatch> PodWatch::create(asio::any_io_executor ex, Argv argv, Options options,
                                           std::function<void(const PodEvent&)> on_event,
                                           std::function<void(const std::string&)> report) {
  auto watch = std::shared_ptr<PodWatch>(new PodWatch(ex));
  watch->argv_ = std::move(argv);
  watch->options_ = std::move(options);
  watch->on_event_ = std::move(on_event);
  watch->report_ = std::move(report);
  net::spawn(ex, watch->loop(watch), "pod_watch");
  return watch;
}

PodWatch::~PodWatch() {
  if (pid_ > 0) ::kill(-pid_, SIGTERM);
}

void PodWatch::stop() {
  stopped_ = true;
  // Its process group (spawnChild): whatever kubectl started goes with it.
  if (pid_ > 0) ::kill(-pid_, SIGTERM);
  wake_.notify();
}

std::vector<std::string> PodWatch::args(bool watch) const {
  std::vector<std::string> a{"get", "pods", "-n", options_.ns};
  if (!options_.pod.empty()) {
    a.insert(a.end(), {"--field-selector", "metadata.name=" + options_.pod});
  } else {
    a.insert(a.end(), {"-l", options_.selector});
  }
  if (watch) a.insert(a.end(), {"--watch", "--output-watch-events"});
  a.insert(a.end(), {"-o", "json"});
  return a;
}

net::awaitable<KubectlResult> PodWatch::run(std::vector<std::string> argv,
                                            std::function<void(std::string_view)> out) {
  KubectlResult r;
  r.exit_code = -1;  // killed by a signal, or reaped by someone else
  // Its stderr goes to a file read once it ended: no reader to keep up with
  // it, and kubectl says little there (a warning, its last error).
  int o[2];
  const int err = ::memfd_create("kubectl-stderr", MFD_CLOEXEC);
  if (err < 0 || ::pipe2(o, O_CLOEXEC) != 0) {
    r.err = std::string(errnoStatus(errno, "pipe for kubectl get pods").message());
    if (err >= 0) ::close(err);
    co_return r;
  }
  auto child = spawnChild(argv, -1, o[1], err);
  ::close(o[1]);
  if (!child.ok()) {
    ::close(o[0]);
    ::close(err);
    r.err = std::string(child.status().message());
    co_return r;
  }
  pid_ = child->pid;
  Descriptor stdout_d(ex_, o[0]);
  std::string buf(65536, '\0');  // not a std::array: GCC 12 fails to put one in a coroutine frame
  // To its end: kubectl's exit, or its process group's (stop()).
  for (net::error_code ec; !ec;) {
    size_t n = co_await stdout_d.async_read_some(asio::buffer(buf),
                                                 asio::redirect_error(net::use_awaitable, ec));
    if (n > 0) out(std::string_view(buf.data(), n));
  }
  siginfo_t info{};
  if (child->pidfd >= 0) {
    Descriptor pidfd(ex_, child->pidfd);
    net::error_code ec;
    co_await pidfd.async_wait(Descriptor::wait_read, asio::redirect_error(net::use_awaitable, ec));
    // P_PIDFD: this child only; ECHILD when a subreaper's waitpid(-1) took
    // it first (the code is lost).
    ::waitid(static_cast<idtype_t>(3) /*P_PIDFD*/, static_cast<id_t>(pidfd.native_handle()), &info,
             WEXITED | WNOHANG);
  } else {
    ::waitid(P_PID, static_cast<id_t>(child->pid), &info, WEXITED);  // its stdout ended: it did
  }
  if (info.si_pid > 0 && info.si_code == CLD_EXITED) r.exit_code = info.si_status;
  releaseChild(child->pid);
  pid_ = -1;
  for (ssize_t n;
       (n = ::pread(err, buf.data(), buf.size(), static_cast<off_t>(r.err.size()))) > 0;) {
    r.err.append(buf.data(), static_cast<size_t>(n));
  }
  ::close(err);
  co_return r;
}

void PodWatch::onObject(const std::string& text) {
  std::optional<PodEvent> event;
  try {
    const auto j = json_read::parse(text, "watch event");
    const std::string type = json_read::str(j, {"type"});
    const json_read::json* object = json_read::at(j, {"object"});
    if (type == "BOOKMARK") return;
    if (type == "ERROR") {
      // A Status (410 Gone: the resourceVersion is too old); kubectl ends.
      event_error_ = absl::StrCat("watch error: ",
                                  object ? json_read::str(*object, {"message"}) : "(no message)");
      return;
    }
    static const std::map<std::string, PodEvent::Type> kTypes = {
        {"ADDED", PodEvent::Type::kAdded},
        {"MODIFIED", PodEvent::Type::kModified},
        {"DELETED", PodEvent::Type::kDeleted}};
    auto t = kTypes.find(type);
    if (t == kTypes.end()) throw json_read::BadJson(absl::StrCat("unknown type '", type, "'"));
    event = PodEvent{t->second, {}};
    if (object == nullptr) throw json_read::BadJson("no object");
    auto pod = parsePod(object->dump());
    if (!pod.ok()) throw json_read::BadJson(std::string(pod.status().message()));
    event->pod = std::move(*pod);
  } catch (const std::exception& e) {
    if (report_)
      report_(absl::StrCat("pod watch: an event kubectl printed is unreadable: ", e.what()));
    return;
  }
  deliver(*event);
}

void PodWatch::deliver(const PodEvent& event) {
  if (event.type == PodEvent::Type::kDeleted) {
    known_.erase(podKey(event.pod));
  } else {
    known_[podKey(event.pod)] = event.pod;
  }
  if (on_event_) on_event_(event);
}

net::awaitable<void> PodWatch::loop(std::shared_ptr<PodWatch> self_in) {
  const auto self = std::move(self_in);
  std::chrono::milliseconds backoff = kFirstBackoff;
  int failures = 0;
  for (bool first = true; !stopped_; first = false) {
    const auto began = Clock::now();
    std::string why;
    bool listed = true;
    if (!first && !known_.empty()) {
      // The pods alive now: those known but absent are gone for good.
      std::string out;
      KubectlResult r =
          co_await run(argv_(args(false)), [&out](std::string_view d) { out.append(d); });
      if (stopped_) break;
      absl::StatusOr<std::vector<PodInfo>> pods =
          r.ok() ? parsePodList(out) : absl::UnavailableError(kubeError(r));
      if (pods.ok()) {
        std::set<std::string> alive;
        for (const auto& p : *pods) alive.insert(podKey(p));
        std::vector<PodEvent> gone;
        for (const auto& [key, pod] : known_) {
          if (alive.count(key) == 0) gone.push_back({PodEvent::Type::kDeleted, pod});
        }
        for (const auto& g : gone) deliver(g);
      } else {
        listed = false;
        why = std::string(pods.status().message());
      }
    }
    if (listed && !stopped_) {
      event_error_.clear();
      JsonObjectSplitter splitter;
      KubectlResult r = co_await run(argv_(args(true)), [this, &splitter](std::string_view d) {
        for (const auto& object : splitter.feed(d)) onObject(object);
      });
      why = r.err.empty() && !event_error_.empty() ? event_error_ : kubeError(r);
    }
    if (stopped_) break;
    if (Clock::now() - began >= kHealthy) {
      failures = 0;
      backoff = kFirstBackoff;
    } else if (++failures >= kReportAfter && (failures - kReportAfter) % kReportEvery == 0 &&
               report_) {
      report_(absl::StrCat("the pod watch in namespace ", options_.ns, " failed ", failures,
                           " times in a row, retrying: ", why));
    }
    if (!stopped_) co_await wake_.wait(Clock::now() + backoff);
    if (failures > 0) backoff = std::min(backoff * 2, std::chrono::milliseconds(kLastBackoff));
  }
}

}  // namespace siphon::kube
