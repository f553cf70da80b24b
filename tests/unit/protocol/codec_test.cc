// FrameDecoder and the encoders: every frame kind, the hand-written data-frame
// fast path (and its wire compatibility with the generated classes), frames
// split and coalesced every way, and the typed, sticky errors.
#include "siphon/protocol/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/message_differencer.h"
#include "siphon/status.h"
#include "tests/fakes/piped_bytes.h"

namespace siphon::protocol {
namespace {

using google::protobuf::util::MessageDifferencer;

// A decoded frame with its payload copied out (a DataView dies with the next
// feed).
struct Got {
  bool is_data = false;
  uint64_t stream_id = 0;
  std::string payload;
  v1::Frame frame;
  size_t wire_size = 0;
};

Got copyOf(const DecodedFrame& d) {
  Got g;
  g.is_data = d.is_data;
  g.stream_id = d.data.stream_id;
  g.payload = std::string(d.data.payload);
  g.frame = d.frame;
  g.wire_size = d.wire_size;
  return g;
}

// Every frame the decoder has now; fails the test on an error.
std::vector<Got> drain(FrameDecoder& dec) {
  std::vector<Got> out;
  while (true) {
    auto next = dec.next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) break;
    out.push_back(copyOf(**next));
  }
  return out;
}

// One frame of every kind of Frame.body, each with non-default content.
std::vector<v1::Frame> oneOfEveryKind() {
  std::vector<v1::Frame> out;
  auto add = [&](auto fill) {
    v1::Frame f;
    fill(f);
    out.push_back(std::move(f));
  };
  add([](v1::Frame& f) {
    f.mutable_data()->set_stream_id(7);
    f.mutable_data()->set_payload("payload");
  });
  add([](v1::Frame& f) {
    auto* h = f.mutable_hello();
    h->mutable_version()->set_major(1);
    h->mutable_version()->set_minor(4);
    h->set_client_name("cli");
    h->set_auth_token(std::string("tok\0en", 6));
    h->mutable_resume()->set_session_id("s-1");
    h->mutable_resume()->set_last_seq_received(99);
    h->mutable_requested_limits()->set_max_streams(12);
  });
  add([](v1::Frame& f) {
    auto* w = f.mutable_welcome();
    w->mutable_version()->set_major(1);
    w->set_agent_version("0.1.0");
    w->set_session_id("s-1");
    w->set_resume_token("rt");
    w->mutable_target()->set_pid(42);
    w->add_features(v1::FEATURE_FILES);
    w->add_features(v1::FEATURE_RESUME);
    w->mutable_limits()->set_max_frame_size(65536);
    w->set_resumed(true);
    w->set_last_seq_received(17);
  });
  add([](v1::Frame& f) {
    f.mutable_reject()->set_code(v1::UNAUTHENTICATED);
    f.mutable_reject()->set_message("bad token");
  });
  add([](v1::Frame& f) { f.mutable_ack()->set_received(123456789); });
  add([](v1::Frame& f) { f.mutable_ping()->set_nonce(3); });
  add([](v1::Frame& f) { f.mutable_pong()->set_nonce(3); });
  add([](v1::Frame& f) {
    f.mutable_goaway()->set_code(v1::PROTOCOL_ERROR);
    f.mutable_goaway()->set_message("bye");
  });
  add([](v1::Frame& f) {
    f.mutable_request()->set_request_id(5);
    f.mutable_request()->mutable_env()->add_include("PATH");
  });
  add([](v1::Frame& f) {
    f.mutable_response()->set_request_id(5);
    auto* var = f.mutable_response()->mutable_env()->add_vars();
    var->set_name("PATH");
    var->set_value("/bin");
  });
  add([](v1::Frame& f) {
    f.mutable_open()->set_stream_id(9);
    f.mutable_open()->set_initial_window(4096);
    f.mutable_open()->mutable_outgoing()->set_host("db");
    f.mutable_open()->mutable_outgoing()->set_port(5432);
  });
  add([](v1::Frame& f) {
    f.mutable_accept()->set_stream_id(9);
    f.mutable_accept()->set_initial_window(8192);
    f.mutable_accept()->mutable_local()->set_ip("10.0.0.1");
  });
  add([](v1::Frame& f) { f.mutable_half_close()->set_stream_id(9); });
  add([](v1::Frame& f) {
    f.mutable_reset()->set_stream_id(9);
    f.mutable_reset()->mutable_error()->set_code(v1::AGENT_LOST);
  });
  add([](v1::Frame& f) {
    f.mutable_window_update()->set_stream_id(9);
    f.mutable_window_update()->set_increment(1024);
  });
  add([](v1::Frame& f) {
    f.mutable_datagram()->set_stream_id(11);
    f.mutable_datagram()->mutable_peer()->set_ip("::1");
    f.mutable_datagram()->set_payload("dgram");
  });
  add([](v1::Frame& f) {
    f.mutable_gap()->set_stream_id(12);
    f.mutable_gap()->set_direction(v1::SERVER_TO_CLIENT);
    f.mutable_gap()->set_bytes(1500);
  });
  add([](v1::Frame& f) {
    f.mutable_draining()->set_deadline_unix_ms(1700000000000);
    f.mutable_draining()->set_reason("SIGTERM");
  });
  add([](v1::Frame& f) {
    f.mutable_notice()->set_subscription_id(3);
    f.mutable_notice()->mutable_overlap()->set_taken_by(1);
    f.mutable_notice()->mutable_overlap()->set_taken_by_client("alice");
    f.mutable_notice()->mutable_overlap()->set_requests(7);
    f.mutable_notice()->mutable_overlap()->set_path("/api?x=1");
  });
  add([](v1::Frame& f) {
    v1::FileEvent* e = f.mutable_file_events()->add_events();
    e->set_watch(2);
    e->set_name("app.log");
    e->set_content(true);
    f.mutable_file_events()->set_overflow(true);
  });
  add([](v1::Frame& f) {
    v1::TargetRestarted* r = f.mutable_target_restarted();
    r->mutable_target()->set_mode("targeted");
    r->mutable_target()->set_pid(4301);
    r->mutable_target()->set_container_id("abc");
    r->set_previous_pid(4242);
    r->set_restarts(1);
    r->set_down_ms(812);
  });
  return out;
}

// A mixed sequence for the split and coalesce tests: control frames, data
// frames of several sizes (varint boundaries 127/128, 16383/16384).
std::string mixedStream(std::vector<Got>* expected) {
  std::string wire;
  int i = 0;
  for (const v1::Frame& f : oneOfEveryKind()) {
    if (f.has_data()) continue;
    encodeFrame(f, &wire);
    Got g;
    g.frame = f;
    expected->push_back(g);
    std::string payload(std::vector<size_t>{0, 1, 127, 128, 300, 2000}[i % 6], 'a' + (i % 26));
    uint64_t id = std::vector<uint64_t>{0, 1, 127, 128, 1ull << 40}[i % 5];
    wire += encodeDataFrame(id, payload);
    Got d;
    d.is_data = true;
    d.stream_id = id;
    d.payload = payload;
    expected->push_back(d);
    ++i;
  }
  return wire;
}

void expectSame(const std::vector<Got>& got, const std::vector<Got>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(got[i].is_data, want[i].is_data);
    if (want[i].is_data) {
      EXPECT_EQ(got[i].stream_id, want[i].stream_id);
      EXPECT_EQ(got[i].payload, want[i].payload);
    } else {
      EXPECT_TRUE(MessageDifferencer::Equals(got[i].frame, want[i].frame))
          << got[i].frame.ShortDebugString() << " vs " << want[i].frame.ShortDebugString();
    }
  }
}

