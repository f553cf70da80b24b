#include "agent/capture/capture_spec.h"

#include <net/if.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/capture/pcap_file.h"
#include "siphon/status.h"

namespace siphon::agent::capture {
namespace {

// The rules of the kernel's dev_valid_name(), plus ':' (alias syntax, never
// a device of its own). A longer name would be cut to IFNAMSIZ by libpcap's
// ioctls and could name a different interface.
bool validInterfaceName(const std::string& name) {
  if (name.empty() || name.size() >= IFNAMSIZ || name == "." || name == "..") return false;
  return std::none_of(name.begin(), name.end(), [](char c) {
    return c == '/' || c == ':' || c == '\0' || c == ' ' || c == '\t' || c == '\n' || c == '\r' ||
           c == '\v' || c == '\f';
  });
}

}  // namespace

absl::StatusOr<CaptureSpec> captureSpec(const v1::CaptureStart& start, size_t max_record_bytes) {
  CaptureSpec spec;
  spec.interface = start.interface().empty() ? "any" : start.interface();
  if (!validInterfaceName(spec.interface)) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("capture: '", spec.interface,
                                   "' is not an interface name (1-15 bytes, no '/', ':' or "
                                   "whitespace)"));
  }
  if (start.filter().size() > kMaxFilterBytes) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("capture filter of ", start.filter().size(), " bytes: at most ",
                                   kMaxFilterBytes, " bytes are taken (the agent's limit)"));
  }
  if (start.filter().find('\0') != std::string::npos) {
    return protoError(v1::INVALID_ARGUMENT, "capture filter: contains a NUL byte");
  }
  spec.filter = start.filter();
  if (max_record_bytes <= kRecordHeaderSize) {
    return protoError(v1::INVALID_ARGUMENT, absl::StrCat("capture: frames of ", max_record_bytes,
                                                         " bytes cannot hold a packet record"));
  }
  uint32_t snaplen = start.snaplen();
  if (snaplen == 0 || snaplen > kDefaultSnaplen) snaplen = kDefaultSnaplen;
  spec.snaplen =
      static_cast<uint32_t>(std::min<size_t>(snaplen, max_record_bytes - kRecordHeaderSize));
  return spec;
}

}  // namespace siphon::agent::capture
