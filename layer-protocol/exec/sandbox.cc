#include "exec/sandbox.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <linux/netfilter_ipv4.h>
#include <linux/netfilter_ipv6/ip6_tables.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "exec/fds.h"

namespace siphon::exec {
namespace {

// What the child sends on its socket: the listeners (kReady, with the fds),
// or why it stopped: a step that failed with an errno (kStepFailed), a
// command that failed with its status and the start of its stderr
// (kCommandFailed), the exec's errno (kExecFailed). A successful exec closes
// the socket (close-on-exec): the parent reads its end.
enum Kind : uint8_t { kReady = 1, kStepFailed, kCommandFailed, kExecFailed };

struct Message {
  Kind kind;
  int step;     // index into the child's plan (kStepFailed, kCommandFailed)
  int err;      // errno, or the command's wait status
  int has_v6;   // kReady: the IPv6 listener is among the fds
  int has_tun;  // kReady: the TUN device follows the listeners
  // kReady: the connector's socket is the last fd.
  char text[512];  // kCommandFailed: the start of its stderr
};

// The connector's sockets carry this mark, which the program's nat rules
// let pass: its connections go to the program's listeners, not to siphon's.
constexpr int kConnectorMark = 0x5f1d0e1;
constexpr const char* kConnectorMarkText = "0x5f1d0e1";

struct ConnectorRequest {
  int v6;
  uint16_t port;
  unsigned char address[16];  // in_addr (first 4 bytes) or in6_addr
};
struct ConnectorReply {
  int err;  // 0: the socket comes with it
};

// A plan made before the fork: the child only makes system calls on it
// (another thread of the parent may hold malloc's lock at the fork).
struct Plan {
  bool user_namespace = false;
  std::string uid_map_outer, gid_map_outer;  // "0 UID 1": root inside, for the set-up
  std::string uid_map_inner, gid_map_inner;  // "UID 0 1": the caller's ids again
  std::string hostname;
  std::vector<FileOverlay> files;
  std::vector<MountOverlay> mounts;
  std::string scratch;
  bool udp = false;
  // Each command's argv; "%4" and "%6" in them become the listeners' ports.
  // The UDP ones run once the TUN device exists; those after udp_v6_from
  // only with IPv6.
  std::vector<std::vector<std::string>> commands4, commands6, commands_udp;
  size_t udp_v6_from = 0;
  std::vector<std::string> argv, env;
  std::vector<int> keep_fds;  // siphon's, the program's at the same numbers
};

// The steps' names, for the parent's messages (kStepFailed's `step`).
constexpr const char* kSteps[] = {"setpgid",
                                  "unshare the namespaces",
                                  "write setgroups",
                                  "write uid_map",
                                  "write gid_map",
                                  "make the mounts private",
                                  "sethostname",
                                  "listen on 127.0.0.1",
                                  "listen on ::1",
                                  "run a command",
                                  "drop to the caller's ids",
                                  "send the listeners",
                                  "bind a file over",
                                  "make the TUN device " /* kTunName */,
                                  "start the connector",
                                  "show the target's files at",
                                  "close siphon's descriptors"};
enum Step {
  kSetpgid,
  kUnshare,
  kSetgroups,
  kUidMap,
  kGidMap,
  kMountPrivate,
  kHostname,
  kListen4,
  kListen6,
  kCommand,
  kDrop,
  kSend,
  kBindFile,
  kTun,
  kConnector,
  kMountOver,
  kDescriptors,
};

[[noreturn]] void childFail(int sock, Kind kind, int step, int err, const char* text = nullptr,
                            size_t text_len = 0) {
  Message m{};
  m.kind = kind;
  m.step = step;
  m.err = err;
  if (text) std::memcpy(m.text, text, std::min(text_len, sizeof(m.text) - 1));
  (void)!::send(sock, &m, sizeof(m), MSG_NOSIGNAL);
  ::_exit(127);
}

bool writeFile(const char* path, const std::string& s) {
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size());
  ::close(fd);
  return ok;
}

int listenOn(int family, uint16_t* port) {
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_storage ss{};
  socklen_t len;
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(*a);
  } else {
    const int one = 1;
    (void)::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_loopback;
    len = sizeof(*a);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, SOMAXCONN) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  *port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                  : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return fd;
}

