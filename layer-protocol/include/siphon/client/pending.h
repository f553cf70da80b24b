// An answer still to come: what a typed call that pipelines (File::startPread,
// File::startPwrite) hands back at once, after its request has been queued on
// the session. Requests go out in the order they were started; take the
// answers with get(), in any order, each once.
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "siphon/transport/asio.h"

namespace siphon::client {

template <typename T>
struct PendingSlot {
  explicit PendingSlot(net::asio::any_io_executor ex) : done(std::move(ex)) {}
  net::Signal done;
  std::optional<absl::StatusOr<T>> result;
  void set(absl::StatusOr<T> r) {
    result = std::move(r);
    done.notify();
  }
};

template <typename T>
class Pending {
 public:
  explicit Pending(std::shared_ptr<PendingSlot<T>> slot) : slot_(std::move(slot)) {}
  bool ready() const { return slot_->result.has_value(); }
  // Waits for the answer; a second get() answers FAILED_PRECONDITION.
  net::awaitable<absl::StatusOr<T>> get() {
    const auto slot = slot_;
    while (!slot->result) co_await slot->done.wait();
    if (taken_) co_return absl::FailedPreconditionError("the answer was taken already");
    taken_ = true;
    co_return std::move(*slot->result);
  }

 private:
  std::shared_ptr<PendingSlot<T>> slot_;
  bool taken_ = false;
};

}  // namespace siphon::client
