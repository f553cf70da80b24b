#include "cli/steal_spec.h"

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/json_writer.h"
#include "siphon/status.h"
#include "siphon/text.h"

namespace siphon::cli {

bool parsePort(std::string_view s, uint16_t* out) {
  uint32_t v = 0;
  if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string_view::npos ||
      !absl::SimpleAtoi(asv(s), &v) || v == 0 || v > 65535) {
    return false;
  }
  *out = static_cast<uint16_t>(v);
  return true;
}

namespace {

// "10.1.2.3:40000 -> :80", the start of every line about a connection.
std::string connectionText(const StolenEvent& e) {
  return absl::StrCat(e.source.empty() ? "?" : e.source, " -> :", e.port);
}

JsonLine connectionJson(std::string_view event, const StolenEvent& e) {
  JsonLine j(event);
  j.add("source", e.source).add("destination", e.destination).add("port", uint64_t{e.port});
  j.add("to", e.to);
  return j;
}

}  // namespace

bool isHttpToken(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    const bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!alnum &&
        std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) == std::string_view::npos) {
      return false;
    }
  }
  return true;
}

namespace {

std::string_view trimBlanks(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

absl::StatusOr<std::optional<v1::HttpFilter>> parseHttpFilter(const FilterFlags& flags) {
  auto bad = [](std::string what) { return protoError(v1::INVALID_ARGUMENT, std::move(what)); };
  if (flags.headers.empty() && !flags.path && !flags.method) {
    if (flags.any)
      return bad(
          "--filter-any needs filters to choose from (--filter-header, --filter-path, "
          "--filter-method)");
    return std::optional<v1::HttpFilter>();
  }
  v1::HttpFilter filter;
  for (const std::string& h : flags.headers) {
    const size_t colon = h.find(':');
    if (colon == std::string::npos) {
      return bad(absl::StrCat("bad --filter-header '", h, "': want 'Name: regex'"));
    }
    const std::string_view name = trimBlanks(std::string_view(h).substr(0, colon));
    if (!isHttpToken(name)) {
      return bad(absl::StrCat("bad --filter-header '", h, "': '", asv(name),
                              "' is not a header name (letters, digits and !#$%&'*+-.^_`|~)"));
    }
    v1::HeaderFilter* f = filter.add_headers();
    f->set_name(std::string(name));
    f->set_value_regex(std::string(trimBlanks(std::string_view(h).substr(colon + 1))));
  }
  if (flags.path) {
    if (flags.path->empty()) return bad("--filter-path is empty: give a regex (^/api/ say)");
    filter.set_path_regex(*flags.path);
  }
  if (flags.method) {
    if (!isHttpToken(*flags.method)) {
      return bad(absl::StrCat("bad --filter-method '", *flags.method, "': not an HTTP method"));
    }
    filter.set_method(*flags.method);
  }
  filter.set_match_any(flags.any);
  return std::optional<v1::HttpFilter>(std::move(filter));
}

std::string filterText(const v1::HttpFilter& filter) {
  std::vector<std::string> parts;
  for (const v1::HeaderFilter& h : filter.headers()) {
    parts.push_back(absl::StrCat("header ", h.name(), ": ", h.value_regex()));
  }
  if (!filter.path_regex().empty()) parts.push_back(absl::StrCat("path ", filter.path_regex()));
  if (!filter.method().empty()) parts.push_back(absl::StrCat("method ", filter.method()));
  return absl::StrJoin(parts, filter.match_any() ? " or " : " and ");
}

absl::StatusOr<std::optional<client::HttpFilter>> parseStealFilter(const FilterFlags& flags) {
  auto parsed = parseHttpFilter(flags);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->has_value()) return std::optional<client::HttpFilter>();
  const v1::HttpFilter& f = **parsed;
  client::HttpFilter out;
  for (const v1::HeaderFilter& h : f.headers()) out.headers.emplace_back(h.name(), h.value_regex());
  out.path_regex = f.path_regex();
  out.method = f.method();
  out.match_any = f.match_any();
  return std::optional<client::HttpFilter>(std::move(out));
}

std::string filterText(const client::HttpFilter& filter) {
  std::vector<std::string> parts;
  for (const auto& [name, regex] : filter.headers) {
    parts.push_back(absl::StrCat("header ", name, ": ", regex));
  }
  if (!filter.path_regex.empty()) parts.push_back(absl::StrCat("path ", filter.path_regex));
  if (!filter.method.empty()) parts.push_back(absl::StrCat("method ", filter.method));
  return absl::StrJoin(parts, filter.match_any ? " or " : " and ");
}

std::string StealRoute::to() const { return hostPort(host, to_port); }

absl::StatusOr<StealRoute> parseStealTarget(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return protoError(v1::INVALID_ARGUMENT, absl::StrCat("bad --to '", asv(text), "': ", asv(why),
                                                         " (want HOST:PORT, IPv6 as [ADDR]:PORT)"));
  };
  StealRoute r;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("unbalanced brackets");
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("no port after ']'");
    r.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    r.host = std::string(text.substr(0, colon));
    if (r.host.find(':') != std::string::npos) return bad("IPv6 addresses need [brackets]");
    if (r.host.find_first_of("[]") != std::string::npos) return bad("unbalanced brackets");
    port = text.substr(colon + 1);
  }
  if (r.host.empty()) return bad("no host");
  if (!parsePort(port, &r.to_port)) return bad("port must be a number from 1 to 65535");
  return r;
}

