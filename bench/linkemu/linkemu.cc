// linkemu: a slow link between two TAP devices, emulated in user space, for
// the benchmarks' link scenarios (bench/README.md, "Link emulator"). The
// machines we run on have no netem, fq or dummy qdisc in their kernel, so a
// WAN-like path is made of two TAP devices (each in the network namespace
// asked for) and this process between them: every frame one device sends
// is held for the one-way delay (and, with --rate, its serialisation time
// on a link of that rate) and then written to the other device.
//
//   linkemu --tap-a NAME [--netns-a NS] --tap-b NAME [--netns-b NS]
//           [--delay-ms MS] [--rate BYTES_PER_S] [--queue BYTES]
//           [--loss PERCENT] [--seed N] [--offload] [--fifo PRIO]
//
//   --delay-ms  one-way delay, each direction (RTT 20 ms: --delay-ms 10)
//   --rate      the link's rate in bytes/s (SI suffixes: 125M = 1 Gbit/s);
//               0 or absent: as fast as the devices go
//   --queue     bytes a direction may hold: with --rate, the bottleneck's
//               buffer (frames waiting for their turn; tail drop beyond),
//               without, the bytes on the delay line. Default 64 MiB.
//   --loss      the share of frames lost, each direction, independently
//               of each other (uniform random, 0.5 = 0.5 %); a lost frame
//               still takes its time on the link, as on a wire that
//               corrupts it. Not with --offload, where a frame is up to
//               44 segments and losing one would be a burst.
//   --seed      the random generator's seed (default 1): a run's losses
//               are the same sequence each time.
//   --offload   TAP offloads (virtio-net header, TSO/GSO, checksum): frames
//               of up to 64 KiB, far fewer per second; without it each
//               frame is one MTU-sized Ethernet frame, as on a wire.
//   --netns-a/--netns-b  a name under /run/netns (`ip netns add`): the
//               device is made there. Default: this process's namespace.
//   --fifo PRIO real-time scheduling (SCHED_FIFO at PRIO, 1-99): a wire
//               is not late because the machine is busy. On a loaded
//               machine without it, a 20 ms RTT measured 20-56 ms; with it,
//               20.2-20.4 ms. The kernel's RT throttling still leaves the
//               other processes 5% of a core if this one ever spins.
//
// The devices are made by this process and vanish when it exits; it does
// not bring them up or address them (`ip link set NAME up`, `ip addr add`).
//
// Output: "linkemu: ready tap-a=A tap-b=B" on stdout once both devices
// exist; at SIGINT/SIGTERM one line of counters per direction on stderr
// ("a->b frames=N bytes=N dropped_queue=N dropped_write=N lost=N"), then
// exit 0.
// Exit status 1 with a message on stderr when a device cannot be made
// (no /dev/net/tun, no such namespace, a name in use), 2 for bad flags.
//
// Timing: one thread; the two devices, a timerfd (absolute
// CLOCK_MONOTONIC, armed for the earliest frame due) and a signalfd in one
// epoll set. Each direction is a FIFO of frames with the time they are
// due; with a constant delay and a FIFO bottleneck, due times only grow,
// so the FIFO is the sorted queue. No per-frame sleep: a frame's wait
// overlaps every other frame's.
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC on Linux
using Nanos = std::chrono::nanoseconds;

// The largest frame a TAP hands out: 64 KiB of GSO payload plus headers
// and the virtio-net header (--offload); an MTU frame otherwise.
constexpr size_t kMaxFrame = 65536 + 256;
// Frames read from one device per wake-up before the other gets a turn.
constexpr int kReadBatch = 64;
// struct virtio_net_hdr (flags, gso_type, hdr_len, gso_size, csum_start,
// csum_offset), in front of each frame with --offload. Set explicitly
// (TUNSETVNETHDRSZ); <linux/virtio_net.h> does not compile as C++.
constexpr int kVnetHeader = 10;

