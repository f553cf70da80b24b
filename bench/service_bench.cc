// service_bench: the agent's file and DNS services, each measured beside a
// local baseline in the same run (issue 5). The machines are shared and
// noisy, so siphon and baseline runs alternate and the ratio is what counts.
//
//   service_bench --agent HOST:PORT [--token-file F] --scenario stat|fscat|dns
//                 [--count N] [--depth D] [--path P | --paths-dir DIR]
//                 [--name NAME] [--family any|4|6] [--chunk BYTES] [--pod-pid PID]
//                 [--repeat R]
//
//   stat   `count` lstat requests over the regular files of --paths-dir (a
//          path as the target sees it; listed once with opendir/readdir),
//          `depth` in flight. Baseline: lstat(2) of the same paths under
//          /proc/PID/root by this process, one after the other.
//   fscat  --path (as the target sees it) read with preads of the session's
//          max_read_size, `depth` in flight, the byte count checked against
//          fstat. Baseline: read(2) of /proc/PID/root/PATH with a 1 MiB
//          buffer. Nothing is dropped from the page cache: both read warm.
//   dns    `count` lookups of --name (--family: A and AAAA, or one), `depth`
//          in flight. Baseline: c-ares on a thread that entered the pod's
//          network namespace, configured from the pod's resolv.conf
//          (nameservers, search list, ndots), walking the search list as the
//          agent does with the same queries, same depth (see CaresLookups).
//
// PID is --pod-pid, else the agent's target (Welcome.target.pid). Each
// scenario runs one untimed warm-up of both sides, then --repeat rounds of
// one siphon and one baseline run, their order alternating.
//
// Output: one JSON object on stdout (schema below); notes go to stderr.
//   {"scenario", "unit" ("ops/s" or "MB/s", MB = 10^6 bytes), "ops" (stat,
//    dns) or "bytes" (fscat) per run, "seconds" (median siphon run), "rate"
//    (median siphon rate), "baseline_rate" (median), "ratio" (rate /
//    baseline_rate), "siphon" and "baseline": {"rates": [...], "seconds":
//    [...], "median", "min", "max"}, "ratios" (per round), "depth",
//    "repeat", "pod_pid", "agent", plus per scenario: "paths_dir", "paths"
//    (stat); "path", "chunk" (fscat); "name", "family", "resolved_as",
//    "address", "baseline_resolved_as", "baseline_address" (dns)}
//
// Exit status: 0 with the JSON; 1 when anything failed (agent unreachable,
// rejected token, a request that failed or answered wrongly, a baseline
// error): a message on stderr and no number at all; 2 for a usage error.
//
// Over 600 lines: each scenario's siphon run and its baseline are kept side by side so they measure the same thing.
#include <ares.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/options.h"
#include "siphon/client/client.h"
#include "siphon/status.h"
#include "siphon/transport/asio.h"

namespace siphon::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string agent;
  std::string token_file;
  std::string scenario;
  size_t count = 10000;
  size_t depth = 0;  // 0: the scenario's default
  std::string path;
  std::string paths_dir;
  std::string name;
  std::string family = "any";
  int pod_pid = 0;
  size_t repeat = 5;
  uint32_t chunk = 0;  // fscat: bytes per pread; 0: the session's max_read_size
};

constexpr size_t kDefaultDepth = 64;     // stat, dns
constexpr size_t kDefaultReadDepth = 8;  // fscat: reads of ~1 MiB in flight
constexpr size_t kLocalReadBuffer = 1 << 20;
constexpr uint32_t kDirBatch = 4096;

void note(std::string_view text) {
  std::fprintf(stderr, "service_bench: %.*s\n", static_cast<int>(text.size()), text.data());
}