std::string lengthPrefix(uint32_t n) {
  return std::string{static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                     static_cast<char>(n >> 8), static_cast<char>(n)};
}

TEST(CodecTest, ExamplesCoverEveryFrameKind) {
  // A new oneof member without a case here fails this test.
  const auto* oneof = v1::Frame::descriptor()->FindOneofByName("body");
  ASSERT_NE(oneof, nullptr);
  std::set<int> kinds;
  for (const auto& f : oneOfEveryKind()) kinds.insert(f.body_case());
  EXPECT_EQ(kinds.size(), static_cast<size_t>(oneof->field_count()));
}

TEST(CodecTest, EveryFrameKindRoundTrips) {
  for (const v1::Frame& f : oneOfEveryKind()) {
    SCOPED_TRACE(f.ShortDebugString());
    std::string wire = encodeFrame(f);
    ASSERT_EQ(wire.size(), kLengthPrefixSize + f.ByteSizeLong());
    EXPECT_EQ(wire.substr(0, 4), lengthPrefix(static_cast<uint32_t>(f.ByteSizeLong())));
    FrameDecoder dec;
    dec.feed(wire);
    auto got = dec.next();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value());
    EXPECT_EQ((*got)->wire_size, wire.size());
    if (f.has_data()) {
      // A data frame the generated class wrote is still served as data.
      EXPECT_TRUE((*got)->is_data);
      EXPECT_EQ((*got)->data.stream_id, 7u);
      EXPECT_EQ((*got)->data.payload, "payload");
    } else {
      EXPECT_FALSE((*got)->is_data);
      EXPECT_TRUE(MessageDifferencer::Equals((*got)->frame, f)) << (*got)->frame.ShortDebugString();
    }
    auto after = dec.next();
    ASSERT_TRUE(after.ok());
    EXPECT_FALSE(after->has_value());
    EXPECT_EQ(dec.buffered(), 0u);
  }
}

