// `siphon capture`: packets matching a pcap filter, captured inside the
// target's network namespace by the agent (siphon/client/capture.h),
// written as a pcap file (a ksniff equivalent).
//
//   siphon capture [-i any|NAME] [-s SNAPLEN] [-c COUNT] -w FILE|- [FILTER...]
//
// The capture's pieces are the file: the global header, then one record per
// piece; they are written as they come. -w - writes to stdout (for
// `| tshark -r -`, `| wireshark -k -i -`). A reader slower than the traffic
// never slows the target: the agent drops what the client has no credit
// for and says so.
//
// Ending (signals: long_running.h): SIGINT/SIGTERM (or COUNT records
// written) finishes the capture; the agent sends what it still holds and
// ends it; the file is complete, exit 0. A second signal stops it at once
// (the file still holds whole records), exit 128+N.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/capture_file.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/long_running.h"
#include "siphon/client/capture.h"
#include "siphon/client/errors.h"
#include "siphon/status.h"

namespace siphon::cli {
namespace {

namespace asio = net::asio;
using client::CaptureEvent;
using client::ErrorCode;

constexpr uint32_t kCaptureWindow = 4 * 1024 * 1024;

struct CaptureFlags {
  std::string interface = "any";
  uint32_t snaplen = 0;  // 0: the agent's default (262144)
  uint64_t count = 0;    // 0: until interrupted
  std::string write;     // FILE, or "-" for stdout
  std::vector<std::string> filter;
};

// Where the pcap bytes go. A pipe or socket is written asynchronously (a
// slow reader must not stop the event loop, which also answers the agent's
// keepalives): the capture's credit, not this process, absorbs the delay. A
// regular file (or /dev/null) takes plain writes; epoll cannot wait on it.
class Output {
 public:
  explicit Output(asio::any_io_executor ex) : async_(ex) {}
  ~Output() { (void)close(); }

  // Opens FILE (created or truncated, 0644) or takes stdout for "-".
  absl::Status open(const std::string& path) {
    if (path == "-") {
      fd_ = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 0);
      if (fd_ < 0) return lastErrnoStatus("stdout");
      stdout_flags_ = ::fcntl(STDOUT_FILENO, F_GETFL);
    } else {
      fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd_ < 0) return lastErrnoStatus(absl::StrCat("cannot open ", path));
    }
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
      net::error_code ec;
      async_.assign(fd_, ec);
      if (!ec) fd_ = -1;  // owned by async_ now
    }
    return absl::OkStatus();
  }

  net::awaitable<absl::Status> write(std::string_view bytes) {
    if (async_.is_open()) {
      net::error_code ec;
      co_await asio::async_write(async_, asio::buffer(bytes.data(), bytes.size()),
                                 asio::redirect_error(net::use_awaitable, ec));
      if (ec) co_return errnoStatus(ec.value(), "write");
      co_return absl::OkStatus();
    }
    while (!bytes.empty()) {
      ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) co_return lastErrnoStatus("write");
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    co_return absl::OkStatus();
  }

  // Closes; an error of close() (NFS, a full disk) means lost data.
  absl::Status close() {
    absl::Status st;
    net::error_code ignored;
    if (async_.is_open()) async_.close(ignored);
    if (fd_ >= 0 && ::close(fd_) != 0) st = lastErrnoStatus("close");
    fd_ = -1;
    // Asio made our stdout non-blocking: the shell shares it.
    if (stdout_flags_ >= 0) ::fcntl(STDOUT_FILENO, F_SETFL, stdout_flags_);
    stdout_flags_ = -1;
    return st;
  }

 private:
  int fd_ = -1;
  int stdout_flags_ = -1;
  asio::posix::stream_descriptor async_;
};

