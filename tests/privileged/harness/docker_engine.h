// A private Docker-API engine for the privileged tests: a real Docker engine
// (Debian's docker.io: dockerd over a containerd of the test's own), or
// Podman's Docker-compatible API service (`podman system service`), each
// with every directory it writes (data root, exec root, run root, runtime
// state, sockets) inside one temporary directory, no bridge, no iptables
// rules, no forwarding sysctl, and containers in the cgroup /<tag>/..., so
// teardown finds exactly what the test made. The teardown leaves nothing
// behind (containers, images, the daemon, shims and conmon, container
// processes, runc state, mounts, cgroups, the directory, and the few host
// paths each engine writes whatever its flags), each step best effort,
// whatever state start-up reached.
//
// The test talks to either engine with Debian's Docker client,
// /usr/bin/docker, pointed at the engine's socket: the same API calls go to
// both, which is what `siphon-agent --runtime docker` relies on for Podman.
// (/usr/local/bin/docker, when present, is another client; never the one
// on PATH.) Header-only; needs pod_harness.h and containerd.h.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/privileged/harness/containerd.h"
#include "tests/privileged/harness/pod_harness.h"

namespace siphon::harness {

// Debian's docker.io client (API 1.41, the engine's own version).
constexpr char kDockerCli[] = "/usr/bin/docker";

enum class EngineKind { kDocker, kPodman };

inline const char* engineName(EngineKind kind) {
  return kind == EngineKind::kDocker ? "docker" : "podman";
}

// Why the tests of `kind` cannot run here (a tool missing), or "".
inline std::string missingEngineTool(EngineKind kind) {
  if (access(kDockerCli, X_OK) != 0) {
    return std::string(kDockerCli) + " (Debian's docker.io) is not installed " +
           "(scripts/install-deps.sh installs it)";
  }
  std::vector<const char*> tools = {"runc"};
  if (kind == EngineKind::kDocker) {
    tools.insert(tools.end(), {"dockerd", "containerd", "containerd-shim-runc-v2"});
  } else {
    tools.insert(tools.end(), {"podman", "conmon"});
  }
  for (const char* tool : tools) {
    if (!onPath(tool)) {
      return std::string(tool) + " is not installed (scripts/install-deps.sh installs it)";
    }
  }
  return "";
}

// Removes `path` and then its parents up to (not including) `stop`, each
// only if empty: what an engine created on the host for the test, when it
// was not there before (another engine's, or a sibling test's, stays).
inline void removeEmptyDirs(const std::string& path, const std::string& stop) {
  for (std::filesystem::path p = path; p.string() != stop && p.has_parent_path();
       p = p.parent_path()) {
    if (rmdir(p.c_str()) != 0) break;
  }
}

// A Docker-API engine of the test's own. The destructor tears everything
// down whatever state start() reached.
class PrivateEngine {
 public:
  PrivateEngine(EngineKind kind, std::string tag)
      : kind_(kind), tag_(tag), containerd_(std::move(tag)) {}
  ~PrivateEngine() { stop(); }
  PrivateEngine(const PrivateEngine&) = delete;
  PrivateEngine& operator=(const PrivateEngine&) = delete;

  // Makes the directory, starts the engine and waits until its API
  // answers. Empty on success, else what failed (with the daemon's log).
  std::string start() { return kind_ == EngineKind::kDocker ? startDocker() : startPodman(); }

  // /usr/bin/docker against this engine.
  Result docker(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {kDockerCli, "-H", "unix://" + socket_};
    argv.insert(argv.end(), args.begin(), args.end());
    // No ~/.docker of the user's (credential helpers, contexts): a config
    // directory of the test's own.
    return run(argv, cleanEnv({"DOCKER_CONFIG=" + dir_ + "/client"}));
  }

  // `docker import` of a root filesystem tar as image `name` with the
  // Dockerfile instructions `changes` ("ENV A=b"); the image is removed at
  // teardown (even if the import failed part way).
  Result importRootfs(const std::string& tar, const std::string& name,
                      const std::vector<std::string>& changes) {
    images_.push_back(name);
    std::vector<std::string> args = {"import"};
    for (const std::string& c : changes) args.insert(args.end(), {"--change", c});
    args.insert(args.end(), {tar, name});
    return docker(args);
  }

