// The per-project config file: what a developer would otherwise retype on
// every command (target, namespace, agent options, steal/mirror ports and
// filters, env include/exclude, --fs-remote paths), kept next to the code.
//
// One format, JSON, with the flags' own names as keys (the same names as
// `siphon exec -f`): global options at the top level, a command's options
// in an object named after it ("fs": {"mount": {...}} for `fs mount`):
//
//   {
//     "target": "deploy/web", "namespace": "shop",
//     "agent-namespace": "siphon", "agent-image": "registry.example/siphon-agent:0.1.0",
//     "steal": {"port": [8080], "filter-header": ["x-user: ^me$"]},
//     "env": {"include": ["DB_*"]},
//     "exec": {"steal": ["8080"], "env-exclude": ["*SECRET*"], "fs-remote": ["/etc/app"]}
//   }
//
// Found as `.siphon.json` in the working directory or the nearest directory
// above it (--config F names one). Flags on the command line win over the
// file; a command's section counts only when that command runs (the keys of
// the others are still checked). An unknown key or a bad value is an error naming the
// file, the line and the key.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::cli {

inline constexpr char kProjectConfigName[] = ".siphon.json";

struct ConfigEntry {
  std::vector<std::string> section;  // {} the top level; {"steal"}; {"fs", "mount"}
  std::string key;
  std::vector<std::string> values;  // a list's items, or the one value
  bool is_list = false;
  int line = 0;
};

struct ProjectConfig {
  std::string path;
  std::vector<ConfigEntry> entries;
};

// `.siphon.json` in `dir` or the nearest directory above it.
std::optional<std::string> findProjectConfig(const std::string& dir);

// INVALID_ARGUMENT "FILE:LINE: ..." for malformed JSON, a top level that is
// not an object, or a value that is neither a string, a number, a boolean,
// a list of those nor (for a command) an object.
absl::StatusOr<ProjectConfig> parseProjectConfig(const std::string& text, const std::string& path);
absl::StatusOr<ProjectConfig> loadProjectConfig(const std::string& path);

// Sets every option of `app` (parsed already) that the command line did not
// give from the file. INVALID_ARGUMENT "FILE:LINE: key 'K': why" for a key
// that names no option (of siphon, or of that command) and for a value the
// option refuses.
absl::Status applyProjectConfig(const ProjectConfig& config, CLI::App& app);

}  // namespace siphon::cli
