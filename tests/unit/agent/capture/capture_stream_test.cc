// CaptureStream without root: a fake packet source (tests/fakes) and two
// in-process protocol::Sessions (agent and client) joined by a pipe that
// moves takeWrites() bytes into the other's onBytes(). The event loop is
// driven with poll() until nothing moves, so no result depends on timing.
#include "agent/capture/capture_stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/capture/pcap_file.h"
#include "siphon/protocol/session.h"
#include "siphon/status.h"
#include "tests/fakes/fake_packet_source.h"

namespace siphon::agent::capture {
namespace {

namespace asio = net::asio;
using fakes::FakePacketSource;
using fakes::FakePacketSourceState;
using ::testing::HasSubstr;

// What reached the client, in order: Data frames and gaps.
struct Event {
  enum Kind { kData, kGap } kind;
  std::string data;
  uint64_t packets = 0;
  uint64_t bytes = 0;
};

class ClientSide : public protocol::SessionHandler {
 public:
  explicit ClientSide(protocol::Session& s) : session(s) {}
  protocol::Session& session;
  bool hold = false;  // do not consume (a client that stopped reading)
  uint64_t unconsumed = 0;
  std::vector<Event> events;
  bool accepted = false;
  bool half_closed = false;
  std::optional<v1::Error> reset;

  void onStreamAccept(v1::StreamAccept) override { accepted = true; }
  void onStreamData(uint64_t id, std::string_view payload) override {
    events.push_back({Event::kData, std::string(payload)});
    if (hold) {
      unconsumed += payload.size();
    } else {
      session.consumed(id, payload.size());
    }
  }
  void onStreamGap(v1::StreamGap gap) override {
    events.push_back({Event::kGap, "", gap.packets(), gap.bytes()});
  }
  void onStreamHalfClose(uint64_t) override { half_closed = true; }
  void onStreamReset(uint64_t, v1::Error e) override { reset = std::move(e); }

  void consumeNow(uint64_t id) {
    hold = false;
    session.consumed(id, unconsumed);
    unconsumed = 0;
  }
  std::vector<std::string> data() const {
    std::vector<std::string> out;
    for (const auto& e : events)
      if (e.kind == Event::kData) out.push_back(e.data);
    return out;
  }
  std::vector<Event> gaps() const {
    std::vector<Event> out;
    for (const auto& e : events)
      if (e.kind == Event::kGap) out.push_back(e);
    return out;
  }
};

// The agent side: routes the stream's frames to the capture like
// AgentSession does, and is its host.
class AgentSide : public protocol::SessionHandler, public SessionHost {
 public:
  AgentSide(protocol::Session& s, std::function<void()> wake)
      : session_(s), wake_(std::move(wake)) {}

  std::shared_ptr<CaptureStream> stream;
  bool released = false;
  bool is_ended = false;
  std::vector<v1::StreamOpen> opens;

  // SessionHost: what the capture stream uses of it.
  const std::string& id() const override { return id_; }
  const std::string& clientName() const override { return id_; }
  bool ended() const override { return is_ended; }
  protocol::Session& session() override { return session_; }
  void respond(v1::Response) override {}
  void registerStream(uint64_t, std::shared_ptr<StreamEndpoint>) override {}
  void unregisterStream(uint64_t) override {
    released = true;
    stream.reset();
  }
  absl::StatusOr<uint64_t> openStream(v1::StreamOpen open) override {
    return session_.openStream(std::move(open));
  }
  void resetStream(uint64_t id, const v1::Error& error) override {
    session_.resetStream(id, error);
  }
  void wake() override { wake_(); }
  void countSent(uint64_t, uint64_t) override {}
  void countGap(uint64_t, uint64_t) override {}
  void logLimitHit(const absl::Status&) override {}

