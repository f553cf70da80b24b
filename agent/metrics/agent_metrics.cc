#include "agent/metrics/agent_metrics.h"

#include <string.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "agent/metrics/process.h"
#include "siphon/status.h"

#ifndef SIPHON_VERSION
#define SIPHON_VERSION "0.0.0"
#endif

namespace siphon::agent::metrics {

namespace {

constexpr std::array<std::string_view, kStreamKinds> kKindNames = {
    "stolen",       "stolen_request", "mirrored", "outgoing_tcp",
    "outgoing_udp", "outgoing_unix",  "capture",  "other",
};

std::string_view frameName(ErrorFrame f) {
  switch (f) {
    case ErrorFrame::kResponse:
      return "response";
    case ErrorFrame::kStreamReset:
      return "stream_reset";
    case ErrorFrame::kReject:
      return "reject";
    case ErrorFrame::kGoaway:
      return "goaway";
  }
  return "other";
}

// The name of a oneof case of `message` ("file", "read"...).
std::string caseName(const google::protobuf::Descriptor* message, int number) {
  if (number == 0) return "none";
  const auto* field = message->FindFieldByNumber(number);
  return field ? field->name() : absl::StrCat("field_", number);
}

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string_view streamKindName(StreamKind kind) { return kKindNames[static_cast<size_t>(kind)]; }

StreamKind streamKindOf(const v1::StreamOpen& open) {
  switch (open.kind_case()) {
    case v1::StreamOpen::kStolen:
      return StreamKind::kStolen;
    case v1::StreamOpen::kStolenRequest:
      return StreamKind::kStolenRequest;
    case v1::StreamOpen::kMirrored:
      return StreamKind::kMirrored;
    case v1::StreamOpen::kCapture:
      return StreamKind::kCapture;
    case v1::StreamOpen::kOutgoing:
      switch (open.outgoing().protocol()) {
        case v1::OutgoingConnect::TCP:
          return StreamKind::kOutgoingTcp;
        case v1::OutgoingConnect::UDP:
          return StreamKind::kOutgoingUdp;
        case v1::OutgoingConnect::UNIX_STREAM:
        case v1::OutgoingConnect::UNIX_SEQPACKET:
          return StreamKind::kOutgoingUnix;
        default:
          return StreamKind::kOther;
      }
    default:
      return StreamKind::kOther;
  }
}

AgentMetrics::AgentMetrics() : start_time_seconds_(unixNow()) {
  Registry& r = registry_;
  r.declare("siphon_build_info", Type::kGauge, "Always 1; the agent's version as a label.",
            {"version"});
  r.series("siphon_build_info", {SIPHON_VERSION}).set(1);
  r.declareCollected("siphon_ready", Type::kGauge,
                     "1 while /readyz answers 200 (target entered, listener up, not draining).", {},
                     [this] {
                       return std::vector<Sample>{{{}, state_ && state_().ready ? 1.0 : 0.0}};
                     });
  r.declareCollected(
      "siphon_sessions", Type::kGauge,
      "Sessions by state: attached (a client connected) or detached (waiting for a resume).",
      {"state"}, [this] {
        LiveState s = state_ ? state_() : LiveState{};
        return std::vector<Sample>{
            {{"attached"}, static_cast<double>(s.sessions_attached)},
            {{"detached"}, static_cast<double>(s.sessions_detached)},
        };
      });
  r.declare("siphon_session_events_total", Type::kCounter,
            "Sessions opened, ended (closed, expired, evicted, agent exit), and lost (ended "
            "with their streams reset: no resume within the grace period, protocol error).",
            {"event"});
  r.declareCollected(
      "siphon_streams", Type::kGauge, "Streams open now, by kind.", {"kind"}, [this] {
        LiveState s = state_ ? state_() : LiveState{};
        std::vector<Sample> out;
        for (size_t i = 0; i < kStreamKinds; ++i) {
          out.push_back({{std::string(kKindNames[i])}, static_cast<double>(s.streams[i])});
        }
        return out;
      });
  r.declare("siphon_streams_opened_total", Type::kCounter, "Streams opened, by kind.", {"kind"});
  r.declare("siphon_stream_bytes_in_total", Type::kCounter,
            "Stream payload bytes received from clients (toward the target), by stream kind.",
            {"kind"});
  r.declare("siphon_stream_bytes_out_total", Type::kCounter,
            "Stream payload bytes sent to clients (from the target), by stream kind.", {"kind"});
  r.declare("siphon_stolen_connections_total", Type::kCounter,
            "Connections to the target stolen and handed to a client.");
  r.declare("siphon_stolen_requests_total", Type::kCounter,
            "HTTP requests matched by a filtered steal and handed to a client.");
  r.declare("siphon_mirrored_connections_total", Type::kCounter,
            "Copies of connections to the target sent to a mirroring client.");
  r.declare("siphon_gaps_total", Type::kCounter,
            "Gap notices sent (bytes a mirrored or capture stream lost), by stream kind.",
            {"kind"});
  r.declare("siphon_gap_bytes_total", Type::kCounter,
            "Bytes lost on mirrored or capture streams (reported to the client as gaps).",
            {"kind"});
  r.declare("siphon_requests_total", Type::kCounter,
            "Requests answered, by request kind and result (ok, or the error).",
            {"kind", "result"});
  r.declare("siphon_file_operations_total", Type::kCounter,
            "File requests answered, by operation and result (ok, an errno name such as ENOENT, "
            "or the error code).",
            {"op", "result"});
  r.declare("siphon_dns_queries_total", Type::kCounter,
            "DNS requests answered, by result (ok, or the error code).", {"result"});
  r.declare("siphon_errors_sent_total", Type::kCounter,
            "Errors sent to clients, by code and by the frame that carried them (response, "
            "stream_reset, reject, goaway).",
            {"code", "frame"});
  r.declare("siphon_http2_limits_total", Type::kCounter,
            "HTTP/2 clients of filtered steals refused for going past a limit, by limit "
            "(header_list: stream reset; header_flood, continuation_flood, control_flood, "
            "reset_flood, protocol_error: connection ended with GOAWAY; pool_full: 503).",
            {"limit"});
  r.declare("siphon_resumes_total", Type::kCounter,
            "Session resume attempts, by result (ok, unknown_session, bad_token, "
            "replay_failed, handshake_failed, superseded: a later resume of the session won).",
            {"result"});
  r.declare("siphon_handovers_total", Type::kCounter,
            "Handovers to or from another agent process, by result (taken: this agent took "
            "over; refused, failed: the other agent went on as before).",
            {"result"});
  r.declareCollected("siphon_handshakes_pending", Type::kGauge,
                     "Connections accepted that have not finished the handshake (TLS, Hello).", {},
                     [this] {
                       LiveState s = state_ ? state_() : LiveState{};
                       return std::vector<Sample>{{{}, static_cast<double>(s.handshakes_pending)}};
                     });
  r.declare("siphon_handshakes_rejected_total", Type::kCounter,
            "Connections closed at accept without a handshake, by reason (max_handshakes, "
            "max_handshakes_per_source, fd_reserve: every slot of it held by a connection past "
            "its Hello).",
            {"reason"});
  r.declare("siphon_handshakes_evicted_total", Type::kCounter,
            "Connections closed before a complete Hello to make room for a newer one, the "
            "longest waiting first, by the rule that was full (max_handshakes, "
            "max_handshakes_per_source, fd_reserve).",
            {"reason"});
  r.declareCollected(
      "siphon_process_resident_memory_bytes", Type::kGauge,
      "Resident memory of the agent process in bytes.", {}, [] {
        return std::vector<Sample>{{{}, static_cast<double>(readProcessStats().resident_bytes)}};
      });
  r.declareCollected(
      "siphon_process_open_fds", Type::kGauge, "File descriptors the agent process holds open.", {},
      [] {
        return std::vector<Sample>{{{}, static_cast<double>(readProcessStats().open_fds)}};
      });
  r.declareCollected("siphon_process_cpu_seconds_total", Type::kCounter,
                     "User and system CPU time of the agent process in seconds.", {}, [] {
                       return std::vector<Sample>{{{}, readProcessStats().cpu_seconds}};
                     });
  r.declareCollected("siphon_process_start_time_seconds", Type::kGauge,
                     "When the agent started, in seconds since the Unix epoch.", {}, [this] {
                       return std::vector<Sample>{{{}, start_time_seconds_}};
                     });

  for (size_t i = 0; i < kStreamKinds; ++i) {
    const std::string kind(kKindNames[i]);
    opened_[i] = &r.series("siphon_streams_opened_total", {kind});
    bytes_in_[i] = &r.series("siphon_stream_bytes_in_total", {kind});
    bytes_out_[i] = &r.series("siphon_stream_bytes_out_total", {kind});
  }
  for (const char* e : {"opened", "ended", "lost"}) r.series("siphon_session_events_total", {e});
  for (const char* reason : {"max_handshakes", "max_handshakes_per_source", "fd_reserve"}) {
    r.series("siphon_handshakes_rejected_total", {reason});
    r.series("siphon_handshakes_evicted_total", {reason});
  }
  r.series("siphon_stolen_connections_total");
  r.series("siphon_stolen_requests_total");
  r.series("siphon_mirrored_connections_total");
}

void AgentMetrics::streamOpened(StreamKind kind) {
  opened_[index(kind)]->add();
  switch (kind) {
    case StreamKind::kStolen:
      registry_.series("siphon_stolen_connections_total").add();
      break;
    case StreamKind::kStolenRequest:
      registry_.series("siphon_stolen_requests_total").add();
      break;
    case StreamKind::kMirrored:
      registry_.series("siphon_mirrored_connections_total").add();
      break;
    default:
      break;
  }
}

void AgentMetrics::gap(StreamKind kind, uint64_t bytes) {
  const std::string k(streamKindName(kind));
  registry_.series("siphon_gaps_total", {k}).add();
  registry_.series("siphon_gap_bytes_total", {k}).add(bytes);
}

void AgentMetrics::errorSent(v1::ErrorCode code, ErrorFrame frame) {
  registry_.series("siphon_errors_sent_total", {errorCodeName(code), std::string(frameName(frame))})
      .add();
}

void AgentMetrics::resume(std::string_view result) {
  registry_.series("siphon_resumes_total", {std::string(result)}).add();
}

void AgentMetrics::handover(std::string_view result) {
  registry_.series("siphon_handovers_total", {std::string(result)}).add();
}

void AgentMetrics::handshakeRejected(std::string_view reason) {
  registry_.series("siphon_handshakes_rejected_total", {std::string(reason)}).add();
}

void AgentMetrics::handshakeEvicted(std::string_view reason) {
  registry_.series("siphon_handshakes_evicted_total", {std::string(reason)}).add();
}

void AgentMetrics::http2LimitHit(std::string_view limit) {
  registry_.series("siphon_http2_limits_total", {std::string(limit)}).add();
}

void AgentMetrics::session(std::string_view event) {
  registry_.series("siphon_session_events_total", {std::string(event)}).add();
}

std::string AgentMetrics::resultName(const v1::Response& response) {
  if (!response.has_error()) return "ok";
  const v1::Error& e = response.error();
  if (e.code() == v1::ERRNO || e.errno_value() != 0) {
    if (const char* name = strerrorname_np(e.errno_value())) return name;
  }
  return absl::AsciiStrToLower(errorCodeName(e.code()));
}

void AgentMetrics::requestAnswered(int body_case, int file_op_case, const v1::Response& response) {
  const std::string result = resultName(response);
  registry_
      .series("siphon_requests_total", {caseName(v1::Request::descriptor(), body_case), result})
      .add();
  if (body_case == v1::Request::kFile) {
    registry_
        .series("siphon_file_operations_total",
                {caseName(v1::FileRequest::descriptor(), file_op_case), result})
        .add();
  } else if (body_case == v1::Request::kDns) {
    registry_.series("siphon_dns_queries_total", {result}).add();
  }
  if (response.has_error()) errorSent(response.error().code(), ErrorFrame::kResponse);
}

}  // namespace siphon::agent::metrics
