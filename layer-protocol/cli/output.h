// What the CLI prints for `info` and `env`, as text and as JSON. Pure
// functions of the typed API's answers, so the formats are unit-tested.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "siphon/client/env.h"
#include "siphon/client/target.h"

namespace siphon::cli {

// "env", "info", "outgoing_tcp"... for the typed API's "FEATURE_ENV"...:
// without FEATURE_, in lower case ("unknown_N" for its "UNKNOWN_N", a value
// this build does not know).
std::string featureName(std::string_view feature);

// "net:[4026531840]", as readlink(/proc/PID/ns/net) shows it.
std::string netnsName(uint64_t inode);

// "850ms", "12.3s", "4m05s", "2h03m04s", "3d04h05m".
std::string formatUptime(int64_t ms);

// Aligned "key  value" lines.
std::string infoText(const client::TargetInfo& info);
// {agent_version, protocol_version "1.0", session_id, target{mode, pid,
// netns_inode, netns, container_id, runtime}, features [names], sessions,
// hostname, uptime_ms}.
std::string infoJson(const client::TargetInfo& info);

// NAME=VALUE lines, sorted by name (bytewise). Values are printed as they
// are, like env(1) does.
std::string envText(const std::vector<client::EnvVar>& vars);
// {"NAME": "value", ...}, sorted by name.
std::string envJson(const std::vector<client::EnvVar>& vars);

}  // namespace siphon::cli