  void onStreamOpen(v1::StreamOpen open) override { opens.push_back(std::move(open)); }
  void onStreamData(uint64_t id, std::string_view payload) override {
    if (stream) {
      stream->onData(payload);
    } else {
      session_.consumed(id, payload.size());
    }
  }
  void onStreamHalfClose(uint64_t) override {
    if (stream) stream->onHalfClose();
  }
  void onStreamReset(uint64_t, v1::Error e) override {
    if (auto s = std::exchange(stream, nullptr)) s->onReset(e);
  }
  void onStreamWritable(uint64_t) override {
    if (stream) stream->onWritable();
  }

 private:
  std::string id_ = "capture-test";
  protocol::Session& session_;
  std::function<void()> wake_;
};

// No finish delay (the fake has no ring blocks to wait for), unless a test
// sets one.
CaptureStream::Options quick() {
  CaptureStream::Options o;
  o.finish_delay = std::chrono::milliseconds(0);
  return o;
}

std::string payload(int i, size_t size) {
  std::string p(size, '\0');
  for (size_t k = 0; k < size; ++k) p[k] = static_cast<char>((i * 31 + k) & 0xff);
  return p;
}

class CaptureStreamTest : public testing::Test {
 protected:
  void TearDown() override {
    if (agent_ && agent_->stream) agent_->stream->close();
    if (agent_) agent_->stream.reset();
    io_.restart();
    io_.poll();
  }

  void build(protocol::SessionLimits limits = {}) {
    client_session_.emplace(protocol::Role::kClient, limits);
    agent_session_.emplace(protocol::Role::kAgent, limits);
    client_.emplace(*client_session_);
    agent_ = std::make_shared<AgentSide>(*agent_session_, [this] {
      agent_awake_ = true;
      asio::post(io_, [this] { pipe(); });
    });
  }

  // Moves frames both ways until neither side has any to move. Like the
  // agent's transport, the agent side writes only after handling received
  // bytes or when woken.
  void pipe() {
    bool moved = true;
    while (moved) {
      moved = false;
      auto now = protocol::Clock::now();
      while (agent_awake_ && agent_session_->hasWrites()) {
        std::string bytes;
        const protocol::WriteBatch batch = agent_session_->takeWrites();
        for (auto b : batch.buffers()) bytes.append(b);
        ASSERT_TRUE(client_session_->onBytes(bytes, *client_, now).ok());
        moved = true;
      }
      agent_awake_ = false;
      while (client_session_->hasWrites()) {
        std::string bytes;
        const protocol::WriteBatch batch = client_session_->takeWrites();
        for (auto b : batch.buffers()) bytes.append(b);
        ASSERT_TRUE(agent_session_->onBytes(bytes, *agent_, now).ok());
        agent_awake_ = true;
        moved = true;
      }
    }
  }

  void settle() {
    for (int quiet = 0; quiet < 3;) {
      pipe();
      size_t n = io_.poll();
      io_.restart();
      quiet = (n == 0 && !client_session_->hasWrites()) ? quiet + 1 : 0;
    }
  }

  // Opens a capture stream from the client and makes its agent side, not
  // yet started.
  std::shared_ptr<CaptureStream> open(CaptureStream::Options options = quick()) {
    v1::StreamOpen o;
    o.mutable_capture()->set_filter("tcp");
    auto id = client_session_->openStream(o);
    EXPECT_TRUE(id.ok());
    id_ = *id;
    pipe();
    EXPECT_FALSE(agent_->opens.empty());
    options.on_end = [this] { ++ended_; };
    auto stream = std::make_shared<CaptureStream>(io_.get_executor(), id_, agent_, options);
    agent_->stream = stream;
    return stream;
  }

  // open(), accept and start with a fake source.
  std::shared_ptr<CaptureStream> startCapture(CaptureStream::Options options = quick()) {
    auto stream = open(std::move(options));
    v1::StreamAccept accept;
    accept.set_stream_id(id_);
    EXPECT_TRUE(agent_session_->acceptStream(accept).ok());
    agent_->wake();
    stream->start(std::make_unique<FakePacketSource>(source_));
    settle();
    EXPECT_TRUE(client_->accepted);
    return stream;
  }