// "context: message" with the code kept; the agent's own messages often
// start with the context already ("opendir /data: No such file...").
absl::Status annotate(const absl::Status& s, std::string_view context) {
  if (sv(s.message()).substr(0, context.size()) == context) return s;
  return absl::Status(s.code(), absl::StrCat(asv(context), ": ", s.message()));
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ------------------------------------------------------------ figures

// One timed run: `amount` ops or bytes in `secs`.
struct Run {
  double amount = 0;
  double secs = 0;
};

struct Series {
  std::vector<double> rates;
  std::vector<double> secs;
  double median = 0, min = 0, max = 0, median_secs = 0;
};

double medianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// `scale` turns an amount per second into the reported unit (1e-6 for MB/s).
Series summarize(const std::vector<Run>& runs, double scale) {
  Series s;
  for (const Run& r : runs) {
    s.rates.push_back(r.amount / r.secs * scale);
    s.secs.push_back(r.secs);
  }
  s.median = medianOf(s.rates);
  s.median_secs = medianOf(s.secs);
  s.min = *std::min_element(s.rates.begin(), s.rates.end());
  s.max = *std::max_element(s.rates.begin(), s.rates.end());
  return s;
}

// ------------------------------------------------------------ JSON

// Just enough JSON for one flat-ish object: keys in the order given.
class Json {
 public:
  Json() { out_ = "{"; }
  Json& key(std::string_view k) {
    comma();
    quoted(k);
    out_ += ":";
    need_comma_ = false;
    return *this;
  }
  Json& str(std::string_view v) {
    comma();
    quoted(v);
    need_comma_ = true;
    return *this;
  }
  Json& num(double v, int decimals) {
    comma();
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    out_ += buf;
    need_comma_ = true;
    return *this;
  }
  Json& integer(uint64_t v) {
    comma();
    absl::StrAppend(&out_, v);
    need_comma_ = true;
    return *this;
  }
  Json& begin(char bracket) {
    comma();
    out_ += bracket;
    need_comma_ = false;
    return *this;
  }
  Json& end(char bracket) {
    out_ += bracket;
    need_comma_ = true;
    return *this;
  }
  std::string take() {
    out_ += "}";
    return std::move(out_);
  }

 private:
  void comma() {
    if (need_comma_) out_ += ",";
    need_comma_ = false;
  }
  void quoted(std::string_view v) {
    out_ += '"';

    for (char c : v) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '"' || c == '\\') {
        out_ += '\\';
        out_ += c;
      } else if (u < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", u);
        out_ += buf;
      } else {
        out_ += c;
      }
    }
    out_ += '"';
  }
  std::string out_;
  bool need_comma_ = false;
};

void writeSeries(Json& j, std::string_view name, const Series& s, int decimals) {
  j.key(name).begin('{');
  j.key("rates").begin('[');
  for (double r : s.rates) j.num(r, decimals);
  j.end(']');
  j.key("seconds").begin('[');
  for (double t : s.secs) j.num(t, 6);
  j.end(']');
  j.key("median").num(s.median, decimals);
  j.key("min").num(s.min, decimals);
  j.key("max").num(s.max, decimals);
  j.end('}');
}

// The common fields; the caller adds the scenario's own and closes it.
void writeFigures(Json& j, const Options& o, int pid, const std::vector<Run>& siphon,
                  const std::vector<Run>& baseline, double scale, std::string_view unit) {
  const int decimals = scale == 1 ? 1 : 2;
  const Series s = summarize(siphon, scale);
  const Series b = summarize(baseline, scale);
  j.key("unit").str(unit);
  j.key("seconds").num(s.median_secs, 6);
  j.key("rate").num(s.median, decimals);
  j.key("baseline_rate").num(b.median, decimals);
  j.key("ratio").num(s.median / b.median, 4);
  writeSeries(j, "siphon", s, decimals);
  writeSeries(j, "baseline", b, decimals);
  j.key("ratios").begin('[');
  for (size_t i = 0; i < s.rates.size(); ++i) j.num(s.rates[i] / b.rates[i], 4);
  j.end(']');
  j.key("depth").integer(o.depth);
  j.key("repeat").integer(o.repeat);
  j.key("pod_pid").integer(static_cast<uint64_t>(pid));
  j.key("agent").str(o.agent);
}

// ------------------------------------------------------------ pipelining

// Runs ops 0..n-1 of `Op` (a callable: net::awaitable<absl::Status>(size_t))
// with `depth` workers, each taking the next index when its op is answered:
// `depth` requests stay in flight until the last ones. The first error stops
// new ops and is the result.
template <typename Op>
struct Pipeline {
  Pipeline(net::asio::any_io_executor ex, Op& o, size_t count) : op(o), n(count), done(ex) {}
  Op& op;
  size_t n;
  size_t next = 0;
  size_t live = 0;
  absl::Status error;
  net::Signal done;
};

template <typename Op>
net::awaitable<void> pipelineWorker(Pipeline<Op>& p) {
  try {
    while (p.next < p.n && p.error.ok()) {
      const size_t i = p.next++;
      absl::Status s = co_await p.op(i);
      if (!s.ok() && p.error.ok()) p.error = std::move(s);
    }
  } catch (const std::exception& e) {
    if (p.error.ok()) p.error = absl::InternalError(e.what());
  }
  if (--p.live == 0) p.done.notify();
}

template <typename Op>
net::awaitable<absl::StatusOr<Run>> runPipelined(Op& op, size_t n, size_t depth) {
  auto ex = co_await net::asio::this_coro::executor;
  Pipeline<Op> p(ex, op, n);
  const auto start = Clock::now();
  p.live = std::max<size_t>(1, std::min(depth, n));
  const size_t workers = p.live;
  for (size_t i = 0; i < workers; ++i) {
    net::asio::co_spawn(ex, pipelineWorker(p), net::asio::detached);
  }
  // `live` is checked first: all of this runs on one thread, so a worker can
  // only notify while this coroutine waits.
  while (p.live > 0) co_await p.done.wait();
  const auto elapsed = Clock::now() - start;
  if (!p.error.ok()) co_return p.error;
  co_return Run{static_cast<double>(n), seconds(elapsed)};
}

// ------------------------------------------------------------ agent side