// Writes `v` in decimal at `out` (room for 6 characters); returns the end.
char* putPort(char* out, uint16_t v) {
  char tmp[6];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) *out++ = tmp[--n];
  *out = '\0';
  return out;
}

// Runs one command of the plan (its "%4"/"%6" made the port) and waits;
// on failure reports it with the start of its stderr and exits.
void runCommand(int sock, const std::vector<std::string>& cmd, uint16_t port, int index) {
  char port_text[8];
  putPort(port_text, port);
  const char* argv[32];
  size_t n = 0;
  for (const std::string& a : cmd) {
    if (n + 1 >= sizeof(argv) / sizeof(argv[0])) break;
    argv[n++] = (a == "%4" || a == "%6") ? port_text : a.c_str();
  }
  argv[n] = nullptr;
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) childFail(sock, kStepFailed, kCommand, errno);
  const pid_t pid = ::fork();
  if (pid < 0) childFail(sock, kStepFailed, kCommand, errno);
  if (pid == 0) {
    // Its stdin and stdout are nobody's (the user's terminal is the
    // program's); its stderr comes back for the error message. Nothing else
    // of siphon's reaches it: child() left none but close-on-exec ones.
    ::dup2(err_pipe[1], 2);
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
    }
    ::execvp(argv[0], const_cast<char* const*>(argv));
    const char* what = errno == ENOENT ? "not found (is it installed?)" : "cannot be run";
    (void)!::write(2, argv[0], std::strlen(argv[0]));
    (void)!::write(2, ": ", 2);
    (void)!::write(2, what, std::strlen(what));
    ::_exit(127);
  }
  ::close(err_pipe[1]);
  char text[512];
  size_t have = 0;
  while (have < sizeof(text)) {
    const ssize_t r = ::read(err_pipe[0], text + have, sizeof(text) - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    have += static_cast<size_t>(r);
  }
  ::close(err_pipe[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    childFail(sock, kCommandFailed, index, status, text, have);
  }
}

// The connector (Sandbox::connector()): a process of the program's
// namespace that makes connections there for siphon, to the program's own
// listeners (incoming traffic). Each request is a ConnectorRequest; the
// answer is a ConnectorReply with the socket (connecting: non-blocking, so
// a full backlog never stalls the connector) or the errno. Ends at EOF.
// siphon's end of the connector's socket closed: siphon is gone (it ends
// the connector itself, by SIGKILL, once the program ended). A program
// must not run on unsteered, unseen: its process group gets SIGTERM, then
// SIGKILL 5 s later if it is still there.
[[noreturn]] void stopProgram(pid_t program) {
  if (::kill(-program, SIGTERM) == 0) {
    for (int i = 0; i < 50 && ::kill(-program, 0) == 0; ++i) {
      const timespec tick{0, 100 * 1000 * 1000};
      ::nanosleep(&tick, nullptr);
    }
    ::kill(-program, SIGKILL);
  }
  ::_exit(0);
}

[[noreturn]] void connectorLoop(int sock, pid_t program) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(sig, SIG_IGN);
  while (true) {
    ConnectorRequest req{};
    const ssize_t n = ::recv(sock, &req, sizeof(req), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof(req))) stopProgram(program);
    ConnectorReply reply{};
    const int family = req.v6 ? AF_INET6 : AF_INET;
    int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 &&
        ::setsockopt(fd, SOL_SOCKET, SO_MARK, &kConnectorMark, sizeof(kConnectorMark)) != 0) {
      reply.err = errno;
      ::close(fd);
      fd = -1;
    }
    if (fd < 0) {
      if (reply.err == 0) reply.err = errno;
    } else {
      sockaddr_storage ss{};
      socklen_t len;
      if (req.v6) {
        auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
        a->sin6_family = AF_INET6;
        std::memcpy(&a->sin6_addr, req.address, sizeof(a->sin6_addr));
        a->sin6_port = htons(req.port);
        len = sizeof(*a);
      } else {
        auto* a = reinterpret_cast<sockaddr_in*>(&ss);
        a->sin_family = AF_INET;
        std::memcpy(&a->sin_addr, req.address, sizeof(a->sin_addr));
        a->sin_port = htons(req.port);
        len = sizeof(*a);
      }
      if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 && errno != EINPROGRESS) {
        reply.err = errno;
      }
    }
    char control[CMSG_SPACE(sizeof(int))] = {};
    iovec iov{&reply, sizeof(reply)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (reply.err == 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    (void)::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (fd >= 0) ::close(fd);
  }
}