TEST(CodecTest, EncodeFrameAppends) {
  v1::Frame ping;
  ping.mutable_ping()->set_nonce(1);
  std::string out = "xyz";
  encodeFrame(ping, &out);
  EXPECT_EQ(out.substr(0, 3), "xyz");
  EXPECT_EQ(out.substr(3), encodeFrame(ping));
}

TEST(CodecTest, DataFrameHasTheDocumentedBytes) {
  // [len=8][Frame.data tag 0x0a][len 6][stream_id tag 0x08][5][payload tag 0x12][2]"hi"
  EXPECT_EQ(encodeDataFrame(5, "hi"), std::string("\0\0\0\x08\x0a\x06\x08\x05\x12\x02hi", 12));
  // proto3 omits zero fields: stream 0 and no payload is an empty StreamData.
  EXPECT_EQ(encodeDataFrame(0, ""), std::string("\0\0\0\x02\x0a\x00", 6));
  EXPECT_EQ(encodeDataFrame(0, "x"), std::string("\0\0\0\x05\x0a\x03\x12\x01x", 9));
  EXPECT_EQ(encodeDataFrame(300, ""), std::string("\0\0\0\x05\x0a\x03\x08\xac\x02", 9));
}

TEST(CodecTest, DataHeaderFitsItsBoundAtTheExtremes) {
  char header[kMaxDataHeaderSize];
  uint64_t max_id = std::numeric_limits<uint64_t>::max();
  size_t payload = kDefaultMaxFrameSize - kDataFrameOverhead;
  size_t n = encodeDataHeader(max_id, payload, header);
  EXPECT_LE(n, kMaxDataHeaderSize);
  auto* p = reinterpret_cast<const uint8_t*>(header);
  uint32_t body = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
  EXPECT_EQ(body, n - kLengthPrefixSize + payload);
  // The largest payload sendData() cuts to makes a frame within the maximum.
  EXPECT_LE(body, kDefaultMaxFrameSize);
}

// Both directions of wire compatibility, over ids and sizes that cross varint
// boundaries: the hand-written frame is byte-identical to the generated one,
// and each parser reads the other's output.
TEST(CodecTest, DataFrameMatchesTheGeneratedClass) {
  for (uint64_t id : {uint64_t{0}, uint64_t{1}, uint64_t{127}, uint64_t{128}, uint64_t{1} << 35,
                      std::numeric_limits<uint64_t>::max()}) {
    for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{16383},
                        size_t{16384}, size_t{70000}}) {
      SCOPED_TRACE(testing::Message() << "id " << id << " size " << size);
      std::string payload(size, '\0');
      for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>(i * 7 + 1);

      std::string ours = encodeDataFrame(id, payload);
      v1::Frame theirs;
      theirs.mutable_data()->set_stream_id(id);
      theirs.mutable_data()->set_payload(payload);
      EXPECT_EQ(ours, encodeFrame(theirs));

      v1::Frame parsed;
      ASSERT_TRUE(parsed.ParseFromString(ours.substr(kLengthPrefixSize)));
      ASSERT_TRUE(parsed.has_data());
      EXPECT_EQ(parsed.data().stream_id(), id);
      EXPECT_EQ(parsed.data().payload(), payload);

      FrameDecoder dec;
      dec.feed(encodeFrame(theirs));
      auto got = dec.next();
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(got->has_value());
      EXPECT_TRUE((*got)->is_data);
      EXPECT_EQ((*got)->data.stream_id, id);
      EXPECT_EQ((*got)->data.payload, payload);
    }
  }
}

TEST(CodecTest, DataFrameIsParsedInPlace) {
  std::string payload(1000, 'p');
  std::string wire = encodeDataFrame(3, payload);
  FrameDecoder dec;
  std::span<char> room = dec.prepare(wire.size());
  ASSERT_GE(room.size(), wire.size());
  std::copy(wire.begin(), wire.end(), room.begin());
  dec.commit(wire.size());
  auto got = dec.next();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  const DecodedFrame& d = **got;
  ASSERT_TRUE(d.is_data);
  EXPECT_EQ(d.data.stream_id, 3u);
  EXPECT_EQ(d.data.payload, payload);
  // The view points into the decoder's own buffer, right after the header.
  size_t header = wire.size() - payload.size();
  EXPECT_EQ(d.data.payload.data(), room.data() + header);
  // Nothing was copied into the message.
  EXPECT_EQ(d.frame.body_case(), v1::Frame::BODY_NOT_SET);
}