  std::string recordOf(uint64_t serial, const std::string& p) {
    return record(FakePacketSource::packetFor(serial, p));
  }

  asio::io_context io_;
  std::optional<protocol::Session> client_session_;
  std::optional<protocol::Session> agent_session_;
  std::optional<ClientSide> client_;
  std::shared_ptr<AgentSide> agent_;
  std::shared_ptr<FakePacketSourceState> source_ = std::make_shared<FakePacketSourceState>();
  uint64_t id_ = 0;
  int ended_ = 0;
  bool agent_awake_ = false;
};

TEST_F(CaptureStreamTest, HeaderFirstThenOneRecordPerDataFrame) {
  build();
  startCapture();
  ASSERT_EQ(client_->data().size(), 1u);
  EXPECT_EQ(client_->data()[0], globalHeader(FakePacketSource::kLinkType, 65535));

  std::vector<std::string> sent = {payload(0, 60), payload(1, 1500), payload(2, 1)};
  for (const auto& p : sent) source_->push(p);
  settle();
  auto data = client_->data();
  ASSERT_EQ(data.size(), 4u);
  for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(data[i + 1], recordOf(i, sent[i])) << i;
  EXPECT_TRUE(client_->gaps().empty());
  EXPECT_EQ(agent_->stream->stats().packets, 3u);
}

TEST_F(CaptureStreamTest, ManyPacketsBeyondOneTurnAllArriveInOrder) {
  // Small turns: the fake clears its readiness at each read, so a capture
  // that waited for readiness with packets left would stop here.
  build();
  CaptureStream::Options o = quick();
  o.packets_per_read = 4;
  o.reads_per_turn = 2;
  startCapture(o);
  const int n = 1000;
  for (int i = 0; i < n; ++i) source_->push(payload(i, 40 + i % 100));
  settle();
  auto data = client_->data();
  ASSERT_EQ(data.size(), static_cast<size_t>(n + 1));
  for (int i = 0; i < n; ++i) ASSERT_EQ(data[i + 1], recordOf(i, payload(i, 40 + i % 100))) << i;
  EXPECT_EQ(source_->waiting(), 0u);
}

TEST_F(CaptureStreamTest, SlowClientGetsAGapBeforeTheNextRecord) {
  protocol::SessionLimits limits;
  limits.initial_stream_window = 1024;  // the floor
  build(limits);
  startCapture();
  client_->hold = true;  // stops reading
  // 1024 - 24 (header) = 1000 bytes of credit: four 216-byte records fit.
  for (int i = 0; i < 10; ++i) source_->push(payload(i, 200));
  settle();
  ASSERT_EQ(client_->data().size(), 5u);
  EXPECT_TRUE(client_->gaps().empty());  // no credit moved: nothing to report yet

  // The client reads again: the credit coming back brings the gap, even
  // though no packet follows.
  client_->consumeNow(id_);
  settle();
  auto gaps = client_->gaps();
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0].packets, 6u);
  EXPECT_EQ(gaps[0].bytes, 6u * (16 + 200));

  source_->push(payload(10, 200));
  settle();
  const auto& ev = client_->events;
  ASSERT_EQ(ev.size(), 7u);
  EXPECT_EQ(ev[5].kind, Event::kGap);
  EXPECT_EQ(ev[6].kind, Event::kData);
  EXPECT_EQ(ev[6].data, recordOf(10, payload(10, 200)));
  auto st = agent_->stream->stats();
  EXPECT_EQ(st.packets, 5u);
  EXPECT_EQ(st.dropped.slow_client_packets, 6u);
}

