#include "loader/steal_program.h"

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
#include "siphon/status.h"
#include "steal.skel.h"

namespace siphon::bpf {
namespace {

// The map key layout must be identical on both sides of the map.
static_assert(sizeof(steal_passthrough_key) == 4, "steal_passthrough_key changed");
static_assert(sizeof(steal_source_key) == 20, "steal_source_key changed");
static_assert(STEAL_LISTENER_V4 == 0 && STEAL_LISTENER_V6 == 1);

absl::Status checkFamily(int family) {
  if (family == AF_INET || family == AF_INET6) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("address family ", family, " is not IP"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<StealProgram>> StealProgram::load() {
  routeLibbpfLogs();

  // libbpf 1.x: NULL with errno set on failure.
  steal_bpf* skel = steal_bpf__open();
  if (skel == nullptr) return lastErrnoStatus("open steal.bpf.o (embedded skeleton)");
  // Owned from here on, so every error path below destroys it.
  std::unique_ptr<StealProgram> program(new StealProgram(skel));

  if (int err = steal_bpf__load(skel); err != 0) {
    std::string context = "load steal.bpf.o";
    if (err == -EPERM || err == -EACCES) {
      absl::StrAppend(&context, " (needs CAP_BPF and CAP_NET_ADMIN, or CAP_SYS_ADMIN)");
    } else if (err == -EINVAL) {
      absl::StrAppend(&context, " (kernel without sk_lookup, older than 5.9?)");
    }
    return errnoStatus(-err, context);
  }
  return program;
}

StealProgram::StealProgram(steal_bpf* skel) : skel_(skel) {}

StealProgram::~StealProgram() {
  detach();
  steal_bpf__destroy(skel_);
}

absl::Status StealProgram::attachToNetns(int netns_fd) {
  if (link_ != nullptr) return absl::FailedPreconditionError("sk_lookup already attached");
  // BPF_LINK_CREATE: the link belongs to the returned fd alone (created
  // O_CLOEXEC, so no exec'd child inherits it). Not pinned, so closing the
  // fd, by us or by the kernel at our death, detaches the program.
  ::bpf_link* link = bpf_program__attach_netns(skel_->progs.steal_lookup, netns_fd);
  if (link == nullptr) return lastErrnoStatus("attach sk_lookup to netns");
  link_ = link;
  return absl::OkStatus();
}

void StealProgram::detach() {
  if (link_ == nullptr) return;
  bpf_link__destroy(link_);
  link_ = nullptr;
}

absl::Status StealProgram::setListener(int family, int fd) {
  RETURN_IF_ERROR(checkFamily(family));
  uint32_t key = family == AF_INET ? STEAL_LISTENER_V4 : STEAL_LISTENER_V6;
  // A sockmap update takes the socket's fd as the value.
  uint64_t value = static_cast<uint64_t>(fd);
  if (int err = bpf_map__update_elem(skel_->maps.listeners, &key, sizeof(key), &value,
                                     sizeof(value), BPF_ANY);
      err != 0) {
    return errnoStatus(-err, absl::StrCat("put listener fd ", fd, " in the sk_lookup sockmap"));
  }
  return absl::OkStatus();
}

absl::Status StealProgram::addPort(uint16_t port) {
  uint8_t one = 1;
  if (int err = bpf_map__update_elem(skel_->maps.steal_ports, &port, sizeof(port), &one,
                                     sizeof(one), BPF_ANY);
      err != 0) {
    return errnoStatus(-err, absl::StrCat("steer port ", port));
  }
  return absl::OkStatus();
}

absl::Status StealProgram::removePort(uint16_t port) {
  int err = bpf_map__delete_elem(skel_->maps.steal_ports, &port, sizeof(port), 0);
  if (err != 0 && err != -ENOENT) {
    return errnoStatus(-err, absl::StrCat("stop steering port ", port));
  }
  return absl::OkStatus();
}

absl::Status StealProgram::exempt(int family, uint16_t port) {
  RETURN_IF_ERROR(checkFamily(family));
  steal_passthrough_key key{.port = port, .family = static_cast<uint16_t>(family)};
  uint8_t one = 1;
  if (int err = bpf_map__update_elem(skel_->maps.passthrough, &key, sizeof(key), &one, sizeof(one),
                                     BPF_ANY);
      err != 0) {
    return errnoStatus(-err, absl::StrCat("exempt source port ", port, " from stealing"));
  }
  return absl::OkStatus();
}

absl::Status StealProgram::unexempt(int family, uint16_t port) {
  RETURN_IF_ERROR(checkFamily(family));
  steal_passthrough_key key{.port = port, .family = static_cast<uint16_t>(family)};
  int err = bpf_map__delete_elem(skel_->maps.passthrough, &key, sizeof(key), 0);
  if (err != 0 && err != -ENOENT) {
    return errnoStatus(-err, absl::StrCat("un-exempt source port ", port));
  }
  return absl::OkStatus();
}

absl::Status StealProgram::exemptSource(const uint8_t (&addr)[16], uint32_t prefixlen) {
  if (prefixlen > 128) return absl::InvalidArgumentError("a source prefix is at most 128 bits");
  steal_source_key key{};
  key.prefixlen = prefixlen;
  std::copy(std::begin(addr), std::end(addr), key.addr);
  uint8_t one = 1;
  if (int err = bpf_map__update_elem(skel_->maps.exempt_sources, &key, sizeof(key), &one,
                                     sizeof(one), BPF_ANY);
      err != 0) {
    return errnoStatus(-err, "exempt a source prefix from stealing");
  }
  return absl::OkStatus();
}

}  // namespace siphon::bpf