TEST(CodecTest, NonCanonicalDataFramesAreStillData) {
  // Payload before stream id: valid protobuf, not the hand-written layout.
  std::string reversed("\x0a\x06\x12\x02hi\x08\x05", 8);
  // An unknown field (15, varint 1) inside StreamData.
  std::string unknown("\x0a\x08\x08\x05\x12\x02hi\x78\x01", 10);
  for (const std::string& body : {reversed, unknown}) {
    FrameDecoder dec;
    dec.feed(lengthPrefix(static_cast<uint32_t>(body.size())) + body);
    auto got = dec.next();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value());
    EXPECT_TRUE((*got)->is_data);
    EXPECT_EQ((*got)->data.stream_id, 5u);
    EXPECT_EQ((*got)->data.payload, "hi");
  }
}

// A file read's answer with its bytes as a separate buffer is the frame the
// generated class would parse: every size of data (varint widths of each
// nested length), with and without eof, and with a large request id.
TEST(CodecTest, FileDataResponseHeadMakesAnOrdinaryFrame) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{16383},
                      size_t{16384}, size_t{70000}, size_t{(1 << 20) - 1024}}) {
    for (bool eof : {false, true}) {
      SCOPED_TRACE(testing::Message() << size << " bytes, eof " << eof);
      std::string data(size, '\0');
      for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i * 7 + 3);
      v1::Response r;
      r.set_request_id(uint64_t{1} << 40 | size);
      r.mutable_file()->mutable_data()->set_eof(eof);
      std::string wire = encodeFileDataResponseHead(r, data.size()) + data;

      FrameDecoder dec(kDefaultMaxFrameSize);
      dec.feed(wire);
      auto next = dec.next();
      ASSERT_TRUE(next.ok()) << next.status();
      ASSERT_TRUE(next->has_value());
      const DecodedFrame& d = **next;
      EXPECT_FALSE(d.is_data);
      EXPECT_EQ(d.wire_size, wire.size());
      ASSERT_TRUE(d.frame.has_response());
      v1::Response want = r;
      want.mutable_file()->mutable_data()->set_data(data);
      EXPECT_TRUE(MessageDifferencer::Equals(d.frame.response(), want))
          << d.frame.response().ShortDebugString().substr(0, 200);
      // The same bytes as the generated class's, but for the field order.
      v1::Frame f;
      *f.mutable_response() = want;
      EXPECT_EQ(wire.size(), encodeFrame(f).size());
    }
  }
}

// A file read answer of `size` bytes, as the agent writes it: the head,
// then the data as their own buffer.
std::string fileAnswer(uint64_t request_id, size_t size, bool eof, v1::Response* want) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i * 13 + request_id);
  v1::Response r;
  r.set_request_id(request_id);
  r.mutable_file()->mutable_data()->set_eof(eof);
  std::string wire = encodeFileDataResponseHead(r, data.size()) + data;
  *want = r;
  want->mutable_file()->mutable_data()->set_data(data);
  return wire;
}

// What the session's reader does: prepare(64 KiB), fill at most `chunk` of
// it, commit, take every frame. Returns the frames; *into_final counts the
// bytes that were received into the string a frame's data ended in.
std::vector<Got> receiveInChunks(FrameDecoder& dec, std::string_view wire, size_t chunk,
                                 size_t* into_final) {
  std::vector<Got> out;
  std::vector<std::pair<const char*, size_t>> spans;  // where bytes were put
  *into_final = 0;
  while (!wire.empty()) {
    std::span<char> room = dec.prepare(64 * 1024);
    EXPECT_FALSE(room.empty());
    const size_t n = std::min({room.size(), wire.size(), chunk});
    std::memcpy(room.data(), wire.data(), n);
    spans.emplace_back(room.data(), n);
    dec.commit(n);
    wire.remove_prefix(n);
    while (true) {
      auto next = dec.next();
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok() || !next->has_value()) break;
      DecodedFrame& d = **next;
      if (d.frame.has_response() && d.frame.response().file().has_data()) {
        const std::string& data = d.frame.response().file().data().data();
        for (auto [at, len] : spans) {
          if (at >= data.data() && at + len <= data.data() + data.size()) *into_final += len;
        }
      }
      out.push_back(copyOf(d));
      spans.clear();
    }
  }
  return out;
}