TEST_F(CaptureStreamTest, GapGoesOutWithTheNextRecordWhenCreditIsShortOnlyForBigOnes) {
  protocol::SessionLimits limits;
  limits.initial_stream_window = 1024;
  build(limits);
  startCapture();
  client_->hold = true;
  source_->push(payload(0, 900));  // 916 of 1000: fits
  source_->push(payload(1, 900));  // does not: dropped
  source_->push(payload(2, 40));   // 56 of the 84 left: fits, after the gap
  settle();
  const auto& ev = client_->events;
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[1].data, recordOf(0, payload(0, 900)));
  EXPECT_EQ(ev[2].kind, Event::kGap);
  EXPECT_EQ(ev[2].packets, 1u);
  EXPECT_EQ(ev[2].bytes, 916u);
  EXPECT_EQ(ev[3].data, recordOf(2, payload(2, 40)));
}

TEST_F(CaptureStreamTest, AClientThatNeverReadsQueuesNothingMore) {
  protocol::SessionLimits limits;
  limits.initial_stream_window = 1024;
  build(limits);
  startCapture();
  client_->hold = true;
  for (int i = 0; i < 5000; ++i) source_->push(payload(i, 500));
  settle();
  // One 516-byte record fits the 1000 bytes of credit after the header; the
  // rest were dropped without a frame each: the session holds no more for
  // this client than its window.
  EXPECT_EQ(client_->data().size(), 2u);
  EXPECT_TRUE(client_->gaps().empty());
  EXPECT_LE(agent_session_->unackedBytes(), 4096u);
  EXPECT_EQ(agent_->stream->stats().dropped.slow_client_packets, 4999u);
  EXPECT_EQ(source_->waiting(), 0u);  // the ring is still read (and emptied)
}

TEST_F(CaptureStreamTest, KernelDropsBecomeAGapWithPacketsOnly) {
  build();
  CaptureStream::Options o = quick();
  o.stats_interval = std::chrono::milliseconds(0);
  startCapture(o);
  source_->setKernelDrops(5);
  source_->push(payload(0, 60));
  settle();
  auto gaps = client_->gaps();
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0].packets, 5u);
  EXPECT_EQ(gaps[0].bytes, 0u);
  source_->setKernelDrops(8);
  source_->push(payload(1, 60));
  settle();
  gaps = client_->gaps();
  ASSERT_EQ(gaps.size(), 2u);
  EXPECT_EQ(gaps[1].packets, 3u);
  EXPECT_EQ(agent_->stream->stats().dropped.kernel_packets, 8u);
}

TEST_F(CaptureStreamTest, ClientHalfCloseTakesWhatWaitsThenHalfClosesBack) {
  build();
  startCapture();
  // Packets already in the ring when the client says stop: they were
  // captured before it, they belong in the file.
  source_->push(payload(0, 70));
  source_->push(payload(1, 80));
  ASSERT_TRUE(client_session_->halfClose(id_).ok());
  pipe();  // the HalfClose reaches the agent before the loop read the ring
  settle();
  auto data = client_->data();
  ASSERT_EQ(data.size(), 3u);
  EXPECT_EQ(data[1], recordOf(0, payload(0, 70)));
  EXPECT_EQ(data[2], recordOf(1, payload(1, 80)));
  EXPECT_TRUE(client_->half_closed);
  EXPECT_FALSE(client_->reset.has_value());
  EXPECT_TRUE(source_->closed);
  EXPECT_TRUE(agent_->released);
  EXPECT_FALSE(client_session_->streamOpen(id_));
  EXPECT_FALSE(agent_session_->streamOpen(id_));
  EXPECT_EQ(ended_, 1);
}

TEST_F(CaptureStreamTest, HalfCloseWaitsForTheRingsLastBlock) {
  // A real ring hands its last, partly filled block over only after the
  // block timeout: packets that arrive after the client's HalfClose, within
  // the finish delay, still make it into the file.
  build();
  CaptureStream::Options o = quick();
  o.finish_delay = std::chrono::milliseconds(30);
  startCapture(o);
  ASSERT_TRUE(client_session_->halfClose(id_).ok());
  pipe();
  source_->push(payload(0, 90));  // "the block was handed over"
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!client_->half_closed && std::chrono::steady_clock::now() < deadline) {
    io_.run_one_for(std::chrono::milliseconds(10));
    pipe();
  }
  ASSERT_TRUE(client_->half_closed);
  auto data = client_->data();
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[1], recordOf(0, payload(0, 90)));
  EXPECT_TRUE(source_->closed);
}