// Joins `dir` and `name` into `out` (PATH_MAX); false when too long.
bool joinPath(char* out, const char* dir, const char* name) {
  const bool root = dir[0] == '/' && dir[1] == '\0';
  return std::snprintf(out, PATH_MAX, "%s/%s", root ? "" : dir, name) < PATH_MAX;
}

// Makes `path` exist in the program's view as an empty entry of the kind a
// bind mount onto it needs (a directory for a directory). 0 or errno.
int makePlaceholder(const char* path, bool directory) {
  if (directory) return ::mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : errno;
  const int fd = ::open(path, O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return errno;
  ::close(fd);
  return 0;
}

// The child's part of a MountOverlay (sandbox.h): system calls only, on
// stack buffers (no malloc after the fork). 0 or errno.
int showAt(const MountOverlay& m, const char* scratch) {
  struct stat st {};
  if (::stat(m.target.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode) != m.directory) return m.directory ? ENOTDIR : EISDIR;
    return ::mount(m.source.c_str(), m.target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) == 0
               ? 0
               : errno;
  }
  if (errno != ENOENT) return errno;
  // The deepest ancestor that exists.
  char ancestor[PATH_MAX];
  std::snprintf(ancestor, sizeof(ancestor), "%s", m.target.c_str());
  while (true) {
    char* slash = std::strrchr(ancestor, '/');
    if (slash == ancestor) return EXDEV;  // only / exists: it cannot be covered
    *slash = '\0';
    if (::stat(ancestor, &st) == 0) break;
    if (errno != ENOENT) return errno;
  }
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  // A tmpfs with the ancestor's entries, each the original (bound, with
  // what is mounted under it) or, for a symlink, the same link.
  if (::mount("siphon", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") != 0) return errno;
  (void)::chmod(scratch, st.st_mode & 07777);
  (void)::chown(scratch, st.st_uid, st.st_gid);  // an unmapped owner stays ours
  const int dir = ::open(ancestor, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return errno;
  alignas(8) char dents[16384];
  char from[PATH_MAX], to[PATH_MAX], link[PATH_MAX];
  int err = 0;
  while (err == 0) {
    const long n = ::syscall(SYS_getdents64, dir, dents, sizeof(dents));
    if (n < 0) err = errno;
    if (n <= 0) break;
    for (long off = 0; off < n && err == 0;) {
      // struct linux_dirent64: d_ino, d_off, d_reclen, d_type, d_name.
      const char* d = dents + off;
      unsigned short reclen;
      std::memcpy(&reclen, d + 16, sizeof(reclen));
      unsigned char type = static_cast<unsigned char>(d[18]);
      const char* name = d + 19;
      off += reclen;
      if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
      if (!joinPath(from, ancestor, name) || !joinPath(to, scratch, name)) {
        err = ENAMETOOLONG;
        break;
      }
      if (type == DT_UNKNOWN) {
        struct stat e {};
        if (::fstatat(dir, name, &e, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
        type = S_ISDIR(e.st_mode) ? DT_DIR : S_ISLNK(e.st_mode) ? DT_LNK : DT_REG;
      }
      if (type == DT_LNK) {
        const ssize_t len = ::readlinkat(dir, name, link, sizeof(link) - 1);
        if (len < 0) continue;
        link[len] = '\0';
        if (::symlink(link, to) != 0) err = errno;
        continue;
      }
      err = makePlaceholder(to, type == DT_DIR);
      if (err == 0 && ::mount(from, to, nullptr, MS_BIND | MS_REC, nullptr) != 0) err = errno;
    }
  }
  ::close(dir);
  if (err != 0) return err;
  // The missing path, in the tmpfs: each directory, then the last part.
  const char* rest = m.target.c_str() + std::strlen(ancestor);  // "/a/b/c"
  char path[PATH_MAX];
  for (const char* p = rest + 1;; ++p) {
    if (*p != '/' && *p != '\0') continue;
    if (std::snprintf(path, sizeof(path), "%s%.*s", scratch, static_cast<int>(p - rest), rest) >=
        static_cast<int>(sizeof(path))) {
      return ENAMETOOLONG;
    }
    if ((err = makePlaceholder(path, *p == '/' || m.directory)) != 0) return err;
    if (*p == '\0') break;
  }
  // The tmpfs takes the ancestor's place, then the target's files theirs.
  if (::mount(scratch, ancestor, nullptr, MS_MOVE, nullptr) != 0) return errno;
  if (::mount(m.source.c_str(), m.target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    return errno;
  }
  return 0;
}

// Starts the connector as a grandchild (its parent exits at once), so that
// it is nobody's child in the program: it goes to siphon, the subreaper (or
// to init), in a process group of its own, out of the way of the signals
// sent to the program's. It keeps the set-up's capabilities over the namespace
// (SO_MARK needs them), which it uses for nothing but what siphon asks on
// its socket; when siphon's end closes while it runs (siphon killed), it
// stops the program (stopProgram). Returns siphon's end of its socket.
int startConnector(int sock) {
  const pid_t program = ::getpid();  // this process, which execs the program
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    childFail(sock, kStepFailed, kConnector, errno);
  }
  const pid_t middle = ::fork();
  if (middle < 0) childFail(sock, kStepFailed, kConnector, errno);
  if (middle == 0) {
    if (::fork() == 0) {
      ::setpgid(0, 0);
      // Nothing of the program's: its stdout held open here would keep a
      // reader of it waiting after the program ended. Nothing of siphon's
      // or the set-up's either (the listeners, the TUN device, --keep-fd's):
      // its own socket only.
      const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
      for (int fd = 0; fd <= 2; ++fd) {
        if (null >= 0) ::dup2(null, fd);
      }
      keepOnlyDescriptors(&pair[1], 1, FdAction::kClose);
      connectorLoop(pair[1], program);
    }
    ::_exit(0);
  }
  while (::waitpid(middle, nullptr, 0) < 0 && errno == EINTR) {
  }
  ::close(pair[1]);
  return pair[0];
}

[[noreturn]] void child(int sock, const Plan& plan, const char* const* argv,
                        const char* const* envp) {
  // Nothing of siphon's goes further than this process (fds.h): its
  // connection to the agent, its sockets in this machine's namespace, the
  // FUSE device are not close-on-exec, and the set-up's commands, the
  // connector and the program would have them. Only this socket (to siphon,
  // close-on-exec) and the descriptors the program is given (--keep-fd),
  // close-on-exec until its own exec, stay.
  int keep[kMaxKeptDescriptors];
  size_t n_keep = 0;
  keep[n_keep++] = sock;
  for (int fd : plan.keep_fds) keep[n_keep++] = fd;
  if (const int err = keepOnlyDescriptors(keep, n_keep, FdAction::kClose); err != 0) {
    childFail(sock, kStepFailed, kDescriptors, err);
  }
  for (int fd : plan.keep_fds) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  if (::setpgid(0, 0) != 0) childFail(sock, kStepFailed, kSetpgid, errno);
  int flags = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWUTS;
  if (plan.user_namespace) flags |= CLONE_NEWUSER;
  if (::unshare(flags) != 0) childFail(sock, kStepFailed, kUnshare, errno);
  if (plan.user_namespace) {
    if (!writeFile("/proc/self/setgroups", "deny")) childFail(sock, kStepFailed, kSetgroups, errno);
    if (!writeFile("/proc/self/uid_map", plan.uid_map_outer)) {
      childFail(sock, kStepFailed, kUidMap, errno);
    }
    if (!writeFile("/proc/self/gid_map", plan.gid_map_outer)) {
      childFail(sock, kStepFailed, kGidMap, errno);
    }
  }
  // Mounts made for the program (siphon fs mount of --fs-remote paths) stay
  // in its namespace.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    childFail(sock, kStepFailed, kMountPrivate, errno);
  }
  for (size_t i = 0; i < plan.files.size(); ++i) {
    if (::mount(plan.files[i].source.c_str(), plan.files[i].target.c_str(), nullptr, MS_BIND,
                nullptr) != 0) {
      childFail(sock, kStepFailed, kBindFile, errno, plan.files[i].target.c_str(),
                plan.files[i].target.size());
    }
  }
  if (!plan.hostname.empty() && ::sethostname(plan.hostname.data(), plan.hostname.size()) != 0) {
    childFail(sock, kStepFailed, kHostname, errno);
  }
  uint16_t port4 = 0, port6 = 0;
  const int l4 = listenOn(AF_INET, &port4);
  if (l4 < 0) childFail(sock, kStepFailed, kListen4, errno);
  // ::1 needs lo up; the IPv6 listener comes after the first command.
  int index = 0;
  for (const auto& cmd : plan.commands4) runCommand(sock, cmd, port4, index++);
  int l6 = -1;
  if (!plan.commands6.empty()) {
    l6 = listenOn(AF_INET6, &port6);
    // No IPv6 on this machine: IPv4 only (nothing to steer).
    if (l6 >= 0) {
      for (const auto& cmd : plan.commands6) runCommand(sock, cmd, port6, index++);
    }
  }
  int tun = -1;
  if (plan.udp) {
    tun = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (tun < 0) childFail(sock, kStepFailed, kTun, errno);
    ifreq ifr{};
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    std::memcpy(ifr.ifr_name, kTunName, std::strlen(kTunName));
    if (::ioctl(tun, TUNSETIFF, &ifr) != 0) childFail(sock, kStepFailed, kTun, errno);
    index = static_cast<int>(plan.commands4.size() + plan.commands6.size());
    for (size_t i = 0; i < plan.commands_udp.size(); ++i, ++index) {
      if (i >= plan.udp_v6_from && l6 < 0) break;
      runCommand(sock, plan.commands_udp[i], 0, index);
    }
  }
  // The target's files last: a path of theirs may cover what the set-up's
  // commands need here (their binaries, libraries, /etc).
  for (size_t i = 0; i < plan.mounts.size(); ++i) {
    const MountOverlay& m = plan.mounts[i];
    char scratch[PATH_MAX];
    if (std::snprintf(scratch, sizeof(scratch), "%s/%zu", plan.scratch.c_str(), i) >=
        static_cast<int>(sizeof(scratch))) {
      childFail(sock, kStepFailed, kMountOver, ENAMETOOLONG, m.target.c_str(), m.target.size());
    }
    if (const int err = showAt(m, scratch); err != 0) {
      childFail(sock, kStepFailed, kMountOver, err, m.target.c_str(), m.target.size());
    }
  }
  // Before the drop: the connector keeps the capability over the
  // namespace's network that SO_MARK needs (the program has none).
  const int connector = startConnector(sock);
  if (plan.user_namespace) {
    // The program runs as the caller, without the capabilities the set-up
    // had: a user namespace inside the first, mapping the ids back.
    if (::unshare(CLONE_NEWUSER) != 0) childFail(sock, kStepFailed, kDrop, errno);
    if (!writeFile("/proc/self/setgroups", "deny") ||
        !writeFile("/proc/self/uid_map", plan.uid_map_inner) ||
        !writeFile("/proc/self/gid_map", plan.gid_map_inner)) {
      childFail(sock, kStepFailed, kDrop, errno);
    }
  }
  Message m{};
  m.kind = kReady;
  m.has_v6 = l6 >= 0 ? 1 : 0;
  m.has_tun = tun >= 0 ? 1 : 0;
  int fds[4] = {l4, -1, -1, -1};
  size_t nfds = 1;
  if (l6 >= 0) fds[nfds++] = l6;
  if (tun >= 0) fds[nfds++] = tun;
  fds[nfds++] = connector;
  char control[CMSG_SPACE(sizeof(fds))] = {};
  iovec iov{&m, sizeof(m)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
  std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  if (::sendmsg(sock, &msg, MSG_NOSIGNAL) < 0) childFail(sock, kStepFailed, kSend, errno);
  for (size_t i = 0; i < nfds; ++i) ::close(fds[i]);
  // The program starts with the dispositions a shell would give it: siphon
  // ignores SIGPIPE (a closed stdout is an error to report), and a thread
  // of it may have had signals blocked at the fork.
  ::signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Right before the exec, whatever the set-up left open: close-on-exec,
  // but the descriptors the program is given (this socket stays open until
  // the exec, to carry an exec failure).
  if (const int err =
          keepOnlyDescriptors(plan.keep_fds.data(), plan.keep_fds.size(), FdAction::kCloseOnExec);
      err != 0) {
    childFail(sock, kStepFailed, kDescriptors, err);
  }
  ::execvpe(argv[0], const_cast<char* const*>(argv), const_cast<char* const*>(envp));
  childFail(sock, kExecFailed, 0, errno);
}

std::string commandText(const Plan& plan, int index) {
  size_t i = static_cast<size_t>(index);
  for (const auto* list : {&plan.commands4, &plan.commands6, &plan.commands_udp}) {
    if (i < list->size()) return absl::StrJoin((*list)[i], " ");
    i -= list->size();
  }
  return "?";
}

std::vector<std::vector<std::string>> ipv4Commands() {
  const std::string addr = kSandboxAddress4;
  return {
      {"ip", "link", "set", "lo", "up"},
      {"ip", "addr", "add", addr + "/32", "dev", "lo"},
      {"ip", "route", "add", "default", "dev", "lo", "src", addr},
      // The listener itself is not redirected; everything else TCP is.
      {"iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport",
       "%4", "-j", "RETURN"},
      // Nor the connector's connections to the program's listeners.
      {"iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-m", "mark", "--mark", kConnectorMarkText,
       "-j", "RETURN"},
      {"iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-j", "REDIRECT", "--to-ports",
       "%4"},
  };
}

std::vector<std::vector<std::string>> ipv6Commands() {
  const std::string addr = kSandboxAddress6;
  return {
      {"ip", "-6", "addr", "add", addr + "/128", "dev", "lo", "nodad"},
      {"ip", "-6", "route", "add", "default", "dev", "lo", "src", addr},
      {"ip6tables", "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", "::1", "--dport", "%6",
       "-j", "RETURN"},
      {"ip6tables", "-w", "-t", "nat", "-A", "OUTPUT", "-m", "mark", "--mark", kConnectorMarkText,
       "-j", "RETURN"},
      {"ip6tables", "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-j", "REDIRECT", "--to-ports",
       "%6"},
  };
}

// The UDP routes: every datagram to an address that is not local goes to
// the TUN device (a rule by protocol, ahead of the main table; local and
// loopback addresses stay with the local table, which comes first).
std::vector<std::vector<std::string>> udpCommands(size_t* v6_from) {
  const std::string table = "53";
  std::vector<std::vector<std::string>> out = {
      // 65535: a whole IPv4 datagram of any size in one packet.
      {"ip", "link", "set", kTunName, "mtu", "65535", "up"},
      {"ip", "rule", "add", "ipproto", "udp", "lookup", table, "pref", "100"},
      {"ip", "route", "add", "default", "dev", kTunName, "src", kSandboxAddress4, "table", table},
  };
  *v6_from = out.size();
  out.push_back({"ip", "-6", "rule", "add", "ipproto", "udp", "lookup", table, "pref", "100"});
  out.push_back({"ip", "-6", "route", "add", "default", "dev", kTunName, "src", kSandboxAddress6,
                 "table", table});
  return out;
}

absl::Status stepError(const Plan& plan, const Message& m) {
  const std::string why = std::strerror(m.err);
  if (m.step == kBindFile) {
    return absl::FailedPreconditionError(
        absl::StrCat("setting up the program's namespaces: cannot show the target's ",
                     std::string(m.text, strnlen(m.text, sizeof(m.text))), " there: ", why));
  }
  if (m.step == kMountOver) {
    const std::string target(m.text, strnlen(m.text, sizeof(m.text)));
    return absl::FailedPreconditionError(absl::StrCat(
        "setting up the program's namespaces: cannot show the target's ", target, " at ", target,
        ": ", why,
        m.err == EXDEV ? " (no directory on its path exists here but /: use --fs-root DIR)"
        : m.err == ENOTDIR || m.err == EISDIR
            ? " (a file here where the target has a directory, or the other way round)"
            : ""));
  }
  if (m.step == kTun) {
    return absl::FailedPreconditionError(
        absl::StrCat("setting up the program's namespaces: cannot make the TUN device for its UDP "
                     "(/dev/net/tun: ",
                     why, "; is the tun module loaded?)"));
  }
  if (m.step == kUnshare && plan.user_namespace && (m.err == EPERM || m.err == ENOSPC)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make a user namespace (", why,
        "): unprivileged user namespaces are off on this machine; check the sysctls "
        "kernel.unprivileged_userns_clone (Debian) and user.max_user_namespaces, or run "
        "siphon as root"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("setting up the program's namespaces: ", kSteps[m.step], ": ", why));
}

}  // namespace

Sandbox::~Sandbox() { reset(); }

Sandbox::Sandbox(Sandbox&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      tcp4_(std::exchange(other.tcp4_, -1)),
      tcp6_(std::exchange(other.tcp6_, -1)),
      tun_(std::exchange(other.tun_, -1)),
      connector_(std::exchange(other.connector_, -1)) {}

Sandbox& Sandbox::operator=(Sandbox&& other) noexcept {
  if (this != &other) {
    reset();
    pid_ = std::exchange(other.pid_, -1);
    tcp4_ = std::exchange(other.tcp4_, -1);
    tcp6_ = std::exchange(other.tcp6_, -1);
    tun_ = std::exchange(other.tun_, -1);
    connector_ = std::exchange(other.connector_, -1);
  }
  return *this;
}

void Sandbox::reset() {
  if (tcp4_ >= 0) ::close(tcp4_);
  if (tcp6_ >= 0) ::close(tcp6_);
  if (tun_ >= 0) ::close(tun_);
  if (connector_ >= 0) ::close(connector_);
  tcp4_ = tcp6_ = tun_ = connector_ = -1;
  pid_ = -1;  // the caller waits for the program
}

int Sandbox::releaseTcp4() { return std::exchange(tcp4_, -1); }
int Sandbox::releaseTcp6() { return std::exchange(tcp6_, -1); }
int Sandbox::releaseTun() { return std::exchange(tun_, -1); }
int Sandbox::releaseConnector() { return std::exchange(connector_, -1); }

absl::StatusOr<int> connectInside(int connector, const std::string& address, uint16_t port) {
  ConnectorRequest req{};
  req.port = port;
  if (::inet_pton(AF_INET, address.c_str(), req.address) == 1) {
    req.v6 = 0;
  } else if (::inet_pton(AF_INET6, address.c_str(), req.address) == 1) {
    req.v6 = 1;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("not a numeric address: ", address));
  }
  const bool v6 = req.v6 != 0;
  ssize_t n;
  do {
    n = ::send(connector, &req, sizeof(req), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(req))) {
    return absl::UnavailableError("the program's namespace is gone (its connector ended)");
  }
  ConnectorReply reply{};
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{&reply, sizeof(reply)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  do {
    n = ::recvmsg(connector, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(reply))) {
    return absl::UnavailableError("the program's namespace is gone (its connector ended)");
  }
  int fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    }
  }
  if (reply.err != 0 || fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "connect ", v6 ? "[" : "", address, v6 ? "]" : "", ":", port,
        " in the program's namespace: ", std::strerror(reply.err != 0 ? reply.err : EBADF)));
  }
  return fd;
}

absl::StatusOr<Sandbox> startSandbox(const SandboxSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("no program to run");
  Plan plan;
  plan.user_namespace = ::geteuid() != 0;
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  plan.uid_map_outer = absl::StrCat("0 ", uid, " 1");
  plan.gid_map_outer = absl::StrCat("0 ", gid, " 1");
  plan.uid_map_inner = absl::StrCat(uid, " 0 1");
  plan.gid_map_inner = absl::StrCat(gid, " 0 1");
  plan.hostname = spec.hostname;
  plan.files = spec.files;
  plan.mounts = spec.mounts;
  plan.scratch = spec.scratch;
  for (const MountOverlay& m : spec.mounts) {
    if (m.target.empty() || m.target[0] != '/' || m.target == "/") {
      return absl::InvalidArgumentError(absl::StrCat(
          "a path to show the target's files at must be absolute and not /: \"", m.target, "\""));
    }
    if (m.target.size() >= PATH_MAX / 2 || m.source.size() >= PATH_MAX / 2) {
      return absl::InvalidArgumentError(absl::StrCat("path too long: ", m.target));
    }
  }
  if (!spec.mounts.empty()) {
    for (size_t i = 0; i < spec.mounts.size(); ++i) {
      const std::string dir = absl::StrCat(spec.scratch, "/", i);
      if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::InternalError(absl::StrCat("mkdir ", dir, ": ", std::strerror(errno)));
      }
    }
  }
  for (int fd : spec.keep_fds) {
    if (fd < 3 || ::fcntl(fd, F_GETFD) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "descriptor ", fd,
          " to give the program: ", fd < 3 ? "0, 1 and 2 are always its own" : "not open"));
    }
  }
  if (spec.keep_fds.size() >= kMaxKeptDescriptors) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxKeptDescriptors - 1,
                                                   " descriptors can be given to the program"));
  }
  plan.keep_fds = spec.keep_fds;
  plan.udp = spec.udp;
  if (plan.udp) plan.commands_udp = udpCommands(&plan.udp_v6_from);
  plan.commands4 = ipv4Commands();
  if (::access("/proc/net/if_inet6", F_OK) == 0) plan.commands6 = ipv6Commands();
  std::vector<const char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(e.c_str());
  envp.push_back(nullptr);

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(e)));
  }
  if (pid == 0) {
    ::close(sv[0]);
    child(sv[1], plan, argv.data(), envp.data());
  }
  ::close(sv[1]);
  const int sock = sv[0];
  auto reap = [pid] {
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  };
  auto receive = [sock](Message* m, int* fds, size_t nfds) -> ssize_t {
    char control[CMSG_SPACE(4 * sizeof(int))] = {};
    iovec iov{m, sizeof(*m)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n;
    do {
      n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const size_t got = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        std::memcpy(fds, CMSG_DATA(c), std::min(got, nfds) * sizeof(int));
      }
    }
    return n;
  };

  Message m{};
  int fds[4] = {-1, -1, -1, -1};
  ssize_t n = receive(&m, fds, 4);
  if (n != static_cast<ssize_t>(sizeof(m)) || m.kind != kReady) {
    ::close(sock);
    reap();
    if (n != static_cast<ssize_t>(sizeof(m))) {
      return absl::InternalError("the program's namespaces: the set-up process died");
    }
    if (m.kind == kCommandFailed) {
      std::string text(m.text, strnlen(m.text, sizeof(m.text)));
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      return absl::FailedPreconditionError(absl::StrCat("setting up the program's namespaces: `",
                                                        commandText(plan, m.step), "` failed",
                                                        text.empty() ? "" : ": ", text));
    }
    return stepError(plan, m);
  }
  Sandbox box;
  box.pid_ = pid;
  box.tcp4_ = fds[0];
  box.tcp6_ = m.has_v6 ? fds[1] : -1;
  const int tun_index = m.has_v6 ? 2 : 1;
  box.tun_ = m.has_tun ? fds[tun_index] : -1;
  box.connector_ = fds[tun_index + (m.has_tun ? 1 : 0)];
  // The exec: the socket closes (close-on-exec), or its errno comes.
  Message e{};
  int none[4] = {-1, -1, -1, -1};
  n = receive(&e, none, 4);
  ::close(sock);
  if (n == static_cast<ssize_t>(sizeof(e)) && e.kind == kExecFailed) {
    reap();
    box.reset();
    const std::string what = absl::StrCat(spec.argv[0], ": ", std::strerror(e.err));
    if (e.err == ENOENT) return absl::NotFoundError(what);
    if (e.err == EACCES || e.err == EPERM) return absl::PermissionDeniedError(what);
    return absl::FailedPreconditionError(what);
  }
  return box;
}

absl::StatusOr<Destination> originalDestination(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return absl::InternalError(absl::StrCat("getsockname: ", std::strerror(errno)));
  }
  Destination d;
  char text[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    sockaddr_in orig{};
    len = sizeof(orig);
    if (::getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &orig, &len) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("SO_ORIGINAL_DST: ", std::strerror(errno)));
    }
    ::inet_ntop(AF_INET, &orig.sin_addr, text, sizeof(text));
    d.port = ntohs(orig.sin_port);
    d.loopback = (ntohl(orig.sin_addr.s_addr) >> 24) == 127;
  } else {
    sockaddr_in6 orig{};
    len = sizeof(orig);
    if (::getsockopt(fd, SOL_IPV6, IP6T_SO_ORIGINAL_DST, &orig, &len) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("IP6T_SO_ORIGINAL_DST: ", std::strerror(errno)));
    }
    ::inet_ntop(AF_INET6, &orig.sin6_addr, text, sizeof(text));
    d.port = ntohs(orig.sin6_port);
    d.loopback = IN6_IS_ADDR_LOOPBACK(&orig.sin6_addr);
  }
  d.address = text;
  return d;
}

}  // namespace siphon::exec