absl::StatusOr<std::vector<StealRoute>> pairStealRoutes(const std::vector<std::string>& ports,
                                                        const std::vector<std::string>& tos) {
  if (ports.empty()) return protoError(v1::INVALID_ARGUMENT, "give at least one --port");
  if (ports.size() != tos.size()) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat(ports.size(), " --port but ", tos.size(),
                                   " --to: give one --to per --port (the i-th --to goes with the "
                                   "i-th --port)"));
  }
  std::vector<StealRoute> routes;
  std::set<uint16_t> seen;
  for (size_t i = 0; i < ports.size(); ++i) {
    uint16_t port = 0;
    if (!parsePort(ports[i], &port)) {
      return protoError(v1::INVALID_ARGUMENT, absl::StrCat("bad --port '", ports[i],
                                                           "': must be a number from 1 to 65535"));
    }
    if (!seen.insert(port).second) {
      return protoError(v1::INVALID_ARGUMENT,
                        absl::StrCat("--port ", port, " is given twice: a port has one --to"));
    }
    auto route = parseStealTarget(tos[i]);
    if (!route.ok()) return route.status();
    route->port = port;
    routes.push_back(*std::move(route));
  }
  return routes;
}

namespace {

std::string stealingLineWith(const StealRoute& route, std::string_view backend,
                             uint64_t subscription_id, bool json,
                             const std::optional<std::string>& filter) {
  if (json) {
    JsonLine j("stealing");
    j.add("port", uint64_t{route.port})
        .add("to", route.to())
        .add("backend", backend)
        .add("subscription_id", subscription_id);
    if (filter) j.add("filter", *filter);
    return j.take();
  }
  return absl::StrCat("stealing port ", route.port, " -> ", route.to(), " (backend ",
                      backend.empty() ? "unknown" : asv(backend),
                      filter ? absl::StrCat(", filter ", *filter) : "", ")\n");
}

}  // namespace

std::string stealingLine(const StealRoute& route, std::string_view backend,
                         uint64_t subscription_id, bool json, const v1::HttpFilter* filter) {
  return stealingLineWith(route, backend, subscription_id, json,
                          filter ? std::optional<std::string>(filterText(*filter)) : std::nullopt);
}

std::string stealingLine(const StealRoute& route, std::string_view backend,
                         uint64_t subscription_id, bool json, const client::HttpFilter* filter) {
  return stealingLineWith(route, backend, subscription_id, json,
                          filter ? std::optional<std::string>(filterText(*filter)) : std::nullopt);
}

std::string requestLine(const RequestEvent& e, bool json) {
  if (json) {
    JsonLine j("request");
    j.add("source", e.source).add("destination", e.destination).add("port", uint64_t{e.port});
    j.add("method", e.method).add("path", e.path).add("to", e.to);
    j.add("status", static_cast<uint64_t>(e.status > 0 ? e.status : 0));
    j.add("in", e.in).add("out", e.out);
    if (!e.error.empty()) j.add("error", e.error);
    return j.take();
  }
  std::string line = absl::StrCat(
      "request ", e.source.empty() ? "?" : e.source, " ", e.method.empty() ? "?" : e.method, " ",
      e.path.empty() ? "?" : e.path, " -> ", e.to, ": ",
      e.status > 0 ? absl::StrCat(e.status) : "reset", " in=", e.in, " out=", e.out);
  if (!e.error.empty()) absl::StrAppend(&line, " (", e.error, ")");
  line.push_back('\n');
  return line;
}

std::string overlapLine(const OverlapEvent& e, bool json) {
  if (json) {
    return JsonLine("overlap")
        .add("port", uint64_t{e.port})
        .add("requests", e.requests)
        .add("taken_by", e.taken_by)
        .add("taken_by_client", e.client)
        .add("method", e.method)
        .add("path", e.path)
        .take();
  }
  std::string line =
      absl::StrCat("overlap: ", e.requests, e.requests == 1 ? " request" : " requests", " to port ",
                   e.port, " matching this filter went to subscription ", e.taken_by);
  if (!e.client.empty()) absl::StrAppend(&line, " of client \"", e.client, "\"");
  if (!e.method.empty() || !e.path.empty()) {
    absl::StrAppend(&line, " (first: ", e.method, e.method.empty() ? "" : " ", e.path, ")");
  }
  line.push_back('\n');
  return line;
}

std::string openLine(const StolenEvent& e, bool json) {
  if (json) return connectionJson("open", e).take();
  return absl::StrCat("open ", connectionText(e), " => ", e.to, "\n");
}

std::string failedLine(const StolenEvent& e, bool json) {
  if (json) return connectionJson("failed", e).add("error", e.error).take();
  return absl::StrCat("failed ", connectionText(e), " => ", e.to, ": ", e.error, "\n");
}

