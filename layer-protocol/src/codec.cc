#include "siphon/protocol/codec.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::protocol {
namespace {

// Protobuf wire tags of the fields the data fast path touches.
constexpr uint8_t kTagFrameData = (1 << 3) | 2;  // Frame.data, length-delimited
constexpr uint8_t kTagStreamId = (1 << 3) | 0;   // StreamData.stream_id, varint
constexpr uint8_t kTagPayload = (2 << 3) | 2;    // StreamData.payload, length-delimited

size_t putVarint(uint64_t v, char* out) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out[n++] = static_cast<char>(v);
  return n;
}

size_t varintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// Reads a varint at p (< end); returns bytes used, 0 when malformed or cut.
size_t getVarint(const uint8_t* p, const uint8_t* end, uint64_t* v) {
  uint64_t result = 0;
  for (size_t i = 0; i < 10 && p + i < end; ++i) {
    result |= static_cast<uint64_t>(p[i] & 0x7f) << (7 * i);
    if ((p[i] & 0x80) == 0) {
      *v = result;
      return i + 1;
    }
  }
  return 0;
}

void putLength(uint32_t len, char* out) {
  out[0] = static_cast<char>(len >> 24);
  out[1] = static_cast<char>(len >> 16);
  out[2] = static_cast<char>(len >> 8);
  out[3] = static_cast<char>(len);
}

// Parses the canonical data-frame layout in place. Returns false when the
// body is not exactly that layout; the caller then uses the generic parser,
// which accepts every valid encoding.
bool parseDataInPlace(std::string_view body, DataView* out) {
  auto* p = reinterpret_cast<const uint8_t*>(body.data());
  const uint8_t* end = p + body.size();
  if (p == end || *p != kTagFrameData) return false;
  ++p;
  uint64_t inner_len = 0;
  size_t n = getVarint(p, end, &inner_len);
  if (n == 0) return false;
  p += n;
  if (inner_len != static_cast<uint64_t>(end - p)) return false;
  uint64_t stream_id = 0;
  if (p < end && *p == kTagStreamId) {
    ++p;
    n = getVarint(p, end, &stream_id);
    if (n == 0) return false;
    p += n;
  }
  std::string_view payload;
  if (p < end) {
    if (*p != kTagPayload) return false;
    ++p;
    uint64_t len = 0;
    n = getVarint(p, end, &len);
    if (n == 0) return false;
    p += n;
    if (len != static_cast<uint64_t>(end - p)) return false;
    payload = std::string_view(reinterpret_cast<const char*>(p), len);
  }
  out->stream_id = stream_id;
  out->payload = payload;
  return true;
}

}  // namespace

FrameDecoder::FrameDecoder(uint32_t max_frame_size) : max_frame_size_(max_frame_size) {}

void FrameDecoder::compact() {
  if (pos_ == 0) return;
  if (pos_ == end_) {
    pos_ = end_ = 0;
    return;
  }
  std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
  end_ -= pos_;
  pos_ = 0;
}

void FrameDecoder::feed(std::string_view bytes) {
  // An empty view may have a null data(); memcpy from null is undefined even
  // for zero bytes.
  if (bytes.empty()) return;
  auto span = prepare(bytes.size());
  std::memcpy(span.data(), bytes.data(), bytes.size());
  commit(bytes.size());
}

std::span<char> FrameDecoder::prepare(size_t min) {
  // Move the unread bytes (a partial frame, up to a whole large one) to the
  // front only when the room after them is short: not on every read.
  if (pos_ == end_) {
    pos_ = end_ = 0;
  } else if (buf_.size() - end_ < min) {
    compact();
  }
  if (buf_.size() - end_ < min) {
    // Grow geometrically; resize() value-initialises, which is fine at these
    // sizes and happens only while the buffer is growing.
    buf_.resize(std::max(end_ + min, buf_.size() * 2));
  }
  return std::span<char>(buf_.data() + end_, buf_.size() - end_);
}

void FrameDecoder::commit(size_t n) { end_ += n; }

absl::StatusOr<std::optional<DecodedFrame>> FrameDecoder::next() {
  if (!error_.ok()) return error_;
  if (end_ - pos_ < kLengthPrefixSize) return std::nullopt;
  auto* p = reinterpret_cast<const uint8_t*>(buf_.data() + pos_);
  uint32_t len = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
  if (len > max_frame_size_) {
    error_ = protoError(
        v1::FRAME_TOO_LARGE,
        absl::StrCat("frame of ", len, " bytes is above the maximum of ", max_frame_size_));
    return error_;
  }
  if (len == 0) {
    error_ = protoError(v1::PROTOCOL_ERROR, "empty frame");
    return error_;
  }
  if (end_ - pos_ < kLengthPrefixSize + len) return std::nullopt;
  std::string_view body(buf_.data() + pos_ + kLengthPrefixSize, len);
  DecodedFrame out;
  out.wire_size = kLengthPrefixSize + len;
  if (parseDataInPlace(body, &out.data)) {
    out.is_data = true;
  } else {
    if (!out.frame.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
      error_ = protoError(v1::PROTOCOL_ERROR, absl::StrCat("undecodable frame of ", len, " bytes"));
      return error_;
    }
    if (out.frame.body_case() == v1::Frame::BODY_NOT_SET) {
      // An unknown (newer) frame type or an empty message: we cannot tell
      // whether it was sequenced, so the stream of seqs would go wrong.
      error_ = protoError(v1::PROTOCOL_ERROR, "frame with no known body");
      return error_;
    }
    if (out.frame.body_case() == v1::Frame::kData) {
      // A valid but non-canonical data frame: serve it as a view all the same
      // by keeping the payload in the message.
      out.is_data = true;
    }
  }
  pos_ += out.wire_size;
  std::optional<DecodedFrame> result(std::move(out));
  if (result->is_data && result->frame.has_data()) {
    // Point the view at the message's own copy, now that it has its home.
    result->data.stream_id = result->frame.data().stream_id();
    result->data.payload = result->frame.data().payload();
  }
  return result;
}

