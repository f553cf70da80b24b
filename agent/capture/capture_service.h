// Packet capture inside the target (`siphon capture`, a ksniff equivalent):
// a client opens StreamOpen{capture: CaptureStart{interface, filter,
// snaplen}}; the agent opens a libpcap capture on a packet socket made in
// the target's network namespace (on the NetnsWorker), compiles the filter
// on a thread of its own within a deadline (filter_compiler.h: never on the
// NetnsWorker, which every netns operation shares), installs it, accepts
// the stream, and streams a pcap file (capture_stream.h).
//
// Refusals (StreamReset, with libpcap's words where it has some):
//   INVALID_ARGUMENT    a malformed interface name, a filter longer than
//                       kMaxFilterBytes or that does not compile ("capture
//                       filter 'tcp prot 80': ... syntax error");
//   TIMEOUT             a filter that did not compile within
//                       filter_compile_deadline;
//   NOT_FOUND           no such interface in the target's netns;
//   PERMISSION_DENIED   the agent lacks CAP_NET_RAW;
//   RESOURCE_EXHAUSTED  max_captures captures run already (each holds a
//                       kernel ring of CaptureSpec::buffer_bytes), or
//                       max_filter_compiles filters are compiling;
//   UNAVAILABLE         the interface is down, other activation failures.
//
// Threads: open() and the streams on the event loop; the source is opened
// on the NetnsWorker and comes back; filters compile on threads of their
// own.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>

#include "agent/capture/capture_stream.h"
#include "agent/capture/filter_compiler.h"
#include "agent/capture/packet_source.h"
#include "agent/services/service.h"

namespace siphon::agent::capture {

struct CaptureOptions {
  // Opens the source for a checked spec; runs on the NetnsWorker thread.
  std::function<absl::StatusOr<std::unique_ptr<PacketSource>>(const CaptureSpec&)> open_source =
      openPcap;
  size_t max_captures = 32;
  // Compiles a filter for the open source; runs on a thread of its own,
  // bounded by the deadline and the count (filter_compiler.h).
  FilterCompileFunction compile_filter = compilePcapFilter;
  std::chrono::milliseconds filter_compile_deadline = kFilterCompileDeadline;
  size_t max_filter_compiles = kMaxFilterCompiles;
  CaptureStream::Options stream;  // read budgets and stats interval
};

std::shared_ptr<StreamService> makeCaptureService(ServiceContext& ctx, CaptureOptions options = {});

// Adds the service and FEATURE_CAPTURE.
void registerCapture(ServiceRegistry& registry, ServiceContext& ctx);

}  // namespace siphon::agent::capture