net::awaitable<absl::StatusOr<v1::FileResponse>> fileCall(client::Client& client,
                                                          v1::FileRequest fr) {
  v1::Request req;
  *req.mutable_file() = std::move(fr);
  auto r = co_await client.call(std::move(req));
  if (!r.ok()) co_return r.status();
  if (!r->has_file()) {
    co_return absl::InternalError("the agent answered with another kind of response");
  }
  co_return std::move(*r->mutable_file());
}

// The regular files of `dir` (as the target sees it), by name.
net::awaitable<absl::StatusOr<std::vector<std::string>>> listDir(client::Client& client,
                                                                 const std::string& dir) {
  v1::FileRequest open;
  open.mutable_opendir()->set_path(dir);
  auto opened = co_await fileCall(client, std::move(open));
  if (!opened.ok()) co_return annotate(opened.status(), absl::StrCat("opendir ", dir));
  const uint64_t handle = opened->opened().fd();
  std::vector<std::string> names;
  absl::Status failure;
  for (bool eof = false; !eof;) {
    v1::FileRequest rd;
    rd.mutable_readdir()->set_dir(handle);
    rd.mutable_readdir()->set_max_entries(kDirBatch);
    auto batch = co_await fileCall(client, std::move(rd));
    if (!batch.ok()) {
      failure = annotate(batch.status(), absl::StrCat("readdir ", dir));
      break;
    }
    for (const auto& e : batch->entries().entries()) {
      if (e.type() == DT_REG) names.push_back(e.name());
    }
    eof = batch->entries().eof() || batch->entries().entries_size() == 0;
  }
  v1::FileRequest close;
  close.mutable_closedir()->set_dir(handle);
  auto closed = co_await fileCall(client, std::move(close));
  if (failure.ok() && !closed.ok()) failure = annotate(closed.status(), "closedir");
  if (!failure.ok()) co_return failure;
  std::sort(names.begin(), names.end());
  co_return names;
}

struct StatOp {
  client::Client& client;
  const std::vector<std::string>& paths;

  net::awaitable<absl::Status> operator()(size_t i) {
    const std::string& path = paths[i % paths.size()];
    v1::FileRequest fr;
    fr.mutable_stat()->set_path(path);
    fr.mutable_stat()->set_follow_symlinks(false);
    auto r = co_await fileCall(client, std::move(fr));
    if (!r.ok()) co_return annotate(r.status(), absl::StrCat("stat ", path));
    if (!r->has_stat() || !S_ISREG(r->stat().mode())) {
      co_return absl::InternalError(absl::StrCat("stat ", path, ": not a regular file's stat"));
    }
    co_return absl::OkStatus();
  }
};

// Chunk i of an open file: pread(chunk, i * chunk), whose length must be all
// that is left of `size` up to one chunk.
struct ReadOp {
  client::Client& client;
  uint64_t fd;
  int64_t size;
  uint32_t chunk;
  uint64_t bytes = 0;

  net::awaitable<absl::Status> operator()(size_t i) {
    const int64_t offset = static_cast<int64_t>(i) * chunk;
    const int64_t want = std::min<int64_t>(chunk, size - offset);
    v1::FileRequest fr;
    fr.mutable_pread()->set_fd(fd);
    fr.mutable_pread()->set_size(chunk);
    fr.mutable_pread()->set_offset(offset);
    auto r = co_await fileCall(client, std::move(fr));
    if (!r.ok()) co_return annotate(r.status(), absl::StrCat("pread at ", offset));
    if (!r->has_data() || static_cast<int64_t>(r->data().data().size()) != want) {
      co_return absl::DataLossError(absl::StrCat("pread at ", offset, ": ", r->data().data().size(),
                                                 " bytes, expected ", want));
    }
    bytes += r->data().data().size();
    co_return absl::OkStatus();
  }
};

struct DnsOp {
  client::Client& client;
  const std::string& name;
  v1::AddressFamily family;
  std::string canonical;  // of the first answer
  std::string address;

  net::awaitable<absl::Status> operator()(size_t) {
    v1::Request req;
    req.mutable_dns()->mutable_lookup()->set_name(name);
    req.mutable_dns()->mutable_lookup()->set_family(family);
    auto r = co_await client.call(std::move(req));
    if (!r.ok()) co_return annotate(r.status(), absl::StrCat("dns lookup ", name));
    if (!r->has_dns()) {
      co_return absl::InternalError("the agent answered with another kind of response");
    }
    const v1::DnsResponse& d = r->dns();
    if (d.status() != v1::DNS_OK || d.addresses_size() == 0) {
      co_return absl::NotFoundError(absl::StrCat("dns lookup ", name, ": ",
                                                 v1::DnsStatus_Name(d.status()),
                                                 ", addresses: ", d.addresses_size()));
    }
    if (address.empty()) {
      address = d.addresses(0);
      if (d.names_size() > 0) canonical = d.names(0);
    }
    co_return absl::OkStatus();
  }
};

// ------------------------------------------------------------ local baselines

