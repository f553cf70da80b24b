// A private containerd for the privileged tests that run real containers:
// its root, state, sockets and runc state in a temporary directory, no CRI
// plugin, and a teardown that leaves nothing of it behind (containers,
// images, the daemon, shims, container processes, runc state, mounts,
// cgroups, the directory), each step best effort, whatever state start-up
// reached. Header-only; needs pod_harness.h.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/privileged/harness/pod_harness.h"

namespace siphon::harness {

// The namespace the containers live in (the kubelet's).
constexpr char kContainerdNamespace[] = "k8s.io";

// Whether `tool` is on PATH.
inline bool onPath(const std::string& tool) {
  return run({"sh", "-c", "command -v " + tool}).exit_code == 0;
}

// Why the containerd tests cannot run here (a tool missing), or "".
inline std::string missingContainerdTool() {
  for (const char* tool : {"containerd", "ctr", "runc", "containerd-shim-runc-v2"}) {
    if (!onPath(tool)) {
      return std::string(tool) + " is not installed (scripts/install-deps.sh installs it)";
    }
  }
  return "";
}

// Whether something accepts connections on the Unix socket.
inline bool canConnect(const std::string& socket_path) {
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  return connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

// Mount points at or under `dir`, deepest first (the order to unmount).
inline std::vector<std::string> mountsUnder(const std::string& dir) {
  std::vector<std::string> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, devno, root, mount_point;
    fields >> id >> parent >> devno >> root >> mount_point;
    if (mount_point == dir || mount_point.rfind(dir + "/", 0) == 0) out.push_back(mount_point);
  }
  std::sort(out.begin(), out.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  return out;
}

// SIGKILLs every process (but this one) for whose pid `matches` is true.
template <typename Pred>
void killProcessesMatching(Pred matches) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::atoi(name.c_str());
    if (pid != getpid() && matches(pid)) kill(pid, SIGKILL);
  }
}