  // `docker load` of an image tar; `name` (what the tar names) is removed at
  // teardown.
  Result loadImage(const std::string& tar, const std::string& name) {
    images_.push_back(name);
    return docker({"load", "--input", tar});
  }

  // The `docker run` options every container of the test gets: its name,
  // and (Podman) the cgroup under the tag and resource limits this machine
  // allows. dockerd puts every container under /<tag> itself
  // (--cgroup-parent of the daemon).
  std::vector<std::string> placement(const std::string& name) const {
    std::vector<std::string> out = {"--name", name};
    if (kind_ == EngineKind::kPodman) {
      // Podman sets RLIMIT_NOFILE and RLIMIT_NPROC of a root container to
      // 1048576 and 4194304 unless told otherwise, and runc (started under
      // it) cannot raise a hard limit above the service's own: under lower
      // limits (a CI sandbox; the service itself lowers its RLIMIT_NPROC to
      // 32768) runc's setrlimit fails with EPERM. The limits the service
      // runs under are always allowed.
      out.insert(out.end(), {"--cgroup-parent", "/" + tag_, "--ulimit",
                             "nofile=" + daemonLimit("Max open files"), "--ulimit",
                             "nproc=" + daemonLimit("Max processes")});
    }
    return out;
  }

  // Records a container (created, or possibly created, by `docker run`) for
  // removal at teardown.
  void addContainer(const std::string& name) { containers_.push_back(name); }

  void removeContainer(const std::string& name) {
    docker({"rm", "--force", name});
    containers_.erase(std::remove(containers_.begin(), containers_.end(), name), containers_.end());
  }

  // `docker inspect --format FORMAT NAME`, without the trailing newline; ""
  // when it failed.
  std::string inspect(const std::string& name, const std::string& format) const {
    Result r = docker({"inspect", "--format", format, name});
    if (r.exit_code != 0) return "";
    while (!r.out.empty() && r.out.back() == '\n') r.out.pop_back();
    return r.out;
  }

  // The engine's log, to append to a failure: its last `max_chars`.
  std::string daemonLog(size_t max_chars = 6000) const {
    const std::string log = readFile(dir_ + "/engine.log");
    return std::string("\n--- ") + engineName(kind_) + " log (tail)\n" +
           (log.size() <= max_chars ? log : log.substr(log.size() - max_chars));
  }

  EngineKind kind() const { return kind_; }
  const std::string& dir() const { return dir_; }
  const std::string& socket() const { return socket_; }
  const std::string& tag() const { return tag_; }

