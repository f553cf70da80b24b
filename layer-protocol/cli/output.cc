#include "cli/output.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/json_writer.h"
#include "siphon/protocol/handshake.h"
#include "siphon/v1/handshake.pb.h"

namespace siphon::cli {
namespace {

std::vector<std::string> featureNames(const v1::InfoResponse& info) {
  std::vector<std::string> names;
  for (int f : info.features()) names.push_back(featureName(f));
  return names;
}

std::vector<const v1::EnvVar*> sortedVars(const v1::EnvResponse& env) {
  std::vector<const v1::EnvVar*> vars;
  for (const auto& v : env.vars()) vars.push_back(&v);
  // The agent sends them sorted; sorting here keeps the output stable
  // whatever the agent does.
  std::stable_sort(vars.begin(), vars.end(),
                   [](const v1::EnvVar* a, const v1::EnvVar* b) { return a->name() < b->name(); });
  return vars;
}

}  // namespace

std::string featureName(int feature) {
  if (!v1::Feature_IsValid(feature) || feature == v1::FEATURE_UNSPECIFIED) {
    return absl::StrCat("unknown_", feature);
  }
  std::string name = v1::Feature_Name(static_cast<v1::Feature>(feature));
  constexpr std::string_view kPrefix = "FEATURE_";
  if (name.compare(0, kPrefix.size(), kPrefix) == 0) name.erase(0, kPrefix.size());
  return absl::AsciiStrToLower(name);
}

std::string netnsName(uint64_t inode) { return absl::StrCat("net:[", inode, "]"); }

std::string formatUptime(int64_t ms) {
  if (ms < 0) ms = 0;
  if (ms < 1000) return absl::StrCat(ms, "ms");
  if (ms < 60'000) return absl::StrFormat("%.1fs", static_cast<double>(ms) / 1000.0);
  int64_t s = ms / 1000;
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm%02ds", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%dd%02dh%02dm", s / 86400, (s / 3600) % 24, (s / 60) % 60);
}

std::string infoText(const v1::InfoResponse& info) {
  const auto& t = info.target();
  std::vector<std::pair<std::string, std::string>> rows = {
      {"agent_version", info.agent_version()},
      {"protocol_version", protocol::versionString(info.protocol_version())},
      {"session_id", info.session_id()},
      {"target", t.mode()},
      {"pid", absl::StrCat(t.pid())},
      {"netns", netnsName(t.netns_inode())},
  };
  if (!t.container_id().empty()) rows.emplace_back("container_id", t.container_id());
  if (!t.runtime().empty()) rows.emplace_back("runtime", t.runtime());
  rows.emplace_back("features", absl::StrJoin(featureNames(info), ", "));
  rows.emplace_back("sessions", absl::StrCat(info.sessions()));
  rows.emplace_back("hostname", info.hostname());
  rows.emplace_back("uptime", formatUptime(info.uptime_ms()));

  size_t width = 0;
  for (const auto& [k, v] : rows) width = std::max(width, k.size());
  std::string out;
  for (const auto& [k, v] : rows) {
    absl::StrAppend(&out, k, std::string(width - k.size() + 2, ' '), v, "\n");
  }
  return out;
}

std::string infoJson(const v1::InfoResponse& info) {
  const auto& t = info.target();
  JsonWriter w;
  w.beginObject();
  w.key("agent_version").value(info.agent_version());
  w.key("protocol_version").value(protocol::versionString(info.protocol_version()));
  w.key("session_id").value(info.session_id());
  w.key("target").beginObject();
  w.key("mode").value(t.mode());
  w.key("pid").value(t.pid());
  w.key("netns_inode").value(t.netns_inode());
  w.key("netns").value(netnsName(t.netns_inode()));
  w.key("container_id").value(t.container_id());
  w.key("runtime").value(t.runtime());
  w.endObject();
  w.key("features").beginArray();
  for (const auto& name : featureNames(info)) w.value(name);
  w.endArray();
  w.key("sessions").value(info.sessions());
  w.key("hostname").value(info.hostname());
  w.key("uptime_ms").value(info.uptime_ms());
  w.endObject();
  return w.take();
}

std::string envText(const v1::EnvResponse& env) {
  std::string out;
  for (const v1::EnvVar* v : sortedVars(env))
    absl::StrAppend(&out, v->name(), "=", v->value(), "\n");
  return out;
}

std::string envJson(const v1::EnvResponse& env) {
  JsonWriter w;
  w.beginObject();
  for (const v1::EnvVar* v : sortedVars(env)) w.key(v->name()).value(v->value());
  w.endObject();
  return w.take();
}

}  // namespace siphon::cli