std::string podPath(int pid, const std::string& path) {
  return absl::StrCat("/proc/", pid, "/root", path.empty() || path[0] != '/' ? "/" : "", path);
}

absl::StatusOr<Run> localStat(const std::vector<std::string>& paths, size_t n) {
  struct stat st;
  const auto start = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    const std::string& p = paths[i % paths.size()];
    if (::lstat(p.c_str(), &st) != 0) return lastErrnoStatus(absl::StrCat("lstat ", p));
  }
  return Run{static_cast<double>(n), seconds(Clock::now() - start)};
}

absl::StatusOr<Run> localRead(const std::string& path, int64_t expected) {
  std::vector<char> buf(kLocalReadBuffer);
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return lastErrnoStatus(absl::StrCat("open ", path));
  int64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status s = lastErrnoStatus(absl::StrCat("read ", path));
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    total += n;
  }
  ::close(fd);
  const auto elapsed = Clock::now() - start;
  if (total != expected) {
    return absl::DataLossError(
        absl::StrCat("read ", path, ": ", total, " bytes, expected ", expected));
  }
  return Run{static_cast<double>(total), seconds(elapsed)};
}

// c-ares lookups, `depth` in flight, on the calling thread (which must be in
// the pod's network namespace: c-ares makes its sockets when it first sends).
//
// Each lookup walks the search list as glibc's res_nsearch (and the agent)
// does, asking A and AAAA of each name with ares_query and stopping at the
// first name that has addresses; NXDOMAIN, NODATA and SERVFAIL go on to the
// next name. Not ares_getaddrinfo: its walk differs in when it stops, and the
// baseline must send what the agent sends. One try per query: c-ares 1.18
// asks a server that answered REFUSED or SERVFAIL again, `tries` (4) times,
// where glibc and the agent skip it for the rest of the query; dnsmasq
// answers REFUSED to the AAAA of a name it only has an --address=IPv4 for,
// so the default would send five queries per lookup to the agent's two.
// The nameservers, search list and ndots come from the pod's resolv.conf as
// c-ares parses it; its hosts file is not read (the agent reads the pod's).
class CaresLookups {
 public:
  CaresLookups(std::string name, int family, size_t n, size_t depth)
      : name_(std::move(name)), family_(family), n_(n), depth_(depth) {}
  ~CaresLookups() {
    if (channel_ != nullptr) ares_destroy(channel_);
  }

  absl::Status init(const std::string& resolv_conf) {
    ares_options o{};
    std::string path = resolv_conf;
    char lookups[] = "b";
    o.resolvconf_path = path.data();
    o.lookups = lookups;
    o.tries = 1;
    int rc =
        ares_init_options(&channel_, &o, ARES_OPT_RESOLVCONF | ARES_OPT_LOOKUPS | ARES_OPT_TRIES);
    if (rc != ARES_SUCCESS) {
      channel_ = nullptr;
      return absl::InternalError(
          absl::StrCat("ares_init_options with ", resolv_conf, ": ", ares_strerror(rc)));
    }
    ares_options saved{};
    int mask = 0;
    rc = ares_save_options(channel_, &saved, &mask);
    if (rc != ARES_SUCCESS) {
      return absl::InternalError(absl::StrCat("ares_save_options: ", ares_strerror(rc)));
    }
    std::vector<std::string> domains;
    for (int i = 0; i < saved.ndomains; ++i) domains.emplace_back(saved.domains[i]);
    const int ndots = saved.ndots;
    ares_destroy_options(&saved);
    // res_nsearch's order: a trailing dot is absolute; a name with at least
    // ndots dots is tried as it is first, else after the search list.
    if (!name_.empty() && name_.back() == '.') {
      candidates_.push_back(name_.substr(0, name_.size() - 1));
    } else {
      const bool as_is_first = std::count(name_.begin(), name_.end(), '.') >= ndots;
      if (as_is_first) candidates_.push_back(name_);
      for (const auto& d : domains) candidates_.push_back(absl::StrCat(name_, ".", d));
      if (!as_is_first) candidates_.push_back(name_);
    }
    walk_ =
        absl::StrCat("ndots ", ndots, ", names tried in order: ", absl::StrJoin(candidates_, " "));
    return absl::OkStatus();
  }