TEST_F(CaptureStreamTest, HalfCloseReportsPendingDropsFirst) {
  protocol::SessionLimits limits;
  limits.initial_stream_window = 1024;
  build(limits);
  startCapture();
  client_->hold = true;
  for (int i = 0; i < 8; ++i) source_->push(payload(i, 300));
  settle();
  ASSERT_TRUE(client_session_->halfClose(id_).ok());
  settle();
  auto gaps = client_->gaps();
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0].packets, 5u);  // 3 records of 316 fit in 1000
  EXPECT_TRUE(client_->half_closed);
  EXPECT_EQ(client_->events.back().kind, Event::kGap);
}

TEST_F(CaptureStreamTest, ClientResetClosesTheSourceAndSendsNothing) {
  build();
  startCapture();
  size_t before = client_->events.size();
  client_session_->resetStream(id_, toProtoError(protoError(v1::CANCELLED, "bye")));
  settle();
  source_->push(payload(0, 60));
  settle();
  EXPECT_TRUE(source_->closed);
  EXPECT_EQ(client_->events.size(), before);
  EXPECT_EQ(ended_, 1);
}

TEST_F(CaptureStreamTest, SessionEndClosesTheSource) {
  build();
  auto stream = startCapture();
  agent_->is_ended = true;
  stream->close();
  EXPECT_TRUE(source_->closed);
  EXPECT_TRUE(stream->dead());
  EXPECT_EQ(ended_, 1);
  stream->close();
  EXPECT_EQ(ended_, 1);  // once
}

TEST_F(CaptureStreamTest, ClientDataIsConsumedAndIgnored) {
  build();
  startCapture();
  // More than the agent's window in total: only possible if the agent
  // hands the credit back.
  const size_t window = protocol::SessionLimits{}.initial_stream_window;
  std::string chunk(16 * 1024, 'x');
  for (size_t sent = 0; sent < 3 * window; sent += chunk.size()) {
    ASSERT_GE(client_session_->sendCredit(id_), chunk.size()) << "after " << sent;
    ASSERT_TRUE(client_session_->sendData(id_, chunk).ok());
    settle();
  }
  EXPECT_EQ(client_->data().size(), 1u);  // the header, nothing else
  EXPECT_FALSE(client_->reset.has_value());
}

TEST_F(CaptureStreamTest, ReadErrorResetsTheStream) {
  build();
  startCapture();
  source_->failNextRead(protoError(v1::UNAVAILABLE, "capture: The interface went down"));
  settle();
  ASSERT_TRUE(client_->reset.has_value());
  EXPECT_EQ(client_->reset->code(), v1::UNAVAILABLE);
  EXPECT_THAT(client_->reset->message(), HasSubstr("went down"));
  EXPECT_TRUE(source_->closed);
  EXPECT_TRUE(agent_->released);
}

TEST_F(CaptureStreamTest, StartAfterTheEndClosesTheSourceAtOnce) {
  build();
  auto stream = open();
  stream->close();  // the session ended while the source was being opened
  stream->start(std::make_unique<FakePacketSource>(source_));
  EXPECT_TRUE(source_->closed);
  EXPECT_EQ(source_->reads, 0);
}

TEST_F(CaptureStreamTest, ResetBeforeStartCarriesTheError) {
  build();
  auto stream = open();
  stream->reset(
      toProtoError(protoError(v1::NOT_FOUND, "capture on interface 'x': No such device")));
  settle();
  ASSERT_TRUE(client_->reset.has_value());
  EXPECT_EQ(client_->reset->code(), v1::NOT_FOUND);
  EXPECT_EQ(ended_, 1);
}

