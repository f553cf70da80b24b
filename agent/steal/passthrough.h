// Passthrough: a connection the agent accepted but does not give to a
// session (it arrived just after an unsubscribe, or — with HTTP filters —
// no filter wanted it) goes to the original application. The agent
// connects to the original destination from inside the target, around its
// own steering (Steering::exempt), and splices the two sockets both ways.
//
// The splice keeps TCP semantics: EOF one way becomes shutdown(SHUT_WR) the
// other way; an error or reset on either side aborts both with RST, so no
// side mistakes a broken transfer for a complete one.
//
// Handover (docs/CONTINUITY.md section 8): freeze() stops both directions
// at their next step (a read or a write under way is cancelled; bytes read
// and not yet written are kept); once parked(), exportState() gives copies
// of both sockets and those bytes, and restoreSplice() goes on with them in
// another process exactly where this one stopped.
//
// Threads: the event loop that owns the sockets.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::steal {

struct SpliceState;

// A splice. It lives while a direction runs or a handle holds it: keep a
// weak_ptr while it runs (both directions closed, it closes the sockets
// and is gone) and a shared_ptr while it is frozen (parked, nothing else
// holds it).
class SpliceHandle {
 public:
  virtual ~SpliceHandle() = default;
  virtual void freeze() = 0;
  virtual void thaw() = 0;
  // Frozen, and neither direction has an operation under way.
  virtual bool parked() const = 0;
  // Both directions are closed (nothing to move).
  virtual bool finished() const = 0;
  // While parked: copies of both sockets, and what each direction holds.
  virtual absl::StatusOr<SpliceState> exportState() const = 0;
};

struct SpliceState {
  UniqueFd a, b;
  std::string a_to_b, b_to_a;  // read, not yet written
  bool a_to_b_done = false;    // EOF from a passed on (b shut for writing)
  bool b_to_a_done = false;
};

// Joins `a` and `b` (connected, non-blocking TCP sockets) until both
// directions are closed. Returns at once; the splice owns the sockets.
// `done` (optional) runs on the event loop once both sockets are closed.
std::shared_ptr<SpliceHandle> splice(net::asio::any_io_executor ex, UniqueFd a, UniqueFd b,
                                     std::function<void()> done = {});

// A splice another process exported, frozen until thaw().
std::shared_ptr<SpliceHandle> restoreSplice(net::asio::any_io_executor ex, SpliceState state,
                                            std::function<void()> done = {});

}  // namespace siphon::agent::steal