  absl::StatusOr<Run> run() {
    lookups_.assign(std::min(depth_, n_), Lookup{});
    const auto start = Clock::now();
    for (Lookup& l : lookups_) begin(l);
    while (answered_ < issued_) {
      ares_socket_t socks[ARES_GETSOCK_MAXNUM];
      const int bits = ares_getsock(channel_, socks, ARES_GETSOCK_MAXNUM);
      pollfd fds[ARES_GETSOCK_MAXNUM];
      int nfds = 0;
      for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
        const bool r = ARES_GETSOCK_READABLE(bits, i);
        const bool w = ARES_GETSOCK_WRITABLE(bits, i);
        if (!r && !w) continue;
        fds[nfds++] = pollfd{socks[i], static_cast<short>((r ? POLLIN : 0) | (w ? POLLOUT : 0)), 0};
      }
      timeval tv{};
      timeval* t = ares_timeout(channel_, nullptr, &tv);
      const int ms = t == nullptr ? 1000 : static_cast<int>(t->tv_sec * 1000 + t->tv_usec / 1000);
      const int ready = ::poll(fds, static_cast<nfds_t>(nfds), ms);
      if (ready < 0 && errno != EINTR) return lastErrnoStatus("poll");
      if (ready <= 0) {
        ares_process_fd(channel_, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // timeouts
        continue;
      }
      for (int i = 0; i < nfds; ++i) {
        if (fds[i].revents == 0) continue;
        const bool r = (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) != 0;
        const bool w = (fds[i].revents & POLLOUT) != 0;
        ares_process_fd(channel_, r ? fds[i].fd : ARES_SOCKET_BAD, w ? fds[i].fd : ARES_SOCKET_BAD);
      }
    }
    const auto elapsed = Clock::now() - start;
    if (!error_.ok()) return error_;
    return Run{static_cast<double>(n_), seconds(elapsed)};
  }

  const std::string& canonical() const { return canonical_; }
  const std::string& walk() const { return walk_; }
  std::string address() const { return first_a_.empty() ? first_aaaa_ : first_a_; }

 private:
  // One lookup slot; it starts the next lookup when its own ends.
  struct Lookup {
    size_t candidate = 0;
    int pending = 0;
    bool found = false;
    int status = ARES_SUCCESS;  // the last failure of the current name
  };
  struct Query {
    CaresLookups* self;
    Lookup* lookup;
    int type;
  };

  void begin(Lookup& l) {
    ++issued_;
    l = Lookup{};
    ask(l);
  }

  // A and/or AAAA of the lookup's current name.
  void ask(Lookup& l) {
    const std::string& name = candidates_[l.candidate];
    const bool a = family_ != AF_INET6, aaaa = family_ != AF_INET;
    l.pending = (a ? 1 : 0) + (aaaa ? 1 : 0);
    l.found = false;
    l.status = ARES_SUCCESS;
    // Both queries are registered before either can answer: ares_query only
    // sends, answers come from ares_process_fd.
    if (a)
      ares_query(channel_, name.c_str(), 1 /*C_IN*/, 1 /*T_A*/, &answered, new Query{this, &l, 1});
    if (aaaa) {
      ares_query(channel_, name.c_str(), 1 /*C_IN*/, 28 /*T_AAAA*/, &answered,
                 new Query{this, &l, 28});
    }
  }

  static void answered(void* arg, int status, int /*timeouts*/, unsigned char* abuf, int alen) {
    std::unique_ptr<Query> q(static_cast<Query*>(arg));
    CaresLookups* self = q->self;
    Lookup& l = *q->lookup;
    if (status == ARES_SUCCESS) status = self->parse(q->type, abuf, alen);
    if (status == ARES_SUCCESS) {
      l.found = true;
    } else {
      l.status = status;
    }
    if (--l.pending > 0) return;
    if (status == ARES_EDESTRUCTION) return;
    if (!l.found) {
      const bool next =
          l.status == ARES_ENOTFOUND || l.status == ARES_ENODATA || l.status == ARES_ESERVFAIL;
      if (next && l.candidate + 1 < self->candidates_.size()) {
        ++l.candidate;
        self->ask(l);
        return;
      }
      if (self->error_.ok()) {
        self->error_ = absl::NotFoundError(
            absl::StrCat("c-ares lookup ", self->name_, ": ", ares_strerror(l.status)));
      }
    }
    ++self->answered_;
    if (self->error_.ok() && self->issued_ < self->n_) self->begin(l);
  }

  // ARES_SUCCESS when the answer holds addresses of `type`.
  int parse(int type, const unsigned char* abuf, int alen) {
    hostent* host = nullptr;
    ares_addrttl a[8];
    ares_addr6ttl aaaa[8];
    int count = 8;
    const int rc = type == 1 ? ares_parse_a_reply(abuf, alen, &host, a, &count)
                             : ares_parse_aaaa_reply(abuf, alen, &host, aaaa, &count);
    if (rc == ARES_SUCCESS && count == 0) {
      if (host != nullptr) ares_free_hostent(host);
      return ARES_ENODATA;
    }
    if (rc == ARES_SUCCESS) {
      std::string& first = type == 1 ? first_a_ : first_aaaa_;
      if (first.empty()) {
        char buf[INET6_ADDRSTRLEN] = {};
        if (type == 1) {
          inet_ntop(AF_INET, &a[0].ipaddr, buf, sizeof buf);
        } else {
          inet_ntop(AF_INET6, &aaaa[0].ip6addr, buf, sizeof buf);
        }
        first = buf;
        if (canonical_.empty() && host != nullptr && host->h_name != nullptr) {
          canonical_ = host->h_name;
        }
      }
    }
    if (host != nullptr) ares_free_hostent(host);
    return rc;
  }