// Removes the cgroup /<tag> and the container cgroups under it, in every
// hierarchy (cgroup v1) or the one (v2). Empty cgroups are removed with
// rmdir, never with their files; a busy one (its last process still
// exiting) is retried for up to a second.
inline void removeCgroupsOfTag(const std::string& tag) {
  std::vector<std::string> roots = {"/sys/fs/cgroup"};
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/fs/cgroup", ec)) {
    if (e.is_directory()) roots.push_back(e.path());
  }
  for (const std::string& root : roots) {
    const std::string parent = root + "/" + tag;
    if (!std::filesystem::exists(parent)) continue;
    std::error_code ec2;
    for (const auto& child : std::filesystem::directory_iterator(parent, ec2)) {
      if (!child.is_directory()) continue;
      for (int i = 0; i < 100 && rmdir(child.path().c_str()) != 0 && errno == EBUSY; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    rmdir(parent.c_str());
  }
}

// A containerd of the test's own, and what the test made with it. `tag` is
// unique to the test: every container's cgroup is /<tag>/<id> (see
// placement()), so teardown finds exactly the test's processes and cgroups.
// The destructor tears everything down whatever state start() reached.
class PrivateContainerd {
 public:
  explicit PrivateContainerd(std::string tag) : tag_(std::move(tag)) {}
  ~PrivateContainerd() { stop(); }
  PrivateContainerd(const PrivateContainerd&) = delete;
  PrivateContainerd& operator=(const PrivateContainerd&) = delete;

  // Makes the directory from `dir_template` (a mkdtemp template), writes
  // the config and starts containerd, waiting until it listens. Empty on
  // success, else what failed.
  std::string start(const std::string& dir_template) {
    run_containerd_existed_ = std::filesystem::exists("/run/containerd");
    std::string tmpl = dir_template;
    if (mkdtemp(tmpl.data()) == nullptr) return std::string("mkdtemp: ") + std::strerror(errno);
    dir_ = tmpl;
    socket_ = dir_ + "/c.sock";
    // The opt plugin would create /opt/containerd; the CRI plugin would want
    // CNI and the kubelet's world. Everything else lives in the directory.
    std::ofstream(dir_ + "/config.toml")
        << "version = 2\n"
        << "root = \"" << dir_ << "/root\"\n"
        << "state = \"" << dir_ << "/state\"\n"
        << "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"
        << "[grpc]\n  address = \"" << socket_ << "\"\n"
        << "[ttrpc]\n  address = \"" << socket_ << ".ttrpc\"\n"
        << "[plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"" << dir_ << "/opt\"\n";
    Fd log(
        open((dir_ + "/containerd.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    daemon_ = spawn({"containerd", "--config", dir_ + "/config.toml"}, std::nullopt, log.get(),
                    log.get());
    const auto deadline = Clock::now() + kProcessDeadline;
    while (!canConnect(socket_)) {
      if (daemon_.waitUntil(Clock::now())) return "containerd exited at start-up:\n" + daemonLog();
      if (Clock::now() >= deadline) return "containerd never listened on " + socket_;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return "";
  }

  // ctr against this containerd, in kContainerdNamespace.
  Result ctr(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {"ctr", "-a", socket_, "-n", kContainerdNamespace};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv);
  }

  // Imports the image tar; the image `name` is removed at teardown (even if
  // the import failed part way).
  Result importImage(const std::string& tar, const std::string& name) {
    images_.push_back(name);
    return ctr({"image", "import", tar});
  }

  // The `ctr run` options that keep a container's fifos and runc state in
  // the directory and put its cgroup at /<tag>/<id>.
  std::vector<std::string> placement(const std::string& id) const {
    return {"--fifo-dir", dir_ + "/fifo", "--runc-root", dir_ + "/runc", "--cgroup",
            "/" + tag_ + "/" + id};
  }

  // Records a container (created, or possibly created, by `ctr run`) for
  // removeContainer() at teardown.
  void addContainer(const std::string& id) { containers_.push_back(id); }

  // Kills and deletes the container's task, then the container.
  void removeContainer(const std::string& id) {
    ctr({"task", "kill", "-s", "SIGKILL", id});
    ctr({"task", "delete", "--force", id});
    ctr({"container", "delete", id});
    containers_.erase(std::remove(containers_.begin(), containers_.end(), id), containers_.end());
  }

  // The task's pid and status (RUNNING, STOPPED...) as `ctr task ls` shows
  // them; {0, ""} when there is no such task.
  std::pair<pid_t, std::string> task(const std::string& id) const {
    Result tasks = ctr({"task", "ls"});
    std::istringstream lines(tasks.out);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::string name, pid, status;
      words >> name >> pid >> status;
      if (name == id) return {std::atoi(pid.c_str()), status};
    }
    return {0, ""};
  }

  // containerd's log, to append to a failure: all of it, or its last
  // `max_chars` characters.
  std::string daemonLog(size_t max_chars = std::string::npos) const {
    const std::string log = readFile(dir_ + "/containerd.log");
    if (max_chars == std::string::npos) return "\n--- containerd log\n" + log;
    return "\n--- containerd log (tail)\n" +
           (log.size() <= max_chars ? log : log.substr(log.size() - max_chars));
  }

  const std::string& dir() const { return dir_; }
  const std::string& socket() const { return socket_; }
  const std::string& tag() const { return tag_; }

 private:
  void stop() {
    if (dir_.empty()) return;
    for (const std::string& id : std::vector<std::string>(containers_)) removeContainer(id);
    for (const std::string& image : images_) ctr({"image", "remove", image});
    if (daemon_.pid() > 0) {
      kill(daemon_.pid(), SIGTERM);
      if (!daemon_.waitUntil(Clock::now() + std::chrono::seconds(10))) daemon_.kill();
    }
    // Whatever survived containerd: shims started for our socket, and the
    // containers' processes (only if still ours: their cgroup has our tag).
    killProcessesMatching([this](pid_t pid) {
      const std::string cmdline = readFile("/proc/" + std::to_string(pid) + "/cmdline");
      return cmdline.find("containerd-shim") != std::string::npos &&
             cmdline.find(socket_) != std::string::npos;
    });
    killProcessesMatching([this](pid_t pid) {
      return readFile("/proc/" + std::to_string(pid) + "/cgroup").find("/" + tag_ + "/") !=
             std::string::npos;
    });
    // runc state of every container left in our runc root.
    if (std::filesystem::exists(dir_ + "/runc")) {
      Result list = run({"runc", "--root", dir_ + "/runc", "list", "-q"});
      std::istringstream ids(list.out);
      std::string id;
      while (std::getline(ids, id)) {
        if (!id.empty()) run({"runc", "--root", dir_ + "/runc", "delete", "--force", id});
      }
    }
    for (const std::string& m : mountsUnder(dir_)) {
      if (umount2(m.c_str(), MNT_DETACH) != 0) {
        ADD_FAILURE() << "umount " << m << ": " << std::strerror(errno);
      }
    }
    removeCgroupsOfTag(tag_);
    if (!run_containerd_existed_) {
      // containerd 1.6 puts shim sockets in /run/containerd/s whatever its
      // state directory; remove what it created for us, if nothing else is
      // there.
      for (const char* d : {"/run/containerd/s", "/run/containerd/fifo", "/run/containerd"}) {
        rmdir(d);
      }
    }
    if (!mountsUnder(dir_).empty()) {
      ADD_FAILURE() << "mounts left under " << dir_ << "; the directory is kept";
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    if (ec) ADD_FAILURE() << "remove " << dir_ << ": " << ec.message();
  }

  std::string tag_;
  std::string dir_;
  std::string socket_;
  Child daemon_;
  bool run_containerd_existed_ = true;
  std::vector<std::string> images_;
  std::vector<std::string> containers_;
};

}  // namespace siphon::harness
