// What the CLI prints for each command, as text and as JSON. Pure functions
// of the responses, so the formats are unit-tested.
#pragma once

#include <cstdint>
#include <string>

#include "siphon/v1/services.pb.h"

namespace siphon::cli {

// "env", "info", "outgoing_tcp"...: the enum name without FEATURE_, in lower
// case; "unknown_N" for a value this build does not know.
std::string featureName(int feature);

// "net:[4026531840]", as readlink(/proc/PID/ns/net) shows it.
std::string netnsName(uint64_t inode);

// "850ms", "12.3s", "4m05s", "2h03m04s", "3d04h05m".
std::string formatUptime(int64_t ms);

// Aligned "key  value" lines.
std::string infoText(const v1::InfoResponse& info);
// {agent_version, protocol_version "1.0", session_id, target{mode, pid,
// netns_inode, netns, container_id, runtime}, features [names], sessions,
// hostname, uptime_ms}.
std::string infoJson(const v1::InfoResponse& info);

// NAME=VALUE lines, sorted by name (bytewise). Values are printed as they
// are, like env(1) does.
std::string envText(const v1::EnvResponse& env);
// {"NAME": "value", ...}, sorted by name.
std::string envJson(const v1::EnvResponse& env);

}  // namespace siphon::cli
