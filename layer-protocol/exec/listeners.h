// The TCP listeners of a network namespace, as /proc/PID/net/tcp and tcp6
// show them: how `siphon exec --incoming` learns which ports the program
// listens on (a listen() makes no event siphon could wait for from outside
// the program's namespace, and the file is readable by the program's own
// user).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace siphon::exec {

struct Listener {
  std::string address;  // numeric: "0.0.0.0", "127.0.0.1", "::", "::1"...
  uint16_t port = 0;
  bool v6 = false;

  // Where a connection to this listener goes from inside its namespace: a
  // wildcard listener is reached on the loopback of its family.
  std::string dialAddress() const;
  bool operator==(const Listener&) const = default;
};

// The LISTEN sockets (state 0A) of one /proc/net/tcp (v6 false) or tcp6
// (v6 true) text. Malformed lines are skipped.
std::vector<Listener> parseListeners(std::string_view text, bool v6);

}  // namespace siphon::exec
