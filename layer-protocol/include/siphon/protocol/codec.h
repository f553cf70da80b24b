// Frame codec: 4-byte big-endian length + one siphon.v1.Frame.
//
// Data frames (Frame.data = StreamData{stream_id, payload}) are the hot path:
// the encoder writes their few header bytes by hand so the payload can go to
// the socket as a second buffer, and the decoder parses them in place, handing
// out a view into its receive buffer. Every other frame goes through the
// generated classes. Both forms are the ordinary protobuf wire format, so any
// protobuf parser reads what we write. Large file read answers are the other
// bulk path: their data goes out as a second buffer too, and the decoder can
// receive it straight into its final string (setDetachFileData).
//
// Call-order rules (FrameDecoder): feed() or prepare()/commit() bytes, then
// call next() until it returns nullopt. A DataView from next() is valid until
// the next feed()/prepare()/reset(). After an error every next() returns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>

#include "absl/status/statusor.h"
#include "siphon/protocol/piped_bytes.h"
#include "siphon/v1/frame.pb.h"

namespace siphon::protocol {

inline constexpr uint32_t kDefaultMaxFrameSize = 1u << 20;
inline constexpr size_t kLengthPrefixSize = 4;
// Largest hand-written data frame header: prefix, then tag+varint(len) of
// Frame.data, tag+varint(stream id), tag+varint(payload length).
inline constexpr size_t kMaxDataHeaderSize = kLengthPrefixSize + 1 + 5 + 1 + 10 + 1 + 5;
// Room a data frame needs beyond its payload; payload chunks are cut to
// max_frame_size - kDataFrameOverhead.
inline constexpr size_t kDataFrameOverhead = kMaxDataHeaderSize - kLengthPrefixSize;

struct DataView {
  uint64_t stream_id = 0;
  std::string_view payload;
};

struct DecodedFrame {
  bool is_data = false;
  DataView data;         // is_data
  v1::Frame frame;       // !is_data
  size_t wire_size = 0;  // prefix included
  // A file read answer received into a pipe (FrameDecoder::commitPiped):
  // its FileData.data holds the bytes that came first, these the rest.
  std::shared_ptr<PipedBytes> piped;
};

class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_frame_size = kDefaultMaxFrameSize);

  void setMaxFrameSize(uint32_t max_frame_size) { max_frame_size_ = max_frame_size; }
  uint32_t maxFrameSize() const { return max_frame_size_; }

  // File read answers (Frame.response with Response.file.data last, as
  // encodeFileDataResponseHead lays them out) of at least `min` bytes get
  // their data received straight into the string that becomes
  // FileData.data: once such a frame's head is here, prepare() hands out
  // the room left in that string, and reads at a frame's end stop soon
  // after it, so the next frame's data is not read into the buffer first.
  // 0 (the default): off. Not for a decoder whose takeBuffered() is used.
  void setDetachFileData(size_t min) { detach_min_ = min; }

  // Piped receive: a detached answer to a request marked expectPiped()
  // keeps in memory only the bytes of its data already received;
  // pipeWanted() then says how many are still to come, for the transport
  // to splice from its socket into a pipe and hand over with commitPiped()
  // (the frame then comes from next() with DecodedFrame::piped).
  // declinePipe(), or any prepare()/feed(), takes them in memory instead.
  // The mark outlives reset() (a resumed transport receives the answer
  // again) until forgetPiped().
  void expectPiped(uint64_t request_id) { pipe_requests_.insert(request_id); }
  void forgetPiped(uint64_t request_id) { pipe_requests_.erase(request_id); }
  size_t pipeWanted() const;
  // `piped` holds exactly pipeWanted() bytes (else an INTERNAL error).
  void commitPiped(std::shared_ptr<PipedBytes> piped);
  void declinePipe();

  // Appends received bytes.
  void feed(std::string_view bytes);
  // Zero-copy receive: a writable span at the end of the buffer, of at
  // least `min` bytes unless a detached file read's data needs fewer;
  // commit(n) makes the first n of them readable.
  std::span<char> prepare(size_t min);
  void commit(size_t n);

  // The next complete frame, nullopt when more bytes are needed, or a typed
  // error: FRAME_TOO_LARGE (length above the maximum) or PROTOCOL_ERROR
  // (bytes that are not a Frame, an empty frame).
  absl::StatusOr<std::optional<DecodedFrame>> next();

  // Bytes received but not yet returned as frames; handing them to another
  // decoder (after the handshake) loses nothing.
  std::string takeBuffered();
  size_t buffered() const {
    // A detached answer's head is here too: all but the data still to come.
    return end_ - pos_ + (detached_ ? detached_->wire_size - detached_->size + detached_->have : 0);
  }
  void reset();

 private:
  // A file read answer whose data is being received into `data`.
  struct Detached {
    v1::Frame frame;  // everything but the data
    std::string data;
    size_t size = 0;  // of the data
    size_t have = 0;
    size_t wire_size = 0;
    bool pipe_wait = false;  // the rest is to come by commitPiped()
    std::shared_ptr<PipedBytes> piped;
  };

  void compact();
  // Starts a Detached for the partial frame of `len` bytes at pos_ when it
  // is a file read answer whose head is all here; false otherwise.
  bool tryDetach(uint32_t len);

  uint32_t max_frame_size_;
  std::string buf_;
  size_t pos_ = 0;  // first unread byte
  size_t end_ = 0;  // end of readable bytes; buf_.size() may be larger
  absl::Status error_;
  size_t detach_min_ = 0;
  std::unordered_set<uint64_t> pipe_requests_;
  std::unique_ptr<Detached> detached_;
};

// Appends [length][frame] to *out. The caller checks sizes against the limit
// (frames we build are bounded by construction).
void encodeFrame(const v1::Frame& frame, std::string* out);
std::string encodeFrame(const v1::Frame& frame);

// Writes the header of a data frame carrying `payload_size` bytes for
// `stream_id` into out[0..kMaxDataHeaderSize) and returns its length. The
// payload follows it on the wire.
size_t encodeDataHeader(uint64_t stream_id, size_t payload_size, char* out);

// Header + payload in one string (tests, small frames).
std::string encodeDataFrame(uint64_t stream_id, std::string_view payload);

// The other bulk path: a file read's answer (Frame.response with
// Response.file.data). `response` comes with its FileData.data taken out;
// the result is the frame's length prefix and every byte of the frame
// before those data, which follow on the wire as their own buffer
// (`data_size` bytes). FileData's data field goes last in the frame, which
// any protobuf parser accepts (fields may come in any order).
std::string encodeFileDataResponseHead(const v1::Response& response, size_t data_size);

// Whether a frame takes a sequence number (see frame.proto).
bool isSequenced(const v1::Frame& frame);

}  // namespace siphon::protocol
