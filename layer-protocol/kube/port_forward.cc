#include "kube/port_forward.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::kube {

namespace asio = net::asio;
using Descriptor = asio::posix::stream_descriptor;

std::shared_ptr<PortForward> PortForward::create(
    asio::any_io_executor ex,
    std::function<std::vector<std::string>(const std::vector<std::string>&)> argv, Options options,
    std::function<void(const std::string&)> report) {
  return std::shared_ptr<PortForward>(
      new PortForward(ex, std::move(argv), std::move(options), std::move(report)));
}

PortForward::PortForward(
    asio::any_io_executor ex,
    std::function<std::vector<std::string>(const std::vector<std::string>&)> argv, Options options,
    std::function<void(const std::string&)> report)
    : ex_(ex),
      argv_(std::move(argv)),
      options_(std::move(options)),
      report_(std::move(report)),
      changed_(ex) {}

PortForward::~PortForward() {
  if (alive_ && pid_ > 0) ::kill(pid_, SIGTERM);
}

std::optional<int> PortForward::parseForwardingLine(std::string_view line) {
  // "Forwarding from 127.0.0.1:43567 -> 7140" (and "[::1]:43567" when
  // kubectl also binds IPv6: we ask for 127.0.0.1 only).
  constexpr std::string_view kPrefix = "Forwarding from 127.0.0.1:";
  if (!absl::StartsWith(asv(line), asv(kPrefix))) return std::nullopt;
  std::string_view rest = line.substr(kPrefix.size());
  const auto end = rest.find(' ');
  int port = 0;
  if (!absl::SimpleAtoi(asv(rest.substr(0, end)), &port) || port <= 0 || port > 65535) {
    return std::nullopt;
  }
  return port;
}

void PortForward::kill(const std::string& why) {
  if (!alive_) return;
  alive_ = false;
  last_end_ = why;
  if (pid_ > 0) ::kill(pid_, SIGTERM);
  changed_.notify();
}

void PortForward::stop() {
  stopped_ = true;
  kill("stopped");
}

void PortForward::onLine(uint64_t generation, const std::string& line, bool is_stderr) {
  if (generation != generation_) return;
  if (!is_stderr) {
    if (auto port = parseForwardingLine(line)) {
      local_port_ = *port;
      changed_.notify();
    }
    return;  // "Handling connection for 7140": one per dial
  }
  if (line.empty()) return;
  last_error_ = line;
  // kubectl before 1.29 keeps listening after the stream to the pod broke,
  // and every later connection fails: it is of no use any more.
  if (absl::StrContains(line, "lost connection to pod")) kill("lost connection to pod");
}

net::awaitable<void> PortForward::readOutput(std::shared_ptr<PortForward> self_in,
                                             uint64_t generation,
                                             std::shared_ptr<Descriptor> out_in, bool is_stderr) {
  const auto self = std::move(self_in);
  const auto out = std::move(out_in);
  asio::streambuf buf;
  while (true) {
    net::error_code ec;
    size_t n = co_await asio::async_read_until(*out, buf, '\n',
                                               asio::redirect_error(net::use_awaitable, ec));
    if (ec && n == 0) break;
    std::string line(asio::buffers_begin(buf.data()), asio::buffers_begin(buf.data()) + n);
    buf.consume(n);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    self->onLine(generation, line, is_stderr);
  }
}

net::awaitable<void> PortForward::watchExit(std::shared_ptr<PortForward> self_in,
                                            uint64_t generation,
                                            std::shared_ptr<Descriptor> pidfd_in) {
  const auto self = std::move(self_in);
  const auto pidfd = std::move(pidfd_in);
  net::error_code ec;
  co_await pidfd->async_wait(Descriptor::wait_read, asio::redirect_error(net::use_awaitable, ec));
  siginfo_t info{};
  int code = -1;
  // P_PIDFD: this child only. ECHILD when a subreaper's waitpid(-1) (siphon
  // exec reaps the program's orphans) took it first: the code is lost.
  if (::waitid(static_cast<idtype_t>(3) /*P_PIDFD*/, static_cast<id_t>(pidfd->native_handle()),
               &info, WEXITED | WNOHANG) == 0) {
    code = info.si_status;
  }
  if (info.si_pid > 0) releaseChild(info.si_pid);
  if (generation != self->generation_) co_return;
  if (self->alive_) {
    self->alive_ = false;
    self->last_end_ = !self->last_error_.empty()
                          ? self->last_error_
                          : absl::StrCat("kubectl port-forward exited (code ", code, ")");
  }
  self->changed_.notify();
}

net::awaitable<absl::Status> PortForward::launch() {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) co_return errnoStatus(errno, "pipe for kubectl port-forward");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    co_return errnoStatus(errno, "pipe for kubectl port-forward");
  }
  auto child =
      spawnChild(argv_({"port-forward", "-n", options_.ns, "pod/" + options_.pod,
                        absl::StrCat(":", options_.remote_port), "--address", "127.0.0.1"}),
                 -1, out[1], err[1]);
  ::close(out[1]);
  ::close(err[1]);
  if (!child.ok()) {
    ::close(out[0]);
    ::close(err[0]);
    co_return child.status();
  }
  ++started_;
  const uint64_t generation = ++generation_;
  pid_ = child->pid;
  alive_ = true;
  handed_out_ = false;
  local_port_ = 0;
  last_error_.clear();
  last_end_.clear();
  auto self = shared_from_this();
  auto out_d = std::make_shared<Descriptor>(ex_, out[0]);
  auto err_d = std::make_shared<Descriptor>(ex_, err[0]);
  net::spawn(ex_, readOutput(self, generation, out_d, false), "port_forward_stdout");
  net::spawn(ex_, readOutput(self, generation, err_d, true), "port_forward_stderr");
  if (child->pidfd >= 0) {
    net::spawn(ex_, watchExit(self, generation, std::make_shared<Descriptor>(ex_, child->pidfd)),
               "port_forward_exit");
  }
  const auto deadline = asio::steady_timer::clock_type::now() + options_.start_timeout;
  while (alive_ && local_port_ == 0 && generation == generation_ && !stopped_) {
    if (asio::steady_timer::clock_type::now() >= deadline) {
      kill("no Forwarding line in time");
      co_return absl::UnavailableError(absl::StrCat("kubectl port-forward to pod/", options_.pod,
                                                    " did not say where it listens within ",
                                                    options_.start_timeout.count() / 1000, " s",
                                                    last_error_.empty() ? "" : ": " + last_error_));
    }
    co_await changed_.wait(deadline);
  }
  if (local_port_ == 0) {
    co_return absl::UnavailableError(
        absl::StrCat("kubectl port-forward to pod/", options_.pod, " in namespace ", options_.ns,
                     " failed: ", last_error_.empty() ? last_end_ : last_error_));
  }
  co_return absl::OkStatus();
}

net::awaitable<absl::StatusOr<std::string>> PortForward::address(bool after_cut) {
  if (stopped_) co_return absl::CancelledError("the port-forward was stopped");
  if (alive_ && after_cut && handed_out_) kill("the connection through it was cut");
  if (!alive_) {
    const std::string why = last_end_;
    const bool again = started_ > 0;
    CO_RETURN_IF_ERROR(co_await launch());
    if (again && report_) {
      report_(absl::StrCat("port-forward to pod/", options_.pod, " restarted (", why,
                           "): now 127.0.0.1:", local_port_));
    }
  }
  handed_out_ = true;
  co_return absl::StrCat("127.0.0.1:", local_port_);
}

}  // namespace siphon::kube