// A handover: the freeze reads what waits (with no count limit: the ring
// ends on a block boundary), then nothing; the export carries where the
// stream stands; a stream restored from it on the same ring (the fake's
// state stands for the kernel's ring) goes on with the next packet, none
// twice, none missed, its counters and pending gaps kept.
TEST_F(CaptureStreamTest, AFrozenCaptureMovesToARestoredStreamThatGoesOnWithTheNextPacket) {
  build();
  CaptureStream::Options o = quick();
  o.packets_per_read = 2;  // a freeze must not stop at a turn's budget
  o.reads_per_turn = 1;
  auto old_stream = startCapture(o);
  for (int i = 0; i < 5; ++i) source_->push(payload(i, 100));
  settle();
  ASSERT_EQ(client_->data().size(), 6u);
  for (int i = 5; i < 12; ++i) source_->push(payload(i, 100));
  old_stream->freeze();  // reads all seven now
  for (int i = 12; i < 14; ++i) source_->push(payload(i, 100));
  settle();
  EXPECT_EQ(client_->data().size(), 13u);  // the header and 12: not the two after the freeze

  v1::PumpExport exported;
  std::vector<UniqueFd> fds;
  ASSERT_TRUE(old_stream->exportState(&exported, &fds).ok());
  EXPECT_EQ(exported.service(), "capture");
  EXPECT_EQ(exported.stream_id(), id_);
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_EQ(exported.capture().socket(), 0);
  EXPECT_EQ(exported.capture().packets(), 12u);
  EXPECT_TRUE(exported.capture().header_sent());
  EXPECT_EQ(exported.capture().link_type(), FakePacketSource::kLinkType);

  auto restored = std::make_shared<CaptureStream>(io_.get_executor(), id_, agent_, quick());
  restored->restoreFrom(exported.capture());
  ASSERT_TRUE(restored->adopt(std::make_unique<FakePacketSource>(source_)).ok());
  agent_->stream = restored;
  settle();
  EXPECT_EQ(client_->data().size(), 13u);  // frozen until resume()
  restored->resume();
  for (int i = 14; i < 16; ++i) source_->push(payload(i, 100));
  settle();
  auto data = client_->data();
  ASSERT_EQ(data.size(), 17u);  // no second header
  for (int i = 0; i < 16; ++i) EXPECT_EQ(data[i + 1], recordOf(i, payload(i, 100))) << i;
  EXPECT_EQ(restored->stats().packets, 16u);
  EXPECT_TRUE(client_->gaps().empty());
}

TEST_F(CaptureStreamTest, AThawedCaptureGoesOnWhereItStopped) {
  build();
  auto stream = startCapture();
  source_->push(payload(0, 50));
  settle();
  stream->freeze();
  source_->push(payload(1, 50));
  settle();
  EXPECT_EQ(client_->data().size(), 2u);
  stream->thaw();
  source_->push(payload(2, 50));
  settle();
  auto data = client_->data();
  ASSERT_EQ(data.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(data[i + 1], recordOf(i, payload(i, 50))) << i;
}

// Opening (the source not there yet) or finishing (the client half-closed)
// is transient: the handover waits for it, and the export refuses it.
TEST_F(CaptureStreamTest, OpeningAndFinishingCapturesHoldTheHandoverBack) {
  build();
  auto opening = open();
  EXPECT_THAT(opening->handoverBlocker(), HasSubstr("opening"));
  v1::PumpExport exported;
  std::vector<UniqueFd> fds;
  EXPECT_FALSE(opening->exportState(&exported, &fds).ok());
  opening->close();
  agent_->stream.reset();

  CaptureStream::Options slow = quick();
  slow.finish_delay = std::chrono::seconds(30);
  auto finishing = startCapture(slow);
  EXPECT_EQ(finishing->handoverBlocker(), "");
  finishing->onHalfClose();
  EXPECT_THAT(finishing->handoverBlocker(), HasSubstr("finishing"));
}

}  // namespace
}  // namespace siphon::agent::capture
