#include "cli/mirror_output.h"

#include "absl/strings/str_cat.h"
#include "cli/format.h"
#include "cli/json_writer.h"
#include "siphon/status.h"

namespace siphon::cli {
namespace {

// "client_to_server", for JSON.
std::string_view directionKey(v1::Direction d) {
  return d == v1::SERVER_TO_CLIENT ? "server_to_client" : "client_to_server";
}

// "connection 3 10.0.0.2:51234 -> 10.0.0.1:80"
std::string connectionText(const MirrorConnection& c) {
  return absl::StrCat("connection ", c.id, " ", c.client, " -> ", c.server);
}

JsonLine connectionJson(std::string_view event, const MirrorConnection& c) {
  JsonLine j(event);
  j.add("connection", c.id).add("source", c.client).add("destination", c.server);
  return j;
}

}  // namespace

absl::StatusOr<MirrorSpec> parseMirrorSpec(std::string_view port, const std::string& to,
                                           bool to_stdout, bool both) {
  MirrorSpec spec;
  if (!parsePort(port, &spec.port)) {
    return protoError(v1::INVALID_ARGUMENT, absl::StrCat("bad --port '", asv(port),
                                                         "': must be a number from 1 to 65535"));
  }
  if (!to.empty()) {
    if (to_stdout) {
      return protoError(v1::INVALID_ARGUMENT,
                        "--to and --stdout exclude each other: replay to a server, or print");
    }
    if (both) {
      return protoError(v1::INVALID_ARGUMENT,
                        "--both goes with --stdout only: --to replays the client's bytes, and the "
                        "server it replays to makes its own answers");
    }
    auto route = parseStealTarget(to);
    if (!route.ok()) return route.status();
    spec.to = *std::move(route);
  }
  spec.both = both;
  return spec;
}

absl::StatusOr<MirrorRecord> parseMirrorRecord(std::string_view payload) {
  if (payload.empty()) {
    return protoError(v1::INVALID_ARGUMENT, "an empty record (no direction byte)");
  }
  MirrorRecord r;
  const auto d = static_cast<unsigned char>(payload[0]);
  if (d != v1::CLIENT_TO_SERVER && d != v1::SERVER_TO_CLIENT) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("a record with direction byte ", d, " (want 1 or 2)"));
  }
  r.direction = static_cast<v1::Direction>(d);
  r.bytes = payload.substr(1);
  r.fin = r.bytes.empty();
  return r;
}

std::string_view directionText(v1::Direction d) {
  return d == v1::SERVER_TO_CLIENT ? "server->client" : "client->server";
}

MirrorConnection mirrorConnection(uint64_t id, const v1::MirroredConnection& m) {
  MirrorConnection c;
  c.id = id;
  c.client = m.source().ip().empty() ? "?" : hostPort(m.source().ip(), m.source().port());
  c.server =
      m.destination().ip().empty() ? "?" : hostPort(m.destination().ip(), m.destination().port());
  c.mid_stream = m.started_mid_stream();
  return c;
}

MirrorConnection mirrorConnection(uint64_t id, const client::MirroredConnection& m) {
  MirrorConnection c;
  c.id = id;
  c.client = m.source().ip.empty() ? "?" : m.source().text();
  c.server = m.destination().ip.empty() ? "?" : m.destination().text();
  c.mid_stream = m.startedMidStream();
  return c;
}

v1::Direction wireDirection(client::Direction d) {
  switch (d) {
    case client::Direction::kClientToServer:
      return v1::CLIENT_TO_SERVER;
    case client::Direction::kServerToClient:
      return v1::SERVER_TO_CLIENT;
    case client::Direction::kUnspecified:
      break;
  }
  return v1::DIRECTION_UNSPECIFIED;
}

void addCounts(MirrorCounts& to, const MirrorCounts& c) {
  for (int i = 0; i < 2; ++i) {
    to.bytes[i] += c.bytes[i];
    to.gaps[i] += c.gaps[i];
    to.not_written[i] += c.not_written[i];
  }
  to.replayed += c.replayed;
  to.not_replayed += c.not_replayed;
}

std::string closeReason(const absl::Status& end) {
  if (end.ok()) return "closed";
  switch (errorCodeOf(end)) {
    case v1::ERRNO:
      return "reset by peer";
    case v1::TIMEOUT:
      return "idle too long";
    case v1::RESOURCE_EXHAUSTED:
      return "dropped: the agent's connection table is full";
    case v1::CANCELLED:
    case v1::AGENT_DRAINING:
      return "mirror stopped";
    case v1::AGENT_LOST:
      return "the session with the agent is lost";
    default:
      return absl::StrCat("reset by the agent: ", errorCodeName(errorCodeOf(end)), ": ",
                          end.message());
  }
}

