#include "loader/probe_program.h"

#include <bpf/libbpf.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "lib/shared_types.h"
#include "loader/libbpf_log.h"
#include "probe.skel.h"
#include "siphon/status.h"

namespace siphon::bpf {
namespace {

// The map value layout must be identical on both sides of the map.
static_assert(sizeof(probe_counters) == 24, "probe_counters changed: update ProbeCounters");
static_assert(sizeof(ProbeCounters) == sizeof(probe_counters));
// The global the loader writes must keep the width of the option.
static_assert(sizeof(probe_bpf::probe_bpf__rodata::source_port) ==
              sizeof(ProbeProgram::Options::source_port));

}  // namespace

absl::StatusOr<std::unique_ptr<ProbeProgram>> ProbeProgram::load(const Options& options) {
  routeLibbpfLogs();

  // libbpf 1.x: NULL with errno set on failure.
  probe_bpf* skel = probe_bpf__open();
  if (skel == nullptr) return lastErrnoStatus("open probe.bpf.o (embedded skeleton)");
  // Owned from here on, so every error path below destroys it.
  std::unique_ptr<ProbeProgram> program(new ProbeProgram(skel));

  skel->rodata->source_port = options.source_port;

  if (int err = probe_bpf__load(skel); err != 0) {
    std::string context = "load probe.bpf.o";
    if (err == -EPERM || err == -EACCES) {
      absl::StrAppend(&context, " (needs CAP_BPF or CAP_SYS_ADMIN)");
    }
    return errnoStatus(-err, context);
  }
  return program;
}

ProbeProgram::ProbeProgram(probe_bpf* skel) : skel_(skel) {}

ProbeProgram::~ProbeProgram() { probe_bpf__destroy(skel_); }

absl::Status ProbeProgram::attachToSocket(int fd) {
  int prog_fd = bpf_program__fd(skel_->progs.count_udp);
  if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_BPF, &prog_fd, sizeof(prog_fd)) != 0) {
    return lastErrnoStatus(absl::StrCat("attach probe to socket fd ", fd));
  }
  return absl::OkStatus();
}

absl::Status ProbeProgram::detachFromSocket(int fd) {
  // The option value is ignored by the kernel but must be readable.
  int unused = 0;
  if (setsockopt(fd, SOL_SOCKET, SO_DETACH_BPF, &unused, sizeof(unused)) != 0) {
    return lastErrnoStatus(absl::StrCat("detach filter from socket fd ", fd));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProbeCounters> ProbeProgram::counters() const {
  uint32_t key = 0;
  probe_counters value{};
  if (int err = bpf_map__lookup_elem(skel_->maps.counters, &key, sizeof(key), &value, sizeof(value),
                                     /*flags=*/0);
      err != 0) {
    return errnoStatus(-err, "read probe counters map");
  }
  return ProbeCounters{
      .packets = value.packets,
      .payload_bytes = value.payload_bytes,
      .ignored = value.ignored,
  };
}

absl::StatusOr<uint64_t> ProbeProgram::count() const {
  ASSIGN_OR_RETURN(ProbeCounters c, counters());
  return c.packets;
}

}  // namespace siphon::bpf