std::string closeLine(const StolenEvent& e, bool json) {
  if (json) {
    JsonLine j = connectionJson("close", e);
    j.add("in", e.in).add("out", e.out);
    if (!e.error.empty()) j.add("error", e.error);
    return j.take();
  }
  std::string line = absl::StrCat("close ", connectionText(e), " in=", e.in, " out=", e.out);
  if (!e.error.empty()) absl::StrAppend(&line, " (", e.error, ")");
  line.push_back('\n');
  return line;
}

std::string stoppingLine(uint64_t open_connections, bool json, uint64_t open_requests) {
  if (json) {
    JsonLine j("stopping");
    j.add("open_connections", open_connections);
    if (open_requests > 0) j.add("open_requests", open_requests);
    return j.take();
  }
  return absl::StrCat(
      "stopping: waiting for ", open_connections, " open connection",
      open_connections == 1 ? "" : "s",
      open_requests == 0
          ? ""
          : absl::StrCat(" and ", open_requests, open_requests == 1 ? " request" : " requests"),
      " (signal again to end them)\n");
}

std::string drainingLine(const std::string& reason, int64_t seconds_left, uint64_t open_connections,
                         bool json) {
  if (json) {
    return JsonLine("agent_draining")
        .add("reason", reason)
        .add("seconds_left", seconds_left)
        .add("open_connections", open_connections)
        .take();
  }
  return absl::StrCat("agent draining (", reason, "): new connections go to the application; ",
                      open_connections, " open connection", open_connections == 1 ? "" : "s",
                      " may go on for up to ", seconds_left, " s\n");
}

std::string targetRestartedLine(const TargetRestart& r, std::string_view what_goes_on,
                                bool json) {
  if (json) {
    return JsonLine("target_restarted")
        .add("previous_pid", static_cast<int64_t>(r.previous_pid))
        .add("pid", static_cast<int64_t>(r.pid))
        .add("container_id", r.container_id)
        .add("down_ms", r.down_ms)
        .add("restarts", static_cast<uint64_t>(r.restarts))
        .take();
  }
  return absl::StrCat("target restarted: pid ", r.previous_pid, " -> ", r.pid,
                      r.container_id.empty() ? "" : absl::StrCat(" (container ", r.container_id, ")"),
                      ", down ", r.down_ms, " ms; ", asv(what_goes_on), "\n");
}

std::string movedLine(const AgentMove& m, bool json) {
  if (json) {
    return JsonLine("agent_moved")
        .add("from", m.from)
        .add("to", m.to)
        .add("reason", m.reason)
        .addBool("draining", m.draining)
        .add("connections", m.connections)
        .add("ports_back", m.ports_back)
        .add("ports_lost", m.ports_lost)
        .take();
  }
  std::string line =
      m.draining ? absl::StrCat("agent ", m.from, " draining; moved to agent ", m.to, "; ",
                                m.connections, m.connections == 1 ? " connection" : " connections",
                                " finishing on ", m.from)
                 : absl::StrCat("agent ", m.from, " lost (", m.reason, "); moved to agent ", m.to,
                                "; ", m.connections,
                                m.connections == 1 ? " connection" : " connections", " reset");
  if (m.ports_lost > 0) {
    absl::StrAppend(&line, "; ", m.ports_lost, m.ports_lost == 1 ? " port" : " ports",
                    " could not be stolen again");
  }
  line.push_back('\n');
  return line;
}

std::string restealFailedLine(uint16_t port, const std::string& agent, const std::string& error,
                              bool json) {
  if (json) {
    return JsonLine("steal_lost")
        .add("port", uint64_t{port})
        .add("agent", agent)
        .add("error", error)
        .take();
  }
  return absl::StrCat("steal port ", port, " on agent ", agent, " failed: ", error,
                      " (the port is no longer stolen)\n");
}

std::string resumedLine(const std::string& agent, const std::string& cut, bool json) {
  if (json) return JsonLine("resumed").add("agent", agent).add("cut", cut).take();
  return absl::StrCat("connection to agent ", agent, " cut (", cut,
                      "); session resumed, nothing lost\n");
}

std::string summaryLine(const StealTotals& t, bool json) {
  // Requests are counted when there can be some; an unfiltered steal's
  // summary stays as it always was.
  const bool requests = t.filtered || t.requests > 0;
  if (json) {
    JsonLine j("summary");
    j.add("connections", t.connections).add("failed", t.failed);
    if (requests) j.add("requests", t.requests).add("requests_failed", t.requests_failed);
    return j.add("in", t.in).add("out", t.out).take();
  }
  std::string line =
      absl::StrCat("summary: ", t.connections, t.connections == 1 ? " connection" : " connections");
  if (requests) {
    absl::StrAppend(&line, ", ", t.requests, t.requests == 1 ? " request" : " requests");
    if (t.requests_failed > 0) absl::StrAppend(&line, " (", t.requests_failed, " failed)");
  }
  absl::StrAppend(&line, ", in=", t.in, " bytes, out=", t.out, " bytes\n");
  return line;
}

}  // namespace siphon::cli