struct Options {
  std::string tap_a, tap_b, netns_a, netns_b;
  double delay_ms = 0;
  std::string rate = "0";
  std::string queue = "64M";
  double loss_percent = 0;
  uint64_t seed = 1;
  bool offload = false;
  int fifo = 0;
};

// "125M" -> 125000000 (SI: k, M, G). nullopt when it is not a number.
std::optional<uint64_t> parseSi(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || v < 0) return std::nullopt;
  double scale = 1;
  const std::string suffix(end);
  if (suffix == "k" || suffix == "K") {
    scale = 1e3;
  } else if (suffix == "M") {
    scale = 1e6;
  } else if (suffix == "G") {
    scale = 1e9;
  } else if (!suffix.empty()) {
    return std::nullopt;
  }
  return static_cast<uint64_t>(v * scale);
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "linkemu: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// Opens (makes) TAP device `name` in network namespace `netns` (a name
// under /run/netns; empty: ours). The device lives as long as the
// descriptor: it belongs to the namespace it was made in, whichever
// namespace this process is in afterwards.
int openTap(const std::string& name, const std::string& netns, bool offload) {
  int home = -1;
  if (!netns.empty()) {
    home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0) die("open /proc/self/ns/net");
    const std::string path = "/run/netns/" + netns;
    const int ns = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) die("open " + path);
    if (setns(ns, CLONE_NEWNET) != 0) die("setns " + path);
    close(ns);
  }
  const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) die("open /dev/net/tun");
  struct ifreq ifr {};
  // IFF_NO_PI: frames as they are, without tun's 4-byte packet information.
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI | (offload ? IFF_VNET_HDR : 0);
  if (name.size() >= IFNAMSIZ) {
    errno = ENAMETOOLONG;
    die("TAP device " + name);
  }
  std::memcpy(ifr.ifr_name, name.c_str(), name.size());
  if (ioctl(fd, TUNSETIFF, &ifr) != 0) die("TUNSETIFF " + name);
  if (offload) {
    // The kernel may then hand us (and take from us) GSO frames with
    // partial checksums; the virtio-net header in front of each frame
    // says how to finish them, and is passed through to the other device
    // as it is, so the receiving stack does the segmentation it needs.
    const unsigned flags = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
    if (ioctl(fd, TUNSETOFFLOAD, flags) != 0) die("TUNSETOFFLOAD " + name);
    if (ioctl(fd, TUNSETVNETHDRSZ, &kVnetHeader) != 0) die("TUNSETVNETHDRSZ " + name);
  }
  if (home >= 0) {
    if (setns(home, CLONE_NEWNET) != 0) die("setns back");
    close(home);
  }
  return fd;
}

struct Frame {
  Clock::time_point due;
  std::vector<uint8_t> bytes;
};

// One way across the link: frames read from `in`, written to `out` when due.
struct Direction {
  Direction(const char* n, int from, int to) : name(n), in(from), out(to) {}
  const char* name;
  int in;
  int out;
  std::deque<Frame> line;
  size_t held = 0;                 // bytes in `line`
  Clock::time_point free_at{};     // the bottleneck is busy until then
  uint64_t frames = 0, bytes = 0;  // written to `out`
  uint64_t dropped_queue = 0, dropped_write = 0, lost = 0;
};

class Link {
 public:
  Link(Nanos delay, uint64_t rate, uint64_t queue, size_t header, double loss, uint64_t seed)
      : delay_(delay), rate_(rate), queue_(queue), header_(header), loss_(loss), random_(seed) {}