// A client's decoder receives a large file answer's data straight into the
// string it is handed out in (no copy out of a receive buffer), between
// other frames, in every chunking the socket may give; the frames are the
// ones a plain decoder gives.
TEST(CodecTest, DetachedFileDataLandsInItsOwnString) {
  std::vector<v1::Response> wants(3);
  std::string wire = encodeDataFrame(3, "before") +
                     fileAnswer(7, 1 << 20, false, &wants[0]) +
                     fileAnswer(8, 200000, true, &wants[1]) + encodeDataFrame(5, "between") +
                     fileAnswer(9, 20000, false, &wants[2]);
  FrameDecoder plain;
  plain.setMaxFrameSize(2u << 20);
  plain.feed(wire);
  std::vector<Got> want = drain(plain);
  ASSERT_EQ(want.size(), 5u);
  for (size_t chunk : {size_t{1} << 30, size_t{65536}, size_t{4096}, size_t{1000}, size_t{7}}) {
    SCOPED_TRACE(testing::Message() << "chunks of " << chunk);
    FrameDecoder dec(2u << 20);
    dec.setDetachFileData(16 * 1024);
    size_t into_final = 0;
    std::vector<Got> got = receiveInChunks(dec, wire, chunk, &into_final);
    ASSERT_NO_FATAL_FAILURE(expectSame(got, want));
    EXPECT_TRUE(MessageDifferencer::Equals(got[1].frame.response(), wants[0]));
    EXPECT_TRUE(MessageDifferencer::Equals(got[2].frame.response(), wants[1]));
    EXPECT_TRUE(MessageDifferencer::Equals(got[4].frame.response(), wants[2]));
    EXPECT_EQ(dec.buffered(), 0u);
    // All but the little read with each head (a read stops at most 64 KiB
    // past the frame before it) went straight to the final strings.
    const size_t data_bytes = (1 << 20) + 200000 + 20000;
    EXPECT_GE(into_final, data_bytes - 3 * 64 * 1024) << into_final;
  }
  // Off (the default, and the agent's): the same frames. (Where their
  // bytes went says nothing here: a buffer that grew was freed, and a
  // frame's string may be allocated where it was.)
  FrameDecoder off(2u << 20);
  size_t into_final = 0;
  std::vector<Got> got = receiveInChunks(off, wire, 65536, &into_final);
  ASSERT_NO_FATAL_FAILURE(expectSame(got, want));
}

// Encodings other than the agent's layout (the generated class puts the
// data before eof; an error field after the body) are parsed whole, as
// before; so is a frame that breaks off inside its head.
TEST(CodecTest, OtherFileAnswerLayoutsAreParsedWhole) {
  std::vector<v1::Frame> frames(3);
  frames[0].mutable_response()->set_request_id(1);
  frames[0].mutable_response()->mutable_file()->mutable_data()->set_data(std::string(100000, 'x'));
  frames[0].mutable_response()->mutable_file()->mutable_data()->set_eof(true);
  frames[1].mutable_response()->set_request_id(2);
  frames[1].mutable_response()->mutable_file()->mutable_data()->set_data(std::string(50000, 'y'));
  std::string wire;
  for (int i = 0; i < 2; ++i) wire += encodeFrame(frames[i]);
  // Response.error after Response.file: the file is not the last field.
  std::string odd = frames[1].response().SerializeAsString();
  v1::Error e;
  e.set_message("late");
  odd += std::string(1, static_cast<char>((2 << 3) | 2)) +
         std::string(1, static_cast<char>(e.ByteSizeLong())) + e.SerializeAsString();
  v1::Frame f2;
  ASSERT_TRUE(f2.ParseFromString(std::string(1, static_cast<char>((10 << 3) | 2)) +
                                 [&] {
                                   std::string len;
                                   uint64_t n = odd.size();
                                   while (n >= 0x80) {
                                     len.push_back(static_cast<char>(n | 0x80));
                                     n >>= 7;
                                   }
                                   len.push_back(static_cast<char>(n));
                                   return len;
                                 }() +
                                 odd));
  frames[2] = f2;
  wire += encodeFrame(frames[2]);
  for (size_t chunk : {size_t{65536}, size_t{3}}) {
    FrameDecoder dec;
    dec.setDetachFileData(16 * 1024);
    size_t into_final = 0;
    std::vector<Got> got = receiveInChunks(dec, wire, chunk, &into_final);
    ASSERT_EQ(got.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(MessageDifferencer::Equals(got[i].frame, frames[i])) << i;
    }
  }
}