std::string mirroringLine(const MirrorSpec& spec, std::string_view backend,
                          uint64_t subscription_id, bool json) {
  const std::string to = spec.to ? spec.to->to() : "stdout";
  if (json) {
    return JsonLine("mirroring")
        .add("port", uint64_t{spec.port})
        .add("backend", backend)
        .add("subscription_id", subscription_id)
        .add("to", to)
        .addBool("both", spec.both)
        .take();
  }
  const std::string what = spec.to     ? absl::StrCat("client->server bytes replayed to ", to)
                           : spec.both ? std::string("both directions to stdout")
                                       : std::string("client->server bytes to stdout");
  return absl::StrCat("mirror: port ", spec.port, " (backend ",
                      backend.empty() ? "unknown" : asv(backend), ", subscription ",
                      subscription_id, "): ", what, "\n");
}

std::string openedLine(const MirrorConnection& c, bool json) {
  if (json) return connectionJson("open", c).addBool("mid_stream", c.mid_stream).take();
  return absl::StrCat("mirror: ", connectionText(c), " opened",
                      c.mid_stream ? " (joined mid-stream: earlier bytes unknown)" : "", "\n");
}

namespace {

// "mirror: connection N: B bytes DIRECTION <what>", or its JSON `event`.
std::string bytesLine(std::string_view event, std::string_view what, const MirrorConnection& c,
                      v1::Direction d, uint64_t bytes, bool json) {
  if (json) {
    return JsonLine(event)
        .add("connection", c.id)
        .add("direction", directionKey(d))
        .add("bytes", bytes)
        .take();
  }
  return absl::StrCat("mirror: connection ", c.id, ": ", bytes, " bytes ", asv(directionText(d)),
                      " ", asv(what), "\n");
}

}  // namespace

std::string gapLine(const MirrorConnection& c, v1::Direction d, uint64_t bytes, bool json) {
  return bytesLine("gap", "lost (gap)", c, d, bytes, json);
}

std::string replayFailedLine(const MirrorConnection& c, const std::string& to,
                             const std::string& why, bool json) {
  if (json) {
    return JsonLine("replay_failed").add("connection", c.id).add("to", to).add("error", why).take();
  }
  return absl::StrCat("mirror: connection ", c.id, ": replay to ", to, " failed (", why,
                      "); the rest of its client->server bytes are dropped\n");
}

std::string notWrittenLine(const MirrorConnection& c, v1::Direction d, uint64_t bytes, bool json) {
  return bytesLine("not_written", "not written: stdout is too slow", c, d, bytes, json);
}

std::string closedLine(const MirrorConnection& c, const MirrorCounts& n, const std::string& reason,
                       bool replay, bool json) {
  if (json) {
    JsonLine j = connectionJson("close", c);
    j.add("reason", reason);
    j.add("client_to_server", n.bytes[0]).add("server_to_client", n.bytes[1]);
    j.add("gap_client_to_server", n.gaps[0]).add("gap_server_to_client", n.gaps[1]);
    j.add("not_written_client_to_server", n.not_written[0]);
    j.add("not_written_server_to_client", n.not_written[1]);
    if (replay) j.add("replayed", n.replayed).add("not_replayed", n.not_replayed);
    return j.take();
  }
  std::string line =
      absl::StrCat("mirror: ", connectionText(c), " ", reason == "closed" ? "" : "closed (", reason,
                   reason == "closed" ? "" : ")", ": client->server ", n.bytes[0],
                   " bytes, server->client ", n.bytes[1], " bytes");
  for (int i = 0; i < 2; ++i) {
    const std::string_view dir = i == 0 ? "client->server" : "server->client";
    if (n.gaps[i] > 0) absl::StrAppend(&line, ", ", n.gaps[i], " bytes ", asv(dir), " lost");
    if (n.not_written[i] > 0) {
      absl::StrAppend(&line, ", ", n.not_written[i], " bytes ", asv(dir), " not written");
    }
  }
  if (replay) {
    absl::StrAppend(&line, ", replayed ", n.replayed, " bytes");
    if (n.not_replayed > 0) absl::StrAppend(&line, ", not replayed ", n.not_replayed, " bytes");
  }
  line.push_back('\n');
  return line;
}

