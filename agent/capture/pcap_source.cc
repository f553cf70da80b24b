// openPcap(): the libpcap PacketSource.
#include <pcap/pcap.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/capture/packet_source.h"
#include "agent/common/log.h"
#include "siphon/status.h"

namespace siphon::agent::capture {
namespace {

struct PcapClose {
  void operator()(pcap_t* p) const { pcap_close(p); }
};
using PcapHandle = std::unique_ptr<pcap_t, PcapClose>;

std::string where(const CaptureSpec& spec) {
  return absl::StrCat("capture on interface '", spec.interface, "' in the target");
}

// The code and words of a failed pcap_activate(): libpcap's status text and,
// when it has more to say, its error buffer ("No such device exists
// (SIOCGIFINDEX: No such device)").
absl::Status activateError(const CaptureSpec& spec, pcap_t* p, int rc) {
  std::string detail = pcap_geterr(p);
  std::string text = pcap_statustostr(rc);
  if (rc == PCAP_ERROR && !detail.empty()) {
    text = detail;  // "Generic error" says nothing
  } else if (!detail.empty() && detail != text) {
    absl::StrAppend(&text, " (", detail, ")");
  }
  v1::ErrorCode code = v1::UNAVAILABLE;
  switch (rc) {
    case PCAP_ERROR_NO_SUCH_DEVICE:
      code = v1::NOT_FOUND;
      break;
    case PCAP_ERROR_PERM_DENIED:
    case PCAP_ERROR_PROMISC_PERM_DENIED:
      code = v1::PERMISSION_DENIED;
      break;
    default:
      break;
  }
  return protoError(code, absl::StrCat(where(spec), ": ", text));
}

// The LINKTYPE_ value of the handle, as libpcap writes it in a file's
// header. DLT_ and LINKTYPE_ numbers differ for a few link types (DLT_RAW is
// 12 or 14 depending on the platform, LINKTYPE_RAW is 101: tunnels and
// WireGuard interfaces in pods have it), and libpcap's own mapping is not
// public: let it write a header into memory and read the field back.
absl::StatusOr<uint32_t> fileLinkType(pcap_t* p) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  if (f == nullptr) return lastErrnoStatus("capture: open_memstream");
  pcap_dumper_t* dumper = pcap_dump_fopen(p, f);
  if (dumper == nullptr) {
    std::fclose(f);
    std::free(buf);
    return protoError(v1::UNAVAILABLE, absl::StrCat("capture: ", pcap_geterr(p)));
  }
  pcap_dump_close(dumper);  // flushes and closes f: buf and size are final
  absl::StatusOr<uint32_t> out = protoError(v1::INTERNAL, "capture: libpcap wrote no file header");
  if (buf != nullptr && size >= kGlobalHeaderSize) {
    uint32_t linktype = 0;
    std::memcpy(&linktype, buf + 20, sizeof(linktype));
    out = linktype;
  }
  std::free(buf);
  return out;
}

class PcapSource : public PacketSource {
 public:
  PcapSource(PcapHandle handle, uint32_t linktype, uint32_t snaplen, int fd)
      : handle_(std::move(handle)), linktype_(linktype), snaplen_(snaplen), fd_(fd) {}

  uint32_t linkType() const override { return linktype_; }
  uint32_t snaplen() const override { return snaplen_; }
  int dataLink() const override { return pcap_datalink(handle_.get()); }

  absl::Status setFilter(const CompiledFilter& filter) override {
    if (filter.program() == nullptr) {
      return protoError(v1::INTERNAL, "capture filter: no compiled program");
    }
    // libpcap filters in user space the packets the ring took before the
    // kernel had the filter, so nothing unfiltered gets through.
    if (pcap_setfilter(handle_.get(), filter.program()) != 0) {
      return protoError(v1::INVALID_ARGUMENT, absl::StrCat("capture filter '", filter.expression(),
                                                           "': ", pcap_geterr(handle_.get())));
    }
    return absl::OkStatus();
  }
  int selectableFd() const override { return fd_; }

  absl::StatusOr<int> read(int max, PacketSink& sink) override {
    int n =
        pcap_dispatch(handle_.get(), max, &PcapSource::deliver, reinterpret_cast<u_char*>(&sink));
    if (n >= 0) return n;
    if (n == PCAP_ERROR_BREAK) return 0;  // nobody calls pcap_breakloop; harmless
    // "The interface disappeared", "The interface went down".
    return protoError(v1::UNAVAILABLE, absl::StrCat("capture: ", pcap_geterr(handle_.get())));
  }

  absl::StatusOr<uint32_t> kernelDrops() override {
    pcap_stat ps{};
    if (pcap_stats(handle_.get(), &ps) != 0) {
      return protoError(v1::UNAVAILABLE,
                        absl::StrCat("capture statistics: ", pcap_geterr(handle_.get())));
    }
    return ps.ps_drop;
  }

 private:
  static void deliver(u_char* user, const pcap_pkthdr* h, const u_char* bytes) {
    Packet p;
    p.ts_sec = h->ts.tv_sec;
    p.ts_usec = h->ts.tv_usec;
    p.caplen = h->caplen;
    p.len = h->len;
    p.data = bytes;
    reinterpret_cast<PacketSink*>(user)->onPacket(p);
  }

  PcapHandle handle_;
  uint32_t linktype_;
  uint32_t snaplen_;
  int fd_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PacketSource>> openPcap(const CaptureSpec& spec) {
  char errbuf[PCAP_ERRBUF_SIZE] = "";
  PcapHandle p(pcap_create(spec.interface.c_str(), errbuf));
  if (!p) return protoError(v1::INTERNAL, absl::StrCat(where(spec), ": ", errbuf));
  // Each setter fails only on an activated handle, which this is not yet.
  pcap_set_snaplen(p.get(), static_cast<int>(spec.snaplen));
  // Not immediate mode: libpcap then uses TPACKET_V2, whose ring has
  // fixed slots sized for the snapshot length: 4 MiB of 256 KiB slots hold
  // 16 packets, and a burst of small ones overflows it (we saw kernel drops
  // in a 300 KB TCP transfer). TPACKET_V3 packs packets into blocks; a block
  // reaches us when it fills or after the timeout, which bounds the delay.
  pcap_set_timeout(p.get(), spec.block_timeout_ms);
  pcap_set_buffer_size(p.get(), static_cast<int>(spec.buffer_bytes));
  pcap_set_promisc(p.get(), 0);
  int rc = pcap_activate(p.get());
  if (rc < 0) return activateError(spec, p.get(), rc);
  if (rc > 0) {
    log::warn("capture_warning", {{"interface", spec.interface},
                                  {"warning", pcap_statustostr(rc)},
                                  {"detail", pcap_geterr(p.get())}});
  }

  if (pcap_setnonblock(p.get(), 1, errbuf) != 0) {
    return protoError(v1::INTERNAL, absl::StrCat(where(spec), ": ", errbuf));
  }
  const int fd = pcap_get_selectable_fd(p.get());
  if (fd < 0) {
    return protoError(v1::INTERNAL, absl::StrCat(where(spec), ": no selectable descriptor"));
  }
  auto linktype = fileLinkType(p.get());
  if (!linktype.ok()) return linktype.status();
  const auto snaplen = static_cast<uint32_t>(pcap_snapshot(p.get()));
  return std::make_unique<PcapSource>(std::move(p), *linktype, snaplen, fd);
}

}  // namespace siphon::agent::capture