std::string FrameDecoder::takeBuffered() {
  std::string out(buf_.data() + pos_, end_ - pos_);
  pos_ = end_ = 0;
  return out;
}

void FrameDecoder::reset() {
  pos_ = end_ = 0;
  error_ = absl::OkStatus();
}

void encodeFrame(const v1::Frame& frame, std::string* out) {
  size_t size = frame.ByteSizeLong();
  size_t at = out->size();
  out->resize(at + kLengthPrefixSize + size);
  putLength(static_cast<uint32_t>(size), out->data() + at);
  frame.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(out->data() + at + kLengthPrefixSize));
}

std::string encodeFrame(const v1::Frame& frame) {
  std::string out;
  encodeFrame(frame, &out);
  return out;
}

size_t encodeDataHeader(uint64_t stream_id, size_t payload_size, char* out) {
  // StreamData body: [stream_id field][payload field]; proto3 omits zeros.
  size_t inner = 0;
  if (stream_id != 0) inner += 1 + varintSize(stream_id);
  if (payload_size != 0) inner += 1 + varintSize(payload_size) + payload_size;
  size_t body = 1 + varintSize(inner) + inner;
  putLength(static_cast<uint32_t>(body), out);
  size_t n = kLengthPrefixSize;
  out[n++] = static_cast<char>(kTagFrameData);
  n += putVarint(inner, out + n);
  if (stream_id != 0) {
    out[n++] = static_cast<char>(kTagStreamId);
    n += putVarint(stream_id, out + n);
  }
  if (payload_size != 0) {
    out[n++] = static_cast<char>(kTagPayload);
    n += putVarint(payload_size, out + n);
  }
  return n;
}

std::string encodeDataFrame(uint64_t stream_id, std::string_view payload) {
  char header[kMaxDataHeaderSize];
  size_t n = encodeDataHeader(stream_id, payload.size(), header);
  std::string out(header, n);
  out.append(payload);
  return out;
}

std::string encodeFileDataResponseHead(const v1::Response& response, size_t data_size) {
  // Field tags (field number << 3 | wire type 2, length-delimited): all one byte.
  constexpr char kFrameResponse = (10 << 3) | 2;  // Frame.response
  constexpr char kResponseFile = (12 << 3) | 2;   // Response.file
  constexpr char kFileData = (2 << 3) | 2;        // FileResponse.data
  constexpr char kDataBytes = (1 << 3) | 2;       // FileData.data
  // Innermost first: each length covers what follows it, data included.
  const v1::FileData& fd = response.file().data();
  const size_t fd_rest = fd.ByteSizeLong();  // eof; data is empty here
  // proto3 leaves an empty bytes field out; so do we.
  const size_t data_field = data_size == 0 ? 0 : 1 + varintSize(data_size) + data_size;
  const size_t fd_len = fd_rest + data_field;
  const size_t fr_len = 1 + varintSize(fd_len) + fd_len;
  v1::Response rest;  // everything of the response but its body
  rest.set_request_id(response.request_id());
  if (response.has_error()) *rest.mutable_error() = response.error();
  const size_t rest_len = rest.ByteSizeLong();
  const size_t resp_len = rest_len + 1 + varintSize(fr_len) + fr_len;
  const size_t frame_len = 1 + varintSize(resp_len) + resp_len;

  std::string head(kLengthPrefixSize + frame_len - data_size, '\0');
  char* p = head.data();
  putLength(static_cast<uint32_t>(frame_len), p);
  p += kLengthPrefixSize;
  *p++ = kFrameResponse;
  p += putVarint(resp_len, p);
  rest.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(p));
  p += rest_len;
  *p++ = kResponseFile;
  p += putVarint(fr_len, p);
  *p++ = kFileData;
  p += putVarint(fd_len, p);
  fd.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(p));
  p += fd_rest;
  if (data_size > 0) {
    *p++ = kDataBytes;
    p += putVarint(data_size, p);
  }
  head.resize(static_cast<size_t>(p - head.data()));
  return head;
}

bool isSequenced(const v1::Frame& frame) {
  switch (frame.body_case()) {
    case v1::Frame::kHello:
    case v1::Frame::kWelcome:
    case v1::Frame::kReject:
    case v1::Frame::kAck:
    case v1::Frame::kPing:
    case v1::Frame::kPong:
    case v1::Frame::kGoaway:
    case v1::Frame::BODY_NOT_SET:
      return false;
    default:
      return true;
  }
}

}  // namespace siphon::protocol