  std::string name_;
  int family_;
  size_t n_;
  size_t depth_;
  std::vector<std::string> candidates_;
  std::string walk_;
  std::vector<Lookup> lookups_;  // never resized while queries point into it
  ares_channel channel_ = nullptr;
  size_t issued_ = 0;
  size_t answered_ = 0;
  absl::Status error_;
  std::string canonical_;
  std::string first_a_;
  std::string first_aaaa_;
};

struct CaresResult {
  absl::StatusOr<Run> run = absl::UnknownError("not run");
  std::string canonical;
  std::string address;
  std::string walk;  // the search list walk c-ares was given
};

// On a thread of its own: setns() changes the namespace of the calling
// thread only, and every c-ares socket must be made in the pod's netns.
CaresResult caresBaseline(int pid, const std::string& name, int family, size_t n, size_t depth) {
  CaresResult out;
  std::thread t([&] {
    const std::string ns = absl::StrCat("/proc/", pid, "/ns/net");
    const int fd = ::open(ns.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      out.run = lastErrnoStatus(absl::StrCat("open ", ns));
      return;
    }
    const int rc = ::setns(fd, CLONE_NEWNET);
    const int err = errno;
    ::close(fd);
    if (rc != 0) {
      out.run = errnoStatus(err, absl::StrCat("setns ", ns));
      return;
    }
    CaresLookups lookups(name, family, n, depth);
    if (absl::Status s = lookups.init(absl::StrCat("/proc/", pid, "/root/etc/resolv.conf"));
        !s.ok()) {
      out.run = s;
      return;
    }
    out.walk = lookups.walk();
    out.run = lookups.run();
    out.canonical = lookups.canonical();
    out.address = lookups.address();
  });
  t.join();
  return out;
}

// ------------------------------------------------------------ scenarios

// Rounds of one siphon and one baseline run, the order alternating so drift
// on the machine touches both; an untimed warm-up of each comes first.
// SiphonRun: net::awaitable<absl::StatusOr<Run>>(); BaselineRun: absl::StatusOr<Run>().
template <typename SiphonRun, typename BaselineRun>
net::awaitable<absl::Status> rounds(const Options& o, SiphonRun& siphon, BaselineRun& baseline,
                                    std::vector<Run>* s_runs, std::vector<Run>* b_runs) {
  {
    auto w = co_await siphon();
    if (!w.ok()) co_return annotate(w.status(), "warm-up through the agent");
    auto b = baseline();
    if (!b.ok()) co_return annotate(b.status(), "warm-up of the baseline");
  }
  for (size_t r = 0; r < o.repeat; ++r) {
    for (int k = 0; k < 2; ++k) {
      const bool siphon_turn = (k == 0) == (r % 2 == 0);
      if (siphon_turn) {
        auto s = co_await siphon();
        if (!s.ok()) co_return annotate(s.status(), absl::StrCat("round ", r + 1, " via agent"));
        s_runs->push_back(*s);
      } else {
        auto b = baseline();
        if (!b.ok()) co_return annotate(b.status(), absl::StrCat("round ", r + 1, " baseline"));
        b_runs->push_back(*b);
      }
    }
    note(absl::StrCat(o.scenario, " round ", r + 1, "/", o.repeat, ": siphon ",
                      s_runs->back().amount / s_runs->back().secs, "/s, baseline ",
                      b_runs->back().amount / b_runs->back().secs, "/s"));
  }
  co_return absl::OkStatus();
}

net::awaitable<absl::StatusOr<std::string>> statScenario(client::Client& client, const Options& o,
                                                         int pid) {
  auto names = co_await listDir(client, o.paths_dir);
  if (!names.ok()) co_return names.status();
  if (names->empty()) {
    co_return absl::NotFoundError(absl::StrCat(o.paths_dir, " holds no regular file"));
  }
  std::vector<std::string> remote, local;
  for (const auto& n : *names) {
    remote.push_back(o.paths_dir.back() == '/' ? o.paths_dir + n
                                               : absl::StrCat(o.paths_dir, "/", n));
    local.push_back(podPath(pid, remote.back()));
  }
  note(absl::StrCat("stat: ", remote.size(), " files in ", o.paths_dir));

  StatOp op{client, remote};
  auto siphon = [&]() { return runPipelined(op, o.count, o.depth); };
  auto baseline = [&]() { return localStat(local, o.count); };
  std::vector<Run> s, b;
  CO_RETURN_IF_ERROR(co_await rounds(o, siphon, baseline, &s, &b));

  Json j;
  j.key("scenario").str("stat");
  j.key("ops").integer(o.count);
  writeFigures(j, o, pid, s, b, 1, "ops/s");
  j.key("paths_dir").str(o.paths_dir);
  j.key("paths").integer(remote.size());
  co_return j.take();
}