  // A frame of `len` bytes arrived at `now`: when it is due at the other
  // end, or nullopt when the direction's queue has no room (tail drop).
  std::optional<Clock::time_point> admit(Direction& d, size_t len, Clock::time_point now) {
    const size_t wire = len > header_ ? len - header_ : len;  // virtio-net header: not sent
    if (rate_ == 0) {
      if (d.held + len > queue_) return std::nullopt;
      return now + delay_;
    }
    // With a rate, what is still waiting for the bottleneck is the time it
    // stays busy times the rate.
    const Clock::time_point start = std::max(now, d.free_at);
    const auto backlog_ns = std::chrono::duration_cast<Nanos>(start - now).count();
    const auto backlog =
        static_cast<uint64_t>(static_cast<double>(backlog_ns) * 1e-9 * static_cast<double>(rate_));
    if (backlog + wire > queue_) return std::nullopt;
    d.free_at =
        start +
        Nanos(static_cast<int64_t>(static_cast<double>(wire) * 1e9 / static_cast<double>(rate_)));
    return d.free_at + delay_;
  }

  // Reads what `d.in` has (up to kReadBatch frames) onto the delay line.
  void receive(Direction& d) {
    for (int i = 0; i < kReadBatch; ++i) {
      const ssize_t n = read(d.in, buf_.data(), buf_.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) return;
        die(std::string("read ") + d.name);
      }
      if (n == 0) return;
      const auto len = static_cast<size_t>(n);
      const auto due = admit(d, len, Clock::now());
      if (!due) {
        ++d.dropped_queue;
        continue;
      }
      // Lost after admission: it took its place in the queue and its time
      // on the wire, and never arrives.
      if (loss_ > 0 && uniform_(random_) < loss_) {
        ++d.lost;
        continue;
      }
      d.line.push_back({*due, std::vector<uint8_t>(buf_.begin(), buf_.begin() + n)});
      d.held += len;
    }
  }

  // Writes the frames that are due. A frame the device does not take
  // (down, or its queue full: EAGAIN, EIO) is dropped, as a wire would.
  void deliver(Direction& d, Clock::time_point now) {
    while (!d.line.empty() && d.line.front().due <= now) {
      Frame& f = d.line.front();
      ssize_t n;
      do {
        n = write(d.out, f.bytes.data(), f.bytes.size());
      } while (n < 0 && errno == EINTR);
      if (n < 0) {
        ++d.dropped_write;
      } else {
        ++d.frames;
        d.bytes += f.bytes.size();
      }
      d.held -= f.bytes.size();
      d.line.pop_front();
    }
  }

 private:
  Nanos delay_;
  uint64_t rate_;
  uint64_t queue_;
  size_t header_;
  double loss_;  // probability, 0..1
  std::mt19937_64 random_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  std::vector<uint8_t> buf_ = std::vector<uint8_t>(kMaxFrame);
};

// The timerfd armed for `when` (absolute), or disarmed.
void arm(int tfd, std::optional<Clock::time_point> when) {
  struct itimerspec its {};
  if (when) {
    const auto ns = std::chrono::duration_cast<Nanos>(when->time_since_epoch()).count();
    // 0 disarms: a time already past is the earliest nonzero one.
    its.it_value.tv_sec = ns / 1000000000;
    its.it_value.tv_nsec = ns % 1000000000;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
  }
  if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, nullptr) != 0) die("timerfd_settime");
}

void addFd(int ep, int fd) {
  struct epoll_event ev {};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl");
}