// A cut (reset) in the middle of a detached answer leaves nothing behind:
// the frames after it decode from their first byte.
TEST(CodecTest, ResetDropsADetachedAnswer) {
  v1::Response want;
  std::string big = fileAnswer(4, 300000, false, &want);
  FrameDecoder dec;
  dec.setDetachFileData(16 * 1024);
  dec.feed(std::string_view(big).substr(0, 100000));
  auto none = dec.next();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(dec.buffered(), 100000u);
  dec.reset();
  EXPECT_EQ(dec.buffered(), 0u);
  dec.feed(big);
  std::vector<Got> got = drain(dec);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(MessageDifferencer::Equals(got[0].frame.response(), want));
}


// Piped receive (the client's mount): an answer to a marked request keeps
// in memory what came with its head and waits for the rest in a pipe; the
// frames after it decode as ever, and an unmarked answer is whole.
TEST(CodecTest, AMarkedAnswerTakesTheRestOfItsDataFromAPipe) {
  v1::Response want;
  const std::string big = fileAnswer(4, 300000, true, &want);
  v1::Response other;
  const std::string unmarked = fileAnswer(5, 100000, false, &other);
  const std::string after = encodeDataFrame(9, "after");
  FrameDecoder dec;
  dec.setDetachFileData(16 * 1024);
  dec.expectPiped(4);
  dec.feed(std::string_view(big).substr(0, 5000));
  auto none = dec.next();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  const size_t wanted = dec.pipeWanted();
  EXPECT_EQ(wanted, big.size() - 5000);
  EXPECT_EQ(dec.buffered(), 5000u);
  dec.commitPiped(fakes::pipeHolding(std::string_view(big).substr(5000)));
  EXPECT_EQ(dec.pipeWanted(), 0u);
  auto got = dec.next();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  ASSERT_NE((*got)->piped, nullptr);
  EXPECT_EQ((*got)->wire_size, big.size());
  const std::string head_part = (*got)->frame.response().file().data().data();
  auto rest = (*got)->piped->materialize();
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(head_part + std::string(*rest), want.file().data().data());
  EXPECT_TRUE((*got)->frame.response().file().data().eof());
  EXPECT_EQ((*got)->frame.response().request_id(), 4u);
  dec.forgetPiped(4);

  dec.feed(unmarked + after);
  EXPECT_EQ(dec.pipeWanted(), 0u);
  std::vector<Got> frames = drain(dec);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_TRUE(MessageDifferencer::Equals(frames[0].frame.response(), other));
  EXPECT_EQ(frames[1].payload, "after");
  EXPECT_EQ(dec.buffered(), 0u);
}

// A transport that does not splice (TLS, no pipe to be had) reads the bytes
// as usual: prepare() declines the pipe and the data is whole in memory.
TEST(CodecTest, AMarkedAnswerReadInMemoryIsWhole) {
  v1::Response want;
  const std::string big = fileAnswer(4, 300000, false, &want);
  for (size_t chunk : {size_t{65536}, size_t{1000}}) {
    FrameDecoder dec;
    dec.setDetachFileData(16 * 1024);
    dec.expectPiped(4);
    size_t into_final = 0;
    std::vector<Got> got = receiveInChunks(dec, big, chunk, &into_final);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(MessageDifferencer::Equals(got[0].frame.response(), want));
    EXPECT_EQ(dec.pipeWanted(), 0u);
  }
}

// The mark outlives a cut (a resumed transport receives the answer again);
// a pipe of the wrong size is the decoder's sticky INTERNAL error.
TEST(CodecTest, PipeMarkOutlivesResetAndAWrongPipeIsAnError) {
  v1::Response want;
  const std::string big = fileAnswer(4, 300000, false, &want);
  FrameDecoder dec;
  dec.setDetachFileData(16 * 1024);
  dec.expectPiped(4);
  dec.feed(std::string_view(big).substr(0, 2000));
  ASSERT_TRUE(dec.next().ok());
  EXPECT_GT(dec.pipeWanted(), 0u);
  dec.reset();
  EXPECT_EQ(dec.pipeWanted(), 0u);
  dec.feed(std::string_view(big).substr(0, 3000));
  ASSERT_TRUE(dec.next().ok());
  EXPECT_EQ(dec.pipeWanted(), big.size() - 3000);
  dec.commitPiped(fakes::pipeHolding("short"));
  auto bad = dec.next();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(errorCodeOf(bad.status()), v1::INTERNAL);
}