net::awaitable<absl::StatusOr<std::string>> fscatScenario(client::Client& client, const Options& o,
                                                          int pid) {
  v1::FileRequest open;
  open.mutable_open()->set_path(o.path);
  open.mutable_open()->set_flags(O_RDONLY);
  auto opened = co_await fileCall(client, std::move(open));
  if (!opened.ok()) co_return annotate(opened.status(), absl::StrCat("open ", o.path));
  const uint64_t fd = opened->opened().fd();
  v1::FileRequest fstat;
  fstat.mutable_fstat()->set_fd(fd);
  auto st = co_await fileCall(client, std::move(fstat));
  if (!st.ok()) co_return annotate(st.status(), absl::StrCat("fstat ", o.path));
  if (!S_ISREG(st->stat().mode()) || st->stat().size() <= 0) {
    co_return absl::InvalidArgumentError(absl::StrCat(o.path, " is not a non-empty regular file"));
  }
  const int64_t size = st->stat().size();
  // The largest read one request may carry, kept to whole pages.
  const uint32_t max_read = client.welcome().limits().max_read_size();
  uint32_t chunk = max_read == 0 ? 64 * 1024 : max_read;
  if (chunk > 4096) chunk -= chunk % 4096;
  if (o.chunk != 0) {
    // A larger read would come back clamped: the byte count check would fail.
    if (max_read != 0 && o.chunk > max_read) {
      co_return absl::InvalidArgumentError(
          absl::StrCat("--chunk ", o.chunk, " is above the session's max_read_size ", max_read));
    }
    chunk = o.chunk;
  }
  const size_t chunks = static_cast<size_t>((size + chunk - 1) / chunk);
  note(absl::StrCat("fscat: ", o.path, " is ", size, " bytes, ", chunks, " preads of ", chunk));

  ReadOp op{client, fd, size, chunk, 0};
  auto siphon = [&]() -> net::awaitable<absl::StatusOr<Run>> {
    op.bytes = 0;
    return runPipelined(op, chunks, o.depth);
  };
  const std::string local = podPath(pid, o.path);
  auto baseline = [&]() { return localRead(local, size); };
  std::vector<Run> s, b;
  absl::Status status = co_await rounds(o, siphon, baseline, &s, &b);
  if (status.ok() && op.bytes != static_cast<uint64_t>(size)) {
    status = absl::DataLossError(absl::StrCat("read ", op.bytes, " bytes, expected ", size));
  }
  v1::FileRequest close;
  close.mutable_close()->set_fd(fd);
  auto closed = co_await fileCall(client, std::move(close));
  if (status.ok() && !closed.ok()) status = annotate(closed.status(), "close");
  CO_RETURN_IF_ERROR(status);
  // Runs count chunks as ops: make them bytes.
  for (Run& r : s) r.amount = static_cast<double>(size);

  Json j;
  j.key("scenario").str("fscat");
  j.key("bytes").integer(static_cast<uint64_t>(size));
  writeFigures(j, o, pid, s, b, 1e-6, "MB/s");
  j.key("path").str(o.path);
  j.key("chunk").integer(chunk);
  co_return j.take();
}

net::awaitable<absl::StatusOr<std::string>> dnsScenario(client::Client& client, const Options& o,
                                                        int pid) {
  v1::AddressFamily family = v1::ADDRESS_FAMILY_UNSPECIFIED;
  int ai_family = AF_UNSPEC;
  if (o.family == "4") {
    family = v1::ADDRESS_FAMILY_INET;
    ai_family = AF_INET;
  } else if (o.family == "6") {
    family = v1::ADDRESS_FAMILY_INET6;
    ai_family = AF_INET6;
  }
  if (int rc = ares_library_init(ARES_LIB_INIT_ALL); rc != ARES_SUCCESS) {
    co_return absl::InternalError(absl::StrCat("ares_library_init: ", ares_strerror(rc)));
  }
  DnsOp op{client, o.name, family, {}, {}};
  auto siphon = [&]() { return runPipelined(op, o.count, o.depth); };
  std::string b_canonical, b_address;
  auto baseline = [&]() -> absl::StatusOr<Run> {
    CaresResult r = caresBaseline(pid, o.name, ai_family, o.count, o.depth);
    if (b_canonical.empty()) note(absl::StrCat("c-ares in the pod: ", r.walk));
    b_canonical = r.canonical;
    b_address = r.address;
    return r.run;
  };
  std::vector<Run> s, b;
  absl::Status status = co_await rounds(o, siphon, baseline, &s, &b);
  ares_library_cleanup();
  CO_RETURN_IF_ERROR(status);
  if (op.address != b_address) {
    note(absl::StrCat("warning: the agent answered ", op.address, " (", op.canonical,
                      "), c-ares in the pod ", b_address, " (", b_canonical, ")"));
  }

  Json j;
  j.key("scenario").str("dns");
  j.key("ops").integer(o.count);
  writeFigures(j, o, pid, s, b, 1, "ops/s");
  j.key("name").str(o.name);
  j.key("family").str(o.family);
  j.key("resolved_as").str(op.canonical);
  j.key("address").str(op.address);
  j.key("baseline_resolved_as").str(b_canonical);
  j.key("baseline_address").str(b_address);
  co_return j.take();
}

