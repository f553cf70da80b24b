#include "loader/mirror_loader.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "loader/libbpf_log.h"
#include "mirror.skel.h"
#include "siphon/status.h"

namespace siphon::bpf {
namespace {

// struct mirror_event_header of mirror.bpf.c, laid out the same on both sides.
static_assert(sizeof(MirrorPacketHeader) == 24, "mirror_event_header changed");
static_assert(offsetof(MirrorPacketHeader, timestamp_ns) == 0);
static_assert(offsetof(MirrorPacketHeader, ifindex) == 8);
static_assert(offsetof(MirrorPacketHeader, orig_len) == 12);
static_assert(offsetof(MirrorPacketHeader, cap_len) == 16);
static_assert(offsetof(MirrorPacketHeader, direction) == 20);
// struct mirror_counters of mirror.bpf.c.
struct CountersValue {
  uint64_t seen;
  uint64_t copied;
  uint64_t failed;
};
static_assert(sizeof(CountersValue) == 24, "mirror_counters changed");

// Debian's linux/bpf.h (6.1) predates TCX; the values are the kernel's
// enum bpf_attach_type (checked against /sys/kernel/btf/vmlinux of 6.18).
constexpr int kBpfTcxIngress = 46;
constexpr int kBpfTcxEgress = 47;

// Adds the likely reason for the errnos a load or an attach commonly fails with.
std::string withReason(std::string context, int err) {
  if (err == EPERM || err == EACCES) {
    absl::StrAppend(&context, " (needs CAP_BPF and CAP_NET_ADMIN, or CAP_SYS_ADMIN)");
  }
  return context;
}

// BPF_LINK_CREATE of a TCX link: the program goes after those already on
// the hook (no relative fd, no flags, any revision). libbpf 1.1 has no
// bpf_program__attach_tcx; its bpf_link_create passes unknown attach types
// through with target_fd = the ifindex. The kernel checks only that a
// sched_cls program is attached at a TCX type, not its expected_attach_type.
// The fd is O_CLOEXEC and the link lives exactly as long as it.
int tcxLinkCreate(int prog_fd, int ifindex, int attach_type) {
  return bpf_link_create(prog_fd, ifindex, static_cast<bpf_attach_type>(attach_type), nullptr);
}

absl::Status tcxError(int err, int ifindex, const char* side) {
  std::string context = absl::StrCat("attach TCX ", side, " on ifindex ", ifindex);
  if (err == EINVAL) {
    absl::StrAppend(&context, " (kernel without TCX links, older than 6.6?)");
  } else if (err == ENODEV) {
    absl::StrAppend(&context, " (no such interface in this thread's netns)");
  }
  return errnoStatus(err, withReason(std::move(context), err));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MirrorLoader>> MirrorLoader::load(Options options) {
  routeLibbpfLogs();

  mirror_bpf* skel = mirror_bpf__open();
  if (skel == nullptr) return lastErrnoStatus("open mirror.bpf.o (embedded skeleton)");
  // Owned from here on, so every error path below destroys it.
  std::unique_ptr<MirrorLoader> loader(new MirrorLoader(skel));

  uint32_t page = static_cast<uint32_t>(sysconf(_SC_PAGESIZE));
  if (options.ring_bytes < page || (options.ring_bytes & (options.ring_bytes - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("mirror ring buffer size ", options.ring_bytes,
                                                   " is not a power of two >= ", page));
  }
  if (int err = bpf_map__set_max_entries(skel->maps.mirror_events, options.ring_bytes); err != 0) {
    return errnoStatus(-err, "size the mirror ring buffer");
  }

  if (int err = mirror_bpf__load(skel); err != 0) {
    std::string context = "load mirror.bpf.o";
    if (err == -EPERM) {
      absl::StrAppend(&context, " (needs CAP_BPF and CAP_NET_ADMIN, or CAP_SYS_ADMIN)");
    } else if (err == -EACCES) {
      // BPF_PROG_LOAD: EACCES is the verifier's refusal, logged by libbpf.
      absl::StrAppend(&context, " (rejected by the verifier; its log is in the warnings)");
    } else if (err == -EINVAL || err == -ESRCH) {
      absl::StrAppend(&context, " (kernel older than 6.3, without bpf_cast_to_kern_ctx?)");
    }
    return errnoStatus(-err, context);
  }
  return loader;
}

MirrorLoader::MirrorLoader(mirror_bpf* skel) : skel_(skel) {}

MirrorLoader::~MirrorLoader() {
  for (auto& [ifindex, links] : links_) {
    close(links.ingress);
    if (links.egress >= 0) close(links.egress);
  }
  if (reader_ != nullptr) ring_buffer__free(reader_);
  closeAdopted();
  mirror_bpf__destroy(skel_);
}

absl::Status MirrorLoader::attach(int ifindex, Hooks hooks) {
  if (links_.contains(ifindex)) {
    return absl::AlreadyExistsError(absl::StrCat("mirror already attached to ifindex ", ifindex));
  }
  Links links;
  links.ingress =
      tcxLinkCreate(bpf_program__fd(skel_->progs.mirror_ingress), ifindex, kBpfTcxIngress);
  if (links.ingress < 0) return tcxError(errno, ifindex, "ingress");
  if (hooks == Hooks::kIngressOnly) {
    links_.emplace(ifindex, links);
    return absl::OkStatus();
  }
  links.egress = tcxLinkCreate(bpf_program__fd(skel_->progs.mirror_egress), ifindex, kBpfTcxEgress);
  if (links.egress < 0) {
    int err = errno;
    close(links.ingress);
    return tcxError(err, ifindex, "egress");
  }
  links_.emplace(ifindex, links);
  return absl::OkStatus();
}

absl::Status MirrorLoader::detach(int ifindex) {
  auto it = links_.find(ifindex);
  if (it == links_.end()) {
    return absl::NotFoundError(absl::StrCat("mirror not attached to ifindex ", ifindex));
  }
  // Closing the last fd of a link detaches its program from the hook.
  close(it->second.ingress);
  if (it->second.egress >= 0) close(it->second.egress);
  links_.erase(it);
  return absl::OkStatus();
}

absl::Status MirrorLoader::addPort(uint16_t port) {
  uint8_t one = 1;
  if (int err = bpf_map__update_elem(skel_->maps.mirror_ports, &port, sizeof(port), &one,
                                     sizeof(one), BPF_ANY);
      err != 0) {
    return errnoStatus(-err, absl::StrCat("mirror port ", port));
  }
  return absl::OkStatus();
}

absl::Status MirrorLoader::removePort(uint16_t port) {
  int err = bpf_map__delete_elem(skel_->maps.mirror_ports, &port, sizeof(port), 0);
  if (err != 0 && err != -ENOENT) {
    return errnoStatus(-err, absl::StrCat("stop mirroring port ", port));
  }
  return absl::OkStatus();
}

absl::StatusOr<MirrorCounters> MirrorLoader::counters() const {
  int cpus = libbpf_num_possible_cpus();
  if (cpus <= 0) return errnoStatus(-cpus, "count possible CPUs");
  std::vector<CountersValue> values(static_cast<size_t>(cpus));
  uint32_t key = 0;
  if (int err = bpf_map__lookup_elem(skel_->maps.mirror_stats, &key, sizeof(key), values.data(),
                                     values.size() * sizeof(CountersValue), 0);
      err != 0) {
    return errnoStatus(-err, "read the mirror counters");
  }
  MirrorCounters sum;
  for (const CountersValue& v : values) {
    sum.seen += v.seen;
    sum.copied += v.copied;
    sum.failed += v.failed;
  }
  return sum;
}

absl::Status MirrorLoader::startReader(PacketCallback on_packet, LossCallback on_loss) {
  if (reader_ != nullptr) return absl::FailedPreconditionError("mirror reader already started");
  on_packet_ = std::move(on_packet);
  on_loss_ = std::move(on_loss);
  // libbpf 1.x: NULL with errno set.
  reader_ = ring_buffer__new(bpf_map__fd(skel_->maps.mirror_events), &MirrorLoader::onRecord, this,
                             nullptr);
  if (reader_ == nullptr) return lastErrnoStatus("open the mirror ring buffer");
  return absl::OkStatus();
}

int MirrorLoader::fd() const { return reader_ == nullptr ? -1 : ring_buffer__epoll_fd(reader_); }

int MirrorLoader::ringFd() const { return bpf_map__fd(skel_->maps.mirror_events); }

absl::Status MirrorLoader::adoptRing(int ring_fd) {
  if (reader_ == nullptr) return absl::FailedPreconditionError("mirror reader not started");
  if (adopted_ != nullptr) return absl::FailedPreconditionError("a mirror ring already adopted");
  adopted_ = ring_buffer__new(ring_fd, &MirrorLoader::onRecord, this, nullptr);
  if (adopted_ == nullptr) return lastErrnoStatus("open the adopted mirror ring buffer");
  return absl::OkStatus();
}

absl::StatusOr<size_t> MirrorLoader::consumeAdopted() {
  if (adopted_ == nullptr) return absl::FailedPreconditionError("no mirror ring adopted");
  int n = ring_buffer__consume(adopted_);
  if (n < 0) return errnoStatus(-n, "read the adopted mirror ring buffer");
  if (bad_record_) return absl::InternalError("malformed record in the adopted mirror ring buffer");
  return static_cast<size_t>(n);
}

void MirrorLoader::closeAdopted() {
  if (adopted_ != nullptr) ring_buffer__free(adopted_);
  adopted_ = nullptr;
}

int MirrorLoader::onRecord(void* ctx, void* data, size_t size) {
  auto* self = static_cast<MirrorLoader*>(ctx);
  MirrorPacket packet;
  if (size < sizeof(packet.header)) {
    self->bad_record_ = true;
    return 0;
  }
  std::memcpy(&packet.header, data, sizeof(packet.header));
  if (packet.header.cap_len > size - sizeof(packet.header)) {
    self->bad_record_ = true;
    return 0;
  }
  packet.data = std::span<const uint8_t>(static_cast<const uint8_t*>(data) + sizeof(packet.header),
                                         packet.header.cap_len);
  if (self->on_packet_) self->on_packet_(packet);
  return 0;
}

absl::StatusOr<size_t> MirrorLoader::consume() {
  if (reader_ == nullptr) return absl::FailedPreconditionError("mirror reader not started");
  int n = ring_buffer__consume(reader_);
  if (n < 0) return errnoStatus(-n, "read the mirror ring buffer");
  // A record the program did not write as we expect is a broken invariant
  // between the two halves, not a run-time condition.
  if (bad_record_) return absl::InternalError("malformed record in the mirror ring buffer");
  ASSIGN_OR_RETURN(MirrorCounters now, counters());
  if (now.failed > lost_reported_) {
    uint64_t lost = now.failed - lost_reported_;
    lost_reported_ = now.failed;
    if (on_loss_) on_loss_(lost);
  }
  return static_cast<size_t>(n);
}

}  // namespace siphon::bpf