TEST(CodecTest, StreamZeroAndEmptyPayload) {
  for (auto [id, payload] :
       std::vector<std::pair<uint64_t, std::string>>{{0, ""}, {0, "abc"}, {9, ""}}) {
    FrameDecoder dec;
    dec.feed(encodeDataFrame(id, payload));
    auto got = dec.next();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value());
    EXPECT_TRUE((*got)->is_data);
    EXPECT_EQ((*got)->data.stream_id, id);
    EXPECT_EQ((*got)->data.payload, payload);
    v1::Frame parsed;
    ASSERT_TRUE(parsed.ParseFromString(encodeDataFrame(id, payload).substr(4)));
    EXPECT_TRUE(parsed.has_data());  // an empty StreamData is still "data"
  }
}

TEST(CodecTest, FramesSplitAtEveryByteBoundary) {
  std::vector<Got> want;
  std::string wire = mixedStream(&want);
  for (size_t cut = 0; cut <= wire.size(); ++cut) {
    FrameDecoder dec;
    dec.feed(std::string_view(wire).substr(0, cut));
    std::vector<Got> got = drain(dec);
    dec.feed(std::string_view(wire).substr(cut));
    std::vector<Got> rest = drain(dec);
    got.insert(got.end(), rest.begin(), rest.end());
    ASSERT_NO_FATAL_FAILURE(expectSame(got, want)) << "cut at " << cut;
    ASSERT_EQ(dec.buffered(), 0u);
  }
}

TEST(CodecTest, FramesFedOneByteAtATime) {
  std::vector<Got> want;
  std::string wire = mixedStream(&want);
  FrameDecoder dec;
  std::vector<Got> got;
  for (char c : wire) {
    dec.feed(std::string_view(&c, 1));
    for (Got& g : drain(dec)) got.push_back(std::move(g));
  }
  expectSame(got, want);
}

TEST(CodecTest, ManyFramesCoalescedInOneFeed) {
  std::string wire;
  for (int i = 0; i < 2000; ++i) {
    if (i % 3 == 0) {
      v1::Frame f;
      f.mutable_ack()->set_received(i);
      encodeFrame(f, &wire);
    } else {
      wire += encodeDataFrame(i, std::to_string(i));
    }
  }
  FrameDecoder dec;
  dec.feed(wire);
  std::vector<Got> got = drain(dec);
  ASSERT_EQ(got.size(), 2000u);
  size_t total = 0;
  for (int i = 0; i < 2000; ++i) {
    total += got[i].wire_size;
    if (i % 3 == 0) {
      ASSERT_FALSE(got[i].is_data);
      EXPECT_EQ(got[i].frame.ack().received(), static_cast<uint64_t>(i));
    } else {
      ASSERT_TRUE(got[i].is_data);
      EXPECT_EQ(got[i].stream_id, static_cast<uint64_t>(i));
      EXPECT_EQ(got[i].payload, std::to_string(i));
    }
  }
  EXPECT_EQ(total, wire.size());
  EXPECT_EQ(dec.buffered(), 0u);
}

TEST(CodecTest, PrepareCommitInUnevenChunks) {
  std::vector<Got> want;
  std::string wire = mixedStream(&want);
  FrameDecoder dec;
  std::vector<Got> got;
  size_t at = 0;
  size_t step = 1;
  while (at < wire.size()) {
    // Ask for more room than is used, as a socket read would.
    std::span<char> room = dec.prepare(step + 100);
    ASSERT_GE(room.size(), step + 100);
    size_t n = std::min(step, wire.size() - at);
    std::copy_n(wire.data() + at, n, room.data());
    dec.commit(n);
    at += n;
    step = step * 3 % 1031 + 1;
    for (Got& g : drain(dec)) got.push_back(std::move(g));
  }
  expectSame(got, want);
}

TEST(CodecTest, LengthAboveTheMaximumIsFrameTooLarge) {
  FrameDecoder dec(1024);
  // Exactly the maximum is fine.
  // Body: tag, 2-byte length, id field (2), payload tag and 2-byte length.
  std::string at_max = encodeDataFrame(1, std::string(1024 - 8, 'x'));
  ASSERT_EQ(at_max.size(), 4u + 1024u);
  dec.feed(at_max);
  auto ok = dec.next();
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_TRUE(ok->has_value());
  // One byte more fails as soon as the prefix is in, before any body.
  dec.feed(lengthPrefix(1025));
  auto bad = dec.next();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(errorCodeOf(bad.status()), v1::FRAME_TOO_LARGE);
  EXPECT_NE(bad.status().message().find("1025"), std::string::npos) << bad.status();
  // A length that only fits in the top byte.
  FrameDecoder dec2;
  dec2.feed(std::string("\xff\xff\xff\xff", 4));
  EXPECT_EQ(errorCodeOf(dec2.next().status()), v1::FRAME_TOO_LARGE);
}