net::awaitable<absl::StatusOr<std::string>> runBench(const Options& o, std::string token) {
  auto ex = co_await net::asio::this_coro::executor;
  client::ClientOptions options;
  options.endpoints = {o.agent};
  options.token = std::move(token);
  options.client_name = "service_bench";
  // A cut transport fails the run instead of hiding in a resumed session.
  options.reconnect = false;
  auto client = client::Client::create(ex, std::move(options));
  absl::Status connected = co_await client->connect();
  if (!connected.ok()) co_return annotate(connected, absl::StrCat("connect to ", o.agent));

  int pid = o.pod_pid;
  const int target = client->welcome().target().pid();
  if (pid == 0) pid = target;
  if (pid <= 0) {
    client->close();
    co_return absl::InvalidArgumentError("the agent names no target pid: give --pod-pid");
  }
  if (target != 0 && target != pid) {
    note(absl::StrCat("warning: --pod-pid ", pid, " but the agent's target is ", target));
  }
  note(absl::StrCat("connected to ", client->endpoint(), " (agent ",
                    client->welcome().agent_version(), ", target pid ", target, "), max_read_size ",
                    client->welcome().limits().max_read_size()));

  absl::StatusOr<std::string> out = absl::UnknownError("no scenario");
  if (o.scenario == "stat") {
    out = co_await statScenario(*client, o, pid);
  } else if (o.scenario == "fscat") {
    out = co_await fscatScenario(*client, o, pid);
  } else {
    out = co_await dnsScenario(*client, o, pid);
  }
  client->close();
  co_return out;
}

int realMain(int argc, char** argv) {
  Options o;
  CLI::App app{"Siphon file and DNS service benchmark, beside local baselines"};
  app.add_option("--agent", o.agent, "Agent endpoint HOST:PORT")->required();
  app.add_option("--token-file", o.token_file,
                 "File holding the agent's token (else env SIPHON_TOKEN, else none)");
  app.add_option("--scenario", o.scenario, "stat, fscat or dns")
      ->required()
      ->check(CLI::IsMember({"stat", "fscat", "dns"}));
  app.add_option("--count", o.count, "stat: stats per run; dns: lookups per run")
      ->check(CLI::PositiveNumber);
  app.add_option("--depth", o.depth, "Requests in flight (default 64; fscat 8)")
      ->check(CLI::PositiveNumber);
  auto* path = app.add_option("--path", o.path, "fscat: the file, as the target sees it");
  auto* dir =
      app.add_option("--paths-dir", o.paths_dir, "stat: directory of files, as the target sees it");
  path->excludes(dir);
  app.add_option("--name", o.name, "dns: the name to look up");
  app.add_option("--family", o.family, "dns: any, 4 or 6")->check(CLI::IsMember({"any", "4", "6"}));
  app.add_option("--pod-pid", o.pod_pid, "The pod's pid (default: the agent's target)")
      ->check(CLI::PositiveNumber);
  app.add_option("--chunk", o.chunk,
                 "fscat: bytes per read (default: the largest the agent allows)")
      ->check(CLI::PositiveNumber);
  app.add_option("--repeat", o.repeat, "Rounds of siphon and baseline runs")
      ->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto usage = [](std::string_view why) {
    note(why);
    return 2;
  };
  if (o.scenario == "stat" && o.paths_dir.empty()) return usage("stat needs --paths-dir");
  if (o.scenario == "fscat" && o.path.empty()) return usage("fscat needs --path");
  if (o.scenario == "dns" && o.name.empty()) return usage("dns needs --name");
  if (o.depth == 0) o.depth = o.scenario == "fscat" ? kDefaultReadDepth : kDefaultDepth;

  std::string token;
  if (!o.token_file.empty()) {
    auto t = cli::readTokenFile(o.token_file);
    if (!t.ok()) {
      note(sv(t.status().message()));
      return 1;
    }
    token = *std::move(t);
  } else if (const char* env = std::getenv("SIPHON_TOKEN"); env != nullptr) {
    token = env;
  }

  net::asio::io_context io(1);
  std::optional<absl::StatusOr<std::string>> result;
  net::asio::co_spawn(io, runBench(o, std::move(token)),
                      [&result, &io](std::exception_ptr e, absl::StatusOr<std::string> r) {
                        if (e) {
                          try {
                            std::rethrow_exception(e);
                          } catch (const std::exception& ex) {
                            r = absl::InternalError(ex.what());
                          }
                        }
                        result = std::move(r);
                        // The client's transport coroutines may outlive
                        // close() by a moment: nothing is left to wait for.
                        io.stop();
                      });
  io.run();
  if (!result) {
    note("the benchmark ended without a result");
    return 1;
  }
  if (!result->ok()) {
    note(absl::StrCat("failed: ", result->status().message()));
    return 1;
  }
  std::printf("%s\n", (*result)->c_str());
  return 0;
}

}  // namespace
}  // namespace siphon::bench

int main(int argc, char** argv) { return siphon::bench::realMain(argc, argv); }