int run(const Options& o) {
  const auto rate = parseSi(o.rate);
  const auto queue = parseSi(o.queue);
  if (!rate || !queue || o.delay_ms < 0) {
    std::fprintf(stderr,
                 "linkemu: --rate and --queue take a number of bytes (k, M, G), "
                 "--delay-ms a number >= 0\n");
    return 2;
  }
  if (o.loss_percent > 0 && o.offload) {
    std::fprintf(stderr,
                 "linkemu: --loss with --offload would lose up to 44 segments at once "
                 "(a 64 KiB frame): use MTU frames (no --offload)\n");
    return 2;
  }
  // The timer's slack is how late a frame may leave: 1 ns instead of the
  // default 50 us.
  prctl(PR_SET_TIMERSLACK, 1UL);
  if (o.fifo > 0) {
    struct sched_param sp {};
    sp.sched_priority = o.fifo;
    if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) die("sched_setscheduler SCHED_FIFO");
  }

  const int a = openTap(o.tap_a, o.netns_a, o.offload);
  const int b = openTap(o.tap_b, o.netns_b, o.offload);
  Direction ab("a->b", a, b);
  Direction ba("b->a", b, a);
  Link link(
      std::chrono::duration_cast<Nanos>(std::chrono::duration<double, std::milli>(o.delay_ms)),
      *rate, *queue, o.offload ? kVnetHeader : 0, o.loss_percent / 100.0, o.seed);

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  if (sigprocmask(SIG_BLOCK, &stop, nullptr) != 0) die("sigprocmask");
  const int sfd = signalfd(-1, &stop, SFD_CLOEXEC);
  const int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  if (sfd < 0 || tfd < 0 || ep < 0) die("signalfd/timerfd/epoll");
  for (int fd : {a, b, tfd, sfd}) addFd(ep, fd);

  std::printf("linkemu: ready tap-a=%s tap-b=%s\n", o.tap_a.c_str(), o.tap_b.c_str());
  std::fflush(stdout);

  bool running = true;
  while (running) {
    const Clock::time_point now = Clock::now();
    link.deliver(ab, now);
    link.deliver(ba, now);
    std::optional<Clock::time_point> next;
    for (const Direction* d : {&ab, &ba}) {
      if (!d->line.empty() && (!next || d->line.front().due < *next)) next = d->line.front().due;
    }
    arm(tfd, next);
    struct epoll_event evs[4];
    const int n = epoll_wait(ep, evs, 4, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("epoll_wait");
    }
    for (int i = 0; i < n; ++i) {
      const int fd = evs[i].data.fd;
      if (fd == a) {
        link.receive(ab);
      } else if (fd == b) {
        link.receive(ba);
      } else if (fd == tfd) {
        uint64_t expirations;
        (void)!read(tfd, &expirations, sizeof expirations);
      } else if (fd == sfd) {
        running = false;
      }
    }
  }
  for (const Direction* d : {&ab, &ba}) {
    std::fprintf(stderr,
                 "linkemu: %s frames=%llu bytes=%llu dropped_queue=%llu dropped_write=%llu "
                 "lost=%llu\n",
                 d->name, static_cast<unsigned long long>(d->frames),
                 static_cast<unsigned long long>(d->bytes),
                 static_cast<unsigned long long>(d->dropped_queue),
                 static_cast<unsigned long long>(d->dropped_write),
                 static_cast<unsigned long long>(d->lost));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Two TAP devices joined by an emulated link (delay, rate, queue, loss)"};
  app.add_option("--tap-a", o.tap_a, "The first TAP device's name (made here)")->required();
  app.add_option("--tap-b", o.tap_b, "The second TAP device's name (made here)")->required();
  app.add_option("--netns-a", o.netns_a, "Network namespace (/run/netns/NAME) of tap-a");
  app.add_option("--netns-b", o.netns_b, "Network namespace (/run/netns/NAME) of tap-b");
  app.add_option("--delay-ms", o.delay_ms, "One-way delay in ms, each direction (default 0)");
  app.add_option("--rate", o.rate, "Link rate in bytes/s, SI suffixes (default 0: unlimited)");
  app.add_option("--queue", o.queue, "Bytes held per direction before tail drop (default 64M)");
  app.add_option("--loss", o.loss_percent, "Percent of frames lost, each direction (default 0)")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--seed", o.seed, "Seed of the loss's random sequence (default 1)");
  app.add_option("--fifo", o.fifo, "SCHED_FIFO priority (1-99; default 0: normal scheduling)")
      ->check(CLI::Range(0, 99));
  app.add_flag("--offload", o.offload, "TAP offloads (TSO/GSO, checksum): frames up to 64 KiB");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return run(o);
}