net::awaitable<int> runCapture(const CommandEnv& env, const CaptureFlags& flags) {
  auto ex = co_await asio::this_coro::executor;
  const std::string filter = joinFilter(flags.filter);
  if (flags.write == "-" && ::isatty(STDOUT_FILENO)) {
    printError(
        "capture: refusing to write pcap data to a terminal; use -w FILE, or pipe stdout "
        "(-w - | tshark -r -)");
    co_return kExitUsage;
  }

  // Packets come in bursts (a TCP window's worth of 64 KiB GRO packets in
  // one ring block) and the agent drops what does not fit the credit at that
  // moment: a window as large as a stream's may grow absorbs them.
  client::CaptureSpec spec;
  spec.interface = flags.interface;
  spec.filter = filter;
  spec.snaplen = flags.snaplen;
  spec.window = kCaptureWindow;
  auto started = co_await client::Capture::start(env.target, std::move(spec));
  if (!started.ok()) {
    // The agent's words name the filter or interface and libpcap's reason.
    // A lost session is "agent unreachable"; anything the agent said about
    // the capture itself (a bad filter, no such interface) a plain error.
    printError(absl::StrCat("capture: ", started.status().message()));
    co_return streamExitCode(started.status());
  }
  client::Capture capture = *std::move(started);

  // Opened once the agent accepted, as tcpdump does: a bad filter leaves no
  // empty file behind.
  Output out(ex);
  if (absl::Status s = out.open(flags.write); !s.ok()) {
    capture.stop(ErrorCode::kCancelled, "the client cannot write its output");
    printError(absl::StrCat("capture: ", s.message()));
    co_return kExitError;
  }

  // A reader of stdout that goes away (`| head`) ends the capture; it is
  // not a signal to die of (LongRunning::start ignores SIGPIPE).
  // Its stderr is for status lines: the session's (resumed, handed over) go
  // there too.
  LongRunning run(env, "capture", LongRunning::toStderr());
  bool stopping = false;  // finished: what comes now is the rest
  int aborted_by = 0;     // a second signal: stopped by us
  auto stop = [&] {
    if (stopping) return;
    stopping = true;
    (void)capture.finish();
  };
  run.on_stop = [&](int) { stop(); };
  run.on_end = [&](int signo) {
    aborted_by = signo;
    capture.stop(ErrorCode::kCancelled, "interrupted twice");
  };
  run.start();

  std::optional<PcapHeader> header;
  CaptureTotals totals;
  int rc = kExitOk;
  while (true) {
    auto event = co_await capture.next();
    if (!event.ok()) {
      if (aborted_by == 0) {
        printError(absl::StrCat("capture: ", event.status().message()));
        rc = streamExitCode(event.status());
      }
      break;
    }
    if (!event->has_value()) break;  // the agent ended it: the capture is complete
    const CaptureEvent& e = **event;
    if (e.kind == CaptureEvent::Kind::kGap) {
      // Packets after COUNT were never wanted: their loss is no news.
      if (flags.count > 0 && totals.packets >= flags.count) continue;
      std::fputs(gapLine(e.gap_packets, e.gap_bytes).c_str(), stderr);
      if (e.gap_bytes > 0) {
        totals.slow_packets += e.gap_packets;
        totals.slow_bytes += e.gap_bytes;
      } else {
        totals.kernel_packets += e.gap_packets;
      }
      continue;
    }
    const std::string& bytes = e.bytes;
    const bool is_header = !header.has_value();
    absl::Status valid;
    if (is_header) {
      auto h = parsePcapHeader(bytes);
      valid = h.status();
      if (h.ok()) header = *h;
    } else {
      valid = checkPcapRecord(bytes, *header);
    }
    if (!valid.ok()) {
      capture.stop(ErrorCode::kProtocolError, std::string(valid.message()));
      printError(absl::StrCat("capture: ", valid.message()));
      rc = kExitError;
      break;
    }
    // Records that come after COUNT (sent before the agent saw our
    // half-close) are not wanted.
    if (!is_header && flags.count > 0 && totals.packets >= flags.count) continue;
    absl::Status w = co_await out.write(bytes);
    if (!w.ok()) {
      capture.stop(ErrorCode::kCancelled, "the client's output is closed");
      if (client::errnoValue(w) == EPIPE) break;  // the reader of stdout is done: so are we
      printError(absl::StrCat("capture: ", flags.write == "-" ? "stdout" : flags.write, ": ",
                              w.message()));
      rc = kExitError;
      break;
    }
    if (is_header) {
      // Packets flow from now on: a script may start its traffic.
      std::fputs(startedLine(flags.interface, *header, filter, flags.write).c_str(), stderr);
      std::fflush(stderr);
      continue;
    }
    ++totals.packets;
    totals.bytes += bytes.size();
    if (flags.count > 0 && totals.packets == flags.count) stop();
  }

  run.finish();
  if (absl::Status c = out.close(); !c.ok() && rc == kExitOk) {
    printError(absl::StrCat("capture: ", flags.write, ": ", c.message()));
    rc = kExitError;
  }
  if (header) std::fputs(summaryLine(totals, flags.write).c_str(), stderr);
  if (aborted_by != 0 && rc == kExitOk) rc = 128 + aborted_by;
  co_return rc;
}

}  // namespace

void addCaptureCommands(CLI::App& app, std::vector<Command>& out) {
  auto flags = std::make_shared<CaptureFlags>();
  CLI::App* capture = app.add_subcommand(
      "capture",
      "Capture packets inside the target's network namespace (libpcap on the agent) and write "
      "them as a pcap file; runs until SIGINT/SIGTERM or --count");
  capture
      ->add_option("-i,--interface", flags->interface,
                   "Interface inside the target: any (all of them), lo, eth0...")
      ->capture_default_str();
  capture
      ->add_option("-s,--snaplen", flags->snaplen,
                   "Bytes kept of each packet (0: 262144, the most)")
      ->check(CLI::Range(0u, 262144u));
  capture->add_option("-c,--count", flags->count, "Stop after this many packets")
      ->check(CLI::PositiveNumber);
  capture
      ->add_option("-w,--write", flags->write,
                   "Write the pcap file here; - for stdout (| tshark -r -)")
      ->required();
  capture->add_option("filter", flags->filter,
                      "pcap filter expression (as tcpdump takes it), e.g. tcp port 80; "
                      "several words are joined with spaces");
  out.push_back({capture, [flags](const CommandEnv& env) -> net::awaitable<int> {
                   co_return co_await runCapture(env, *flags);
                 }});
}

}  // namespace siphon::cli
