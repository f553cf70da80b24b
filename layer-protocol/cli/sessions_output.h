// What `siphon sessions` prints: the agent's sessions as an aligned table
// or as JSON. Pure functions of the typed API's answer, unit-tested.
#pragma once

#include <string>
#include <vector>

#include "siphon/client/target.h"

namespace siphon::cli {

// "steal 80", "steal 80 [header x-user: ^me$]", "mirror 8080 both".
std::string subscriptionText(const client::SessionSubscription& sub);

// One row per session under a header line; the session that asked is
// marked with "*" in the first column. Bytes are exact counts.
std::string sessionsText(const std::vector<client::SessionInfo>& sessions);
// {"sessions": [{session_id, client_name, age_ms, state, current, streams,
// bytes_in, bytes_out, subscriptions [{id, kind, port, filter, backend,
// both_directions}]}]}
std::string sessionsJson(const std::vector<client::SessionInfo>& sessions);

}  // namespace siphon::cli