 private:
  // "SOFT:HARD" of the daemon's limit named `name` in /proc/PID/limits
  // ("Max processes  32768  32768  processes"), for `docker run --ulimit`;
  // "1024:1024" if it cannot be read (always allowed).
  std::string daemonLimit(const std::string& name) const {
    std::istringstream lines(readFile("/proc/" + std::to_string(daemon_.pid()) + "/limits"));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind(name, 0) != 0) continue;
      std::istringstream values(line.substr(name.size()));
      std::string soft, hard;
      values >> soft >> hard;
      if (soft == "unlimited") soft = "-1";
      if (hard == "unlimited") hard = "-1";
      if (!soft.empty() && !hard.empty()) return soft + ":" + hard;
    }
    return "1024:1024";
  }

  // dockerd over a containerd of the test's own (--containerd): dockerd
  // would otherwise use the node's containerd when its socket exists, or
  // start one of its own, whose shims and state the teardown would have to
  // guess.
  std::string startDocker() {
    run_docker_existed_ = std::filesystem::exists("/run/docker");
    if (std::string err = containerd_.start("/tmp/siphon-dkr-XXXXXX"); !err.empty()) return err;
    dir_ = containerd_.dir();
    socket_ = dir_ + "/docker.sock";
    // dockerd writes its "trust key" to /etc/docker/key.json unless told
    // where (20.10 still makes one); no other setting of the node's
    // /etc/docker/daemon.json applies to this daemon.
    std::ofstream(dir_ + "/daemon.json")
        << "{\"deprecated-key-path\": \"" << dir_ << "/key.json\"}\n";
    Fd log(open((dir_ + "/engine.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    // No bridge, no NAT or filter rules, no ip_forward sysctl: containers
    // run with --network none (or the host's), and the node's firewall is
    // other tests' business.
    daemon_ = spawn({"dockerd",
                     "--config-file",
                     dir_ + "/daemon.json",
                     "--data-root",
                     dir_ + "/data",
                     "--exec-root",
                     dir_ + "/exec",
                     "--pidfile",
                     dir_ + "/docker.pid",
                     "-H",
                     "unix://" + socket_,
                     "--containerd",
                     containerd_.socket(),
                     "--bridge=none",
                     "--iptables=false",
                     "--ip6tables=false",
                     "--ip-forward=false",
                     "--ip-masq=false",
                     "--userland-proxy=false",
                     "--cgroup-parent",
                     "/" + tag_},
                    cleanEnv({"DOCKER_CONFIG=" + dir_ + "/client"}), log.get(), log.get());
    return waitForApi("dockerd");
  }

  // `podman system service` with a containers.conf and storage.conf of the
  // test's own: Podman's defaults put state in /run/libpod, /run/runc (the
  // runtime's root), /var/lib/containers and /etc/cni or
  // /etc/containers/networks.
  std::string startPodman() {
    var_lib_containers_existed_ = std::filesystem::exists("/var/lib/containers");
    run_runc_existed_ = std::filesystem::exists("/run/runc");
    std::string tmpl = "/tmp/siphon-pdm-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) return std::string("mkdtemp: ") + std::strerror(errno);
    dir_ = tmpl;
    socket_ = dir_ + "/podman.sock";
    std::filesystem::create_directories(dir_ + "/vartmp");
    std::ofstream(dir_ + "/containers.conf")
        << "[engine]\n"
        << "cgroup_manager = \"cgroupfs\"\n"
        << "events_logger = \"file\"\n"
        << "events_logfile_path = \"" << dir_ << "/events.log\"\n"
        << "tmp_dir = \"" << dir_ << "/libpod-tmp\"\n"
        << "static_dir = \"" << dir_ << "/root/libpod\"\n"
        << "volume_path = \"" << dir_ << "/root/volumes\"\n"
        << "[network]\n"
        << "network_config_dir = \"" << dir_ << "/net\"\n";
    // overlay where the kernel and the directory's filesystem allow it,
    // else vfs (copies every layer: slower, works everywhere).
    std::string err;
    for (const char* driver : {"overlay", "vfs"}) {
      std::ofstream(dir_ + "/storage.conf")
          << "[storage]\ndriver = \"" << driver << "\"\nrunroot = \"" << dir_
          << "/run\"\ngraphroot = \"" << dir_ << "/root\"\n";
      Fd log(open((dir_ + "/engine.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
      daemon_ = spawn({"podman",
                       "--root",
                       dir_ + "/root",
                       "--runroot",
                       dir_ + "/run",
                       "--storage-driver",
                       driver,
                       "--tmpdir",
                       dir_ + "/libpod-tmp",
                       "--network-config-dir",
                       dir_ + "/net",
                       "--cgroup-manager",
                       "cgroupfs",
                       "--events-backend",
                       "file",
                       "--runtime",
                       "runc",
                       "--runtime-flag",
                       "root=" + runcRoot(),
                       "system",
                       "service",
                       "--time=0",
                       "unix://" + socket_},
                      cleanEnv({"CONTAINERS_CONF=" + dir_ + "/containers.conf",
                                "CONTAINERS_STORAGE_CONF=" + dir_ + "/storage.conf",
                                // Image copies are staged in $TMPDIR (else /var/tmp).
                                "TMPDIR=" + dir_ + "/vartmp"}),
                      log.get(), log.get());
      err = waitForApi("podman system service");
      if (err.empty()) return "";
      stopDaemon();
    }
    return err;
  }

  // Waits until the engine answers `docker version` on its socket.
  std::string waitForApi(const std::string& what) {
    const auto deadline = Clock::now() + kProcessDeadline;
    while (true) {
      if (daemon_.waitUntil(Clock::now())) return what + " exited at start-up:" + daemonLog();
      if (canConnect(socket_) &&
          docker({"version", "--format", "{{.Server.Version}}"}).exit_code == 0) {
        return "";
      }
      if (Clock::now() >= deadline) return what + " never answered on " + socket_ + daemonLog();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  std::string runcRoot() const {
    return kind_ == EngineKind::kDocker ? dir_ + "/exec/runtime-runc/moby" : dir_ + "/runc";
  }

  void stopDaemon() {
    if (daemon_.pid() <= 0) return;
    kill(daemon_.pid(), SIGTERM);
    if (!daemon_.waitUntil(Clock::now() + std::chrono::seconds(15))) daemon_.kill();
    daemon_ = Child();
  }

  void stop() {
    if (!dir_.empty()) {
      for (const std::string& name : std::vector<std::string>(containers_)) {
        removeContainer(name);
      }
      for (const std::string& image : images_) docker({"rmi", "--force", image});
    }
    stopDaemon();
    if (dir_.empty()) return;
    // What outlived the daemon: Podman's conmon (a daemon of its own, one
    // per container, named after our directory), and container processes
    // (ours only: their cgroup carries the tag). dockerd's shims are the
    // containerd's below, which kills them.
    killProcessesMatching([this](pid_t pid) {
      const std::string cmdline = readFile("/proc/" + std::to_string(pid) + "/cmdline");
      return cmdline.rfind("/usr/bin/conmon", 0) == 0 && cmdline.find(dir_) != std::string::npos;
    });
    killProcessesMatching([this](pid_t pid) {
      return readFile("/proc/" + std::to_string(pid) + "/cgroup").find("/" + tag_ + "/") !=
             std::string::npos;
    });
    if (std::filesystem::exists(runcRoot())) {
      Result list = run({"runc", "--root", runcRoot(), "list", "-q"});
      std::istringstream ids(list.out);
      std::string id;
      while (std::getline(ids, id)) {
        if (!id.empty()) run({"runc", "--root", runcRoot(), "delete", "--force", id});
      }
    }
    if (kind_ == EngineKind::kDocker) {
      // dockerd makes /run/docker/plugins (plugin discovery) whatever its
      // exec root. The containerd's teardown (its destructor, after this)
      // does the rest: shims, mounts, cgroups, the directory.
      if (!run_docker_existed_) removeEmptyDirs("/run/docker/plugins", "/run");
      return;
    }
    // containers/image keeps a blob-info cache in /var/lib/containers/cache
    // for root, whatever --root says.
    if (!var_lib_containers_existed_) {
      std::error_code ec;
      std::filesystem::remove("/var/lib/containers/cache/blob-info-cache-v1.boltdb", ec);
      removeEmptyDirs("/var/lib/containers/cache", "/var/lib");
    }
    // A container whose start failed is cleaned up by a runc call without
    // --runtime-flag's root, which makes the default /run/runc (empty).
    if (!run_runc_existed_) removeEmptyDirs("/run/runc", "/run");
    for (const std::string& m : mountsUnder(dir_)) {
      if (umount2(m.c_str(), MNT_DETACH) != 0) {
        ADD_FAILURE() << "umount " << m << ": " << std::strerror(errno);
      }
    }
    removeCgroupsOfTag(tag_);
    if (!mountsUnder(dir_).empty()) {
      ADD_FAILURE() << "mounts left under " << dir_ << "; the directory is kept";
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    if (ec) ADD_FAILURE() << "remove " << dir_ << ": " << ec.message();
  }

  EngineKind kind_;
  std::string tag_;
  // Docker only: the containerd under dockerd, whose directory holds
  // dockerd's too. Declared before daemon_ so that it is destroyed after.
  PrivateContainerd containerd_;
  std::string dir_;
  std::string socket_;
  Child daemon_;
  bool run_docker_existed_ = true;
  bool var_lib_containers_existed_ = true;
  bool run_runc_existed_ = true;
  std::vector<std::string> images_;
  std::vector<std::string> containers_;
};

}  // namespace siphon::harness