std::string stdoutLeftLine(uint64_t bytes, bool json) {
  if (json) return JsonLine("stdout_left").add("bytes", bytes).take();
  return absl::StrCat("mirror: ", bytes,
                      " bytes still queued for stdout at the exit are not written\n");
}

std::string remirrorFailedLine(uint16_t port, const std::string& agent, const std::string& error,
                               bool json) {
  if (json) {
    return JsonLine("mirror_lost")
        .add("port", uint64_t{port})
        .add("agent", agent)
        .add("error", error)
        .take();
  }
  return absl::StrCat("mirror: port ", port, " on agent ", agent, " failed: ", error,
                      " (the port is no longer mirrored)\n");
}

std::string mirrorDrainingLine(const std::string& reason, bool json) {
  if (json) return JsonLine("agent_draining").add("reason", reason).take();
  return absl::StrCat("mirror: the agent is draining (", reason, "); mirroring ends with it\n");
}

std::string mirrorSummaryLine(const MirrorTotals& t, bool replay, bool json) {
  const MirrorCounts& n = t.counts;
  if (json) {
    JsonLine j("summary");
    j.add("connections", t.connections);
    j.add("client_to_server", n.bytes[0]).add("server_to_client", n.bytes[1]);
    j.add("gap_client_to_server", n.gaps[0]).add("gap_server_to_client", n.gaps[1]);
    j.add("not_written_client_to_server", n.not_written[0]);
    j.add("not_written_server_to_client", n.not_written[1]);
    if (replay) j.add("replayed", n.replayed).add("not_replayed", n.not_replayed);
    return j.take();
  }
  std::string line =
      absl::StrCat("mirror: summary: ", plural(t.connections, "connection", "connections"),
                   ", client->server ", n.bytes[0], " bytes (gaps ", n.gaps[0],
                   " bytes), server->client ", n.bytes[1], " bytes (gaps ", n.gaps[1], " bytes)");
  const uint64_t not_written = n.not_written[0] + n.not_written[1];
  if (not_written > 0) absl::StrAppend(&line, ", ", not_written, " bytes not written to stdout");
  if (replay) {
    absl::StrAppend(&line, ", replayed ", n.replayed, " bytes");
    if (n.not_replayed > 0) absl::StrAppend(&line, ", not replayed ", n.not_replayed, " bytes");
  }
  line.push_back('\n');
  return line;
}

// ------------------------------------------------------------ StdoutFramer

std::string StdoutFramer::marker(const MirrorConnection& c, v1::Direction d, uint64_t missing) {
  std::string m = d == v1::SERVER_TO_CLIENT
                      ? absl::StrCat("<<< #", c.id, " ", c.client, " <- ", c.server)
                      : absl::StrCat(">>> #", c.id, " ", c.client, " -> ", c.server);
  if (missing > 0) absl::StrAppend(&m, " (", missing, " bytes missing before these)");
  m.push_back('\n');
  return m;
}

std::string StdoutFramer::frame(const MirrorConnection& c, v1::Direction d,
                                std::string_view bytes) {
  const int dir = directionIndex(d);
  auto it = missing_.find({c.id, dir});
  const uint64_t missing = it == missing_.end() ? 0 : it->second;
  std::string out;
  undo_ = Undo{wrote_any_, last_connection_, last_direction_, missing};
  if (!wrote_any_ || c.id != last_connection_ || dir != last_direction_ || missing > 0) {
    if (wrote_any_) out.push_back('\n');
    out += marker(c, d, missing);
    if (it != missing_.end()) missing_.erase(it);
  }
  out.append(bytes);
  wrote_any_ = true;
  last_connection_ = c.id;
  last_direction_ = dir;
  return out;
}

void StdoutFramer::notWritten(const MirrorConnection& c, v1::Direction d, uint64_t bytes) {
  // The text of the last frame() is not out: what was written before it is
  // what the next marker follows.
  wrote_any_ = undo_.wrote_any;
  last_connection_ = undo_.connection;
  last_direction_ = undo_.direction;
  missing_[{c.id, directionIndex(d)}] += undo_.missing + bytes;
  undo_ = Undo{};
}

void StdoutFramer::lost(const MirrorConnection& c, v1::Direction d, uint64_t bytes) {
  missing_[{c.id, directionIndex(d)}] += bytes;
}

void StdoutFramer::forget(uint64_t connection_id) {
  std::erase_if(missing_, [&](const auto& e) { return e.first.first == connection_id; });
}

}  // namespace siphon::cli