TEST(CodecTest, SetMaxFrameSizeTakesEffect) {
  FrameDecoder dec;
  dec.setMaxFrameSize(16);
  EXPECT_EQ(dec.maxFrameSize(), 16u);
  dec.feed(encodeDataFrame(1, std::string(20, 'x')));
  EXPECT_EQ(errorCodeOf(dec.next().status()), v1::FRAME_TOO_LARGE);
}

TEST(CodecTest, ZeroLengthIsProtocolError) {
  FrameDecoder dec;
  dec.feed(lengthPrefix(0));
  EXPECT_EQ(errorCodeOf(dec.next().status()), v1::PROTOCOL_ERROR);
}

TEST(CodecTest, GarbageIsProtocolError) {
  const std::vector<std::string> bodies = {
      std::string("\xff\xff\xff", 3),  // field 0 / bad varint
      std::string("\x0a\x10\x08", 3),  // data field claims 16 bytes, has 1
      std::string("\x12\x05"
                  "ab",
                  4),                  // hello claims 5 bytes, has 2
      std::string("\xa0\x06\x01", 3),  // unknown field 100 only: no body
      std::string("\x07", 1),          // wire type 7 does not exist
  };
  for (const std::string& body : bodies) {
    SCOPED_TRACE(testing::PrintToString(body));
    FrameDecoder dec;
    dec.feed(lengthPrefix(static_cast<uint32_t>(body.size())) + body);
    auto got = dec.next();
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(errorCodeOf(got.status()), v1::PROTOCOL_ERROR) << got.status();
  }
}

TEST(CodecTest, ErrorsAreSticky) {
  FrameDecoder dec;
  dec.feed(lengthPrefix(0));
  auto first = dec.next();
  ASSERT_FALSE(first.ok());
  // Valid frames after the error change nothing: the stream is out of step.
  dec.feed(encodeDataFrame(1, "ok"));
  for (int i = 0; i < 3; ++i) {
    auto again = dec.next();
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status(), first.status());
  }
  // reset() is the way out (a new transport).
  dec.reset();
  dec.feed(encodeDataFrame(1, "ok"));
  auto after = dec.next();
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_TRUE(after->has_value());
  EXPECT_EQ((*after)->data.payload, "ok");
}

TEST(CodecTest, TakeBufferedHandsOverTheRestWithoutLoss) {
  v1::Frame welcome;
  welcome.mutable_welcome()->set_session_id("s");
  std::string first = encodeFrame(welcome);
  std::string second = encodeDataFrame(2, "second");
  std::string third = encodeDataFrame(4, std::string(500, 't'));
  std::string wire = first + second + third.substr(0, 100);

  FrameDecoder handshake;
  handshake.feed(wire);
  auto got = handshake.next();
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->frame.welcome().session_id(), "s");
  std::string rest = handshake.takeBuffered();
  EXPECT_EQ(rest, second + third.substr(0, 100));
  EXPECT_EQ(handshake.buffered(), 0u);
  EXPECT_EQ(handshake.takeBuffered(), "");

  FrameDecoder session;
  session.feed(rest);
  session.feed(std::string_view(third).substr(100));
  std::vector<Got> frames = drain(session);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].payload, "second");
  EXPECT_EQ(frames[1].stream_id, 4u);
  EXPECT_EQ(frames[1].payload, std::string(500, 't'));
}

TEST(CodecTest, EmptyFeedIsHarmless) {
  FrameDecoder dec;
  dec.feed(std::string_view());
  auto got = dec.next();
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  EXPECT_EQ(dec.buffered(), 0u);
}

TEST(CodecTest, WhichFramesAreSequenced) {
  const std::set<v1::Frame::BodyCase> unsequenced = {
      v1::Frame::kHello, v1::Frame::kWelcome, v1::Frame::kReject, v1::Frame::kAck,
      v1::Frame::kPing,  v1::Frame::kPong,    v1::Frame::kGoaway};
  for (const v1::Frame& f : oneOfEveryKind()) {
    EXPECT_EQ(isSequenced(f), !unsequenced.contains(f.body_case())) << f.ShortDebugString();
  }
  EXPECT_FALSE(isSequenced(v1::Frame()));
}

}  // namespace
}  // namespace siphon::protocol
