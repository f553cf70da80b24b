// Packets of the target's network namespace that match a pcap filter, as a
// pcap file's pieces: the global header first, then one record per packet,
// and gaps for packets dropped because the program read too slowly (never
// silently). A bad filter or interface fails start() with kInvalidArgument
// or kNotFound and libpcap's words.
//
// Threads: as the Target's (target.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "siphon/client/target.h"

namespace siphon::client {

class ClientStream;

struct CaptureSpec {
  std::string interface = "any";
  std::string filter;    // empty: everything
  uint32_t snaplen = 0;  // 0: 262144
  // The stream's first credit, in bytes; 0: the session's default. Packets
  // come in bursts and the agent drops what the credit cannot take at that
  // moment: a large window absorbs a burst.
  uint32_t window = 0;
};

struct CaptureEvent {
  enum class Kind { kHeader, kPacket, kGap };
  Kind kind = Kind::kPacket;
  std::string bytes;  // kHeader: 24 bytes; kPacket: the 16-byte record header and the packet
  uint64_t gap_bytes = 0;
  uint64_t gap_packets = 0;
};

class Capture {
 public:
  Capture() = default;
  static net::awaitable<absl::StatusOr<Capture>> start(const Target& target, CaptureSpec spec);
  // The next piece; nullopt at the end; an error status when it stopped
  // otherwise (kAgentLost, kAgentDraining...).
  net::awaitable<absl::StatusOr<std::optional<CaptureEvent>>> next();
  // An orderly end: the agent sends what it still holds, then next()
  // answers nullopt. The status of a session that cannot say it
  // (kAgentLost...).
  absl::Status finish();
  // Ends it now; next() then fails with kCancelled. `code` and `why` go to
  // the agent.
  void stop();
  void stop(ErrorCode code, std::string_view why);

 private:
  std::shared_ptr<ClientStream> stream_;
  bool header_seen_ = false;
};

}  // namespace siphon::client
