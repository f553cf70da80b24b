// The transport to an agent in a cluster: a `kubectl port-forward` that
// Siphon supervises. kubectl binds a local port on 127.0.0.1 (the kernel
// picks it: `:PORT`) and says which on its stdout ("Forwarding from
// 127.0.0.1:N -> PORT"); every connection to it is carried over the API
// server (SPDY or WebSocket) to the agent on its pod's loopback.
//
// Port-forwards end and stall: the API server's or kubelet's idle timeout,
// a kubelet restart, "lost connection to pod". The client library asks
// address() before each dial (ClientOptions::resolve_endpoint); after a cut
// it gets a new port-forward, and the session resumes over it with nothing
// lost, as after any cut. kubectl runs as a child that never outlives
// Siphon (kubectl.h, spawnChild): its own process group, SIGTERM when
// Siphon dies, no descriptor of Siphon's.
//
// Threads: the executor it was created on.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kube/kubectl.h"
#include "siphon/transport/asio.h"

namespace siphon::kube {

class PortForward : public std::enable_shared_from_this<PortForward> {
 public:
  struct Options {
    std::string ns;
    std::string pod;
    int remote_port = 7140;
    // How long kubectl may take to say where it listens.
    std::chrono::milliseconds start_timeout{30000};
  };

  // `argv` builds kubectl's command line (Kubectl::argv); `report` gets a
  // line for each new port-forward after the first (why the last one went).
  static std::shared_ptr<PortForward> create(
      net::asio::any_io_executor ex,
      std::function<std::vector<std::string>(const std::vector<std::string>&)> argv,
      Options options, std::function<void(const std::string&)> report = nullptr);
  ~PortForward();

  // The local address ("127.0.0.1:N") to dial the agent at. `after_cut`:
  // the connection through the address handed out last was cut or failed,
  // so that port-forward is not trusted again (a new one starts, unless
  // the current one was started after it and has not been handed out).
  // A kubectl that exited is always replaced. UNAVAILABLE with kubectl's
  // own line when it cannot forward (the pod is gone, forbidden...).
  net::awaitable<absl::StatusOr<std::string>> address(bool after_cut);

  // Ends the port-forward (and does not start another).
  void stop();

  // How many port-forwards were started.
  int started() const { return started_; }
  pid_t pidForTest() const { return pid_; }
  // Why the last one ended ("" while it runs).
  const std::string& lastEnd() const { return last_end_; }

  // "Forwarding from 127.0.0.1:43567 -> 7140": the port, or nullopt.
  static std::optional<int> parseForwardingLine(std::string_view line);

 private:
  PortForward(net::asio::any_io_executor ex,
              std::function<std::vector<std::string>(const std::vector<std::string>&)> argv,
              Options options, std::function<void(const std::string&)> report);
  net::awaitable<absl::Status> launch();
  void kill(const std::string& why);
  net::awaitable<void> readOutput(std::shared_ptr<PortForward> self, uint64_t generation,
                                  std::shared_ptr<net::asio::posix::stream_descriptor> out,
                                  bool is_stderr);
  net::awaitable<void> watchExit(std::shared_ptr<PortForward> self, uint64_t generation,
                                 std::shared_ptr<net::asio::posix::stream_descriptor> pidfd);
  void onLine(uint64_t generation, const std::string& line, bool is_stderr);

  net::asio::any_io_executor ex_;
  std::function<std::vector<std::string>(const std::vector<std::string>&)> argv_;
  Options options_;
  std::function<void(const std::string&)> report_;
  uint64_t generation_ = 0;  // of the kubectl running now
  pid_t pid_ = -1;
  bool alive_ = false;
  bool handed_out_ = false;  // the current address went to a dial
  bool stopped_ = false;
  int started_ = 0;
  int local_port_ = 0;
  std::string last_error_;  // kubectl's last error line of this generation
  std::string last_end_;
  net::Signal changed_;  // a line came, or kubectl exited
};

}  // namespace siphon::kube
