// A PacketSource for tests without root: packets are pushed by the test
// (from any thread) and handed out by read(); its selectable fd is an
// eventfd signalled on each push. Like an edge-triggered source, read()
// clears the signal even when packets are left, so a reader that waits
// for readiness after a full batch (instead of reading on) gets stuck and
// the test sees it.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "agent/capture/packet_source.h"
#include "siphon/status.h"

namespace siphon::fakes {

// What the test keeps of a source it handed over.
struct FakePacketSourceState {
  std::mutex mu;
  std::deque<std::string> packets;  // payloads, in order
  uint32_t kernel_drops = 0;        // what kernelDrops() reports
  absl::Status read_error;          // returned by the next read() when set
  std::atomic<bool> closed{false};  // the source was destroyed
  std::atomic<int> reads{0};
  std::string filter;  // what setFilter() installed (under mu)
  int event_fd = -1;
  // Packets handed out so far by any source of this state (the next one's
  // serial): a source adopting the state, as a handover's adopts a ring,
  // goes on with the stamps.
  uint64_t handed = 0;

  FakePacketSourceState() : event_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~FakePacketSourceState() { ::close(event_fd); }

  void push(std::string payload) {
    {
      std::lock_guard<std::mutex> l(mu);
      packets.push_back(std::move(payload));
    }
    signal();
  }
  void setKernelDrops(uint32_t n) {
    std::lock_guard<std::mutex> l(mu);
    kernel_drops = n;
  }
  void failNextRead(absl::Status s) {
    {
      std::lock_guard<std::mutex> l(mu);
      read_error = std::move(s);
    }
    signal();
  }
  std::string installedFilter() {
    std::lock_guard<std::mutex> l(mu);
    return filter;
  }
  size_t waiting() {
    std::lock_guard<std::mutex> l(mu);
    return packets.size();
  }
  void signal() {
    uint64_t one = 1;
    (void)!::write(event_fd, &one, sizeof(one));
  }
};

class FakePacketSource : public agent::capture::PacketSource {
 public:
  static constexpr uint32_t kLinkType = 113;  // LINKTYPE_LINUX_SLL

  explicit FakePacketSource(std::shared_ptr<FakePacketSourceState> state, uint32_t snaplen = 65535)
      : state_(std::move(state)), snaplen_(snaplen) {}
  ~FakePacketSource() override { state_->closed = true; }

  uint32_t linkType() const override { return kLinkType; }
  uint32_t snaplen() const override { return snaplen_; }
  int dataLink() const override { return static_cast<int>(kLinkType); }  // DLT_ == LINKTYPE_ here
  absl::Status setFilter(const agent::capture::CompiledFilter& filter) override {
    std::lock_guard<std::mutex> l(state_->mu);
    state_->filter = filter.expression();
    return absl::OkStatus();
  }
  int selectableFd() const override { return state_->event_fd; }

  absl::StatusOr<int> read(int max, agent::capture::PacketSink& sink) override {
    ++state_->reads;
    uint64_t drained;
    (void)!::read(state_->event_fd, &drained, sizeof(drained));  // the edge is consumed
    std::deque<std::string> batch;
    {
      std::lock_guard<std::mutex> l(state_->mu);
      if (!state_->read_error.ok()) return std::exchange(state_->read_error, absl::OkStatus());
      while (static_cast<int>(batch.size()) < max && !state_->packets.empty()) {
        batch.push_back(std::move(state_->packets.front()));
        state_->packets.pop_front();
      }
    }
    for (const std::string& p : batch) sink.onPacket(packetFor(state_->handed++, p));
    return static_cast<int>(batch.size());
  }

  absl::StatusOr<uint32_t> kernelDrops() override {
    std::lock_guard<std::mutex> l(state_->mu);
    return state_->kernel_drops;
  }

  // The n-th packet handed out (from 0): its payload with made-up timestamps.
  static agent::capture::Packet packetFor(uint64_t serial, const std::string& payload) {
    agent::capture::Packet packet;
    packet.ts_sec = 1700000000 + static_cast<int64_t>(serial);
    packet.ts_usec = static_cast<int64_t>(serial % 1000000);
    packet.caplen = static_cast<uint32_t>(payload.size());
    packet.len = static_cast<uint32_t>(payload.size());
    packet.data = reinterpret_cast<const uint8_t*>(payload.data());
    return packet;
  }

 private:
  std::shared_ptr<FakePacketSourceState> state_;
  uint32_t snaplen_;
};

}  // namespace siphon::fakes
