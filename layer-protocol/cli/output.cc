#include "cli/output.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/json_writer.h"

namespace siphon::cli {
namespace {

std::vector<std::string> featureNames(const client::TargetInfo& info) {
  std::vector<std::string> names;
  for (const std::string& f : info.features) names.push_back(featureName(f));
  return names;
}

std::vector<const client::EnvVar*> sortedVars(const std::vector<client::EnvVar>& vars) {
  std::vector<const client::EnvVar*> sorted;
  for (const auto& v : vars) sorted.push_back(&v);
  // The library sorts them; sorting here keeps the output stable whatever
  // it is given.
  std::stable_sort(
      sorted.begin(), sorted.end(),
      [](const client::EnvVar* a, const client::EnvVar* b) { return a->name < b->name; });
  return sorted;
}

}  // namespace

std::string featureName(std::string_view feature) {
  constexpr std::string_view kPrefix = "FEATURE_";
  if (feature.substr(0, kPrefix.size()) == kPrefix) feature.remove_prefix(kPrefix.size());
  return absl::AsciiStrToLower(absl::string_view(feature.data(), feature.size()));
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

std::string infoText(const client::TargetInfo& info) {
  std::vector<std::pair<std::string, std::string>> rows = {
      {"agent_version", info.agent_version}, {"protocol_version", info.protocol_version},
      {"session_id", info.session_id},       {"target", info.mode},
      {"pid", absl::StrCat(info.pid)},       {"netns", netnsName(info.netns_inode)},
  };
  if (!info.container_id.empty()) rows.emplace_back("container_id", info.container_id);
  if (!info.runtime.empty()) rows.emplace_back("runtime", info.runtime);
  rows.emplace_back("features", absl::StrJoin(featureNames(info), ", "));
  rows.emplace_back("sessions", absl::StrCat(info.sessions));
  rows.emplace_back("hostname", info.hostname);
  rows.emplace_back("uptime", formatUptime(info.uptime_ms));

  size_t width = 0;
  for (const auto& [k, v] : rows) width = std::max(width, k.size());
  std::string out;
  for (const auto& [k, v] : rows) {
    absl::StrAppend(&out, k, std::string(width - k.size() + 2, ' '), v, "\n");
  }
  return out;
}

std::string infoJson(const client::TargetInfo& info) {
  JsonWriter w;
  w.beginObject();
  w.key("agent_version").value(info.agent_version);
  w.key("protocol_version").value(info.protocol_version);
  w.key("session_id").value(info.session_id);
  w.key("target").beginObject();
  w.key("mode").value(info.mode);
  w.key("pid").value(info.pid);
  w.key("netns_inode").value(info.netns_inode);
  w.key("netns").value(netnsName(info.netns_inode));
  w.key("container_id").value(info.container_id);
  w.key("runtime").value(info.runtime);
  w.endObject();
  w.key("features").beginArray();
  for (const auto& name : featureNames(info)) w.value(name);
  w.endArray();
  w.key("sessions").value(info.sessions);
  w.key("hostname").value(info.hostname);
  w.key("uptime_ms").value(info.uptime_ms);
  w.endObject();
  return w.take();
}

std::string envText(const std::vector<client::EnvVar>& vars) {
  std::string out;
  for (const client::EnvVar* v : sortedVars(vars))
    absl::StrAppend(&out, v->name, "=", v->value, "\n");
  return out;
}

std::string envJson(const std::vector<client::EnvVar>& vars) {
  JsonWriter w;
  w.beginObject();
  for (const client::EnvVar* v : sortedVars(vars)) w.key(v->name).value(v->value);
  w.endObject();
  return w.take();
}

}  // namespace siphon::cli
