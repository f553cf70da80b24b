// Who owns a target's iptables chains, and whether that owner is alive.
//
// Each iptables steering has an owner id (iptables_rules.h: it is part of
// its chain names) and holds that owner's lock for as long as its chains
// may exist: an abstract unix socket named ownerLockName(inode, owner),
// bound in the TARGET's network namespace. Abstract names belong to a
// netns, so every agent on the target sees the same lock whatever its
// mount namespace, and the kernel releases it when the last descriptor of
// the socket is closed: the agent and its guard (which inherits it) both
// hold one, so the lock is free exactly when both are gone. A bind that
// fails with EADDRINUSE means the owner is alive.
//
// The stale sweep takes a free lock before it removes that owner's chains
// and keeps it until they are gone, so two sweeping agents never remove
// the same chains at once.
//
// The target's own processes share the netns and may bind such a name
// too. That cannot make a live owner look dead (a bound name cannot be
// taken from its holder); it can only keep stale chains of the target's
// own netns (redirecting to a closed port of its own) or refuse an id, and
// the steering then picks another or fails with ALREADY_EXISTS.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"

namespace siphon::agent::steal {

// Takes `owner`'s lock: the descriptor that holds it (closing it frees the
// lock), ALREADY_EXISTS when someone holds it already (its owner is alive),
// another error when the lock cannot be tried.
using OwnerLock = std::function<absl::StatusOr<UniqueFd>(std::string_view owner)>;

// The real locks of the target whose netns is `netns_fd` (borrowed; must
// outlive the function) and whose inode is `netns_inode`. The socket is
// made in that netns by a short-lived thread that enters it.
OwnerLock netnsOwnerLock(int netns_fd, uint64_t netns_inode);

// A fresh random owner id (kOwnerIdLength hex digits).
std::string newOwnerId();

}  // namespace siphon::agent::steal
