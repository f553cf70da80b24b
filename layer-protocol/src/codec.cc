#include "siphon/protocol/codec.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "siphon/status.h"

namespace siphon::protocol {
namespace {

// Protobuf wire tags of the fields the data fast path touches.
constexpr uint8_t kTagFrameData = (1 << 3) | 2;  // Frame.data, length-delimited
constexpr uint8_t kTagStreamId = (1 << 3) | 0;   // StreamData.stream_id, varint
constexpr uint8_t kTagPayload = (2 << 3) | 2;    // StreamData.payload, length-delimited
// Reads with a file answer possibly next stop this far past the frame in
// the buffer (FrameDecoder::prepare).
constexpr size_t kDetachPeek = 64 * 1024;

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
  // for zero bytes. A detached answer may take only the first part.
  while (!bytes.empty()) {
    auto span = prepare(bytes.size());
    const size_t n = std::min(span.size(), bytes.size());
    std::memcpy(span.data(), bytes.data(), n);
    commit(n);
    bytes.remove_prefix(n);
  }
}

std::span<char> FrameDecoder::prepare(size_t min) {
  declinePipe();  // bytes asked for in memory: the detached data comes here
  if (detached_ && detached_->have < detached_->size) {
    return std::span<char>(detached_->data.data() + detached_->have,
                           detached_->size - detached_->have);
  }
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
  size_t room = buf_.size() - end_;
  if (detach_min_ != 0) {
    // Read up to a little past the end of the frame in the buffer (or of
    // its length prefix), so a large file answer after it arrives mostly
    // after its head was seen, into its own string.
    size_t rest = kLengthPrefixSize;
    if (end_ - pos_ >= kLengthPrefixSize) {
      auto* p = reinterpret_cast<const uint8_t*>(buf_.data() + pos_);
      const size_t len =
          (size_t{p[0]} << 24) | (size_t{p[1]} << 16) | (size_t{p[2]} << 8) | size_t{p[3]};
      rest = kLengthPrefixSize + len > end_ - pos_ ? kLengthPrefixSize + len - (end_ - pos_) : 0;
    }
    room = std::min(room, std::max(min, rest + kDetachPeek));
  }
  return std::span<char>(buf_.data() + end_, room);
}

void FrameDecoder::commit(size_t n) {
  if (detached_ && detached_->have < detached_->size) {
    detached_->have += n;
  } else {
    end_ += n;
  }
}

namespace {

// Skips one field of wire type `wt` at *p (after its tag); false when it
// does not fit before `end`.
bool skipField(uint64_t wt, const uint8_t** p, const uint8_t* end) {
  uint64_t v = 0;
  size_t n = 0;
  switch (wt) {
    case 0:
      n = getVarint(*p, end, &v);
      if (n == 0) return false;
      *p += n;
      return true;
    case 1:
      if (end - *p < 8) return false;
      *p += 8;
      return true;
    case 2:
      n = getVarint(*p, end, &v);
      if (n == 0 || v > static_cast<uint64_t>(end - *p - static_cast<ptrdiff_t>(n))) return false;
      *p += n + v;
      return true;
    case 5:
      if (end - *p < 4) return false;
      *p += 4;
      return true;
    default:
      return false;
  }
}

// Walks the fields at *p up to the first with tag `tag` (one byte), which
// must be the message's last: it is length-delimited and its length runs to
// `msg_end` exactly. On success *p is at its contents and *before_end at its
// tag (the fields before it are [start, before_end)). `avail` is where the
// bytes received so far end: the walk needs only the fields before it.
bool findLastField(uint8_t tag, const uint8_t** p, const uint8_t* avail, const uint8_t* msg_end,
                   const uint8_t** before_end) {
  while (*p < avail) {
    uint64_t t = 0;
    size_t n = getVarint(*p, avail, &t);
    if (n == 0) return false;
    if (n == 1 && **p == tag) {
      *before_end = *p;
      *p += 1;
      uint64_t len = 0;
      n = getVarint(*p, avail, &len);
      if (n == 0) return false;
      *p += n;
      return len == static_cast<uint64_t>(msg_end - *p);
    }
    *p += n;
    if ((t >> 3) == 0 || !skipField(t & 7, p, avail)) return false;
  }
  return false;
}

}  // namespace

bool FrameDecoder::tryDetach(uint32_t len) {
  // Frame{..., response = 10}: Response{..., file = 12}: FileResponse{...,
  // data = 2}: FileData{..., data = 1}, each the last field of its message
  // (as encodeFileDataResponseHead writes them). The fields before each are
  // merged in wire order, as any protobuf parser would.
  constexpr uint8_t kFrameResponse = (10 << 3) | 2;
  constexpr uint8_t kResponseFile = (12 << 3) | 2;
  constexpr uint8_t kFileData = (2 << 3) | 2;
  constexpr uint8_t kDataBytes = (1 << 3) | 2;
  const auto* start = reinterpret_cast<const uint8_t*>(buf_.data() + pos_ + kLengthPrefixSize);
  const uint8_t* avail = reinterpret_cast<const uint8_t*>(buf_.data() + end_);
  const uint8_t* frame_end = start + len;  // past avail: the frame is partial
  const uint8_t* at[4] = {};      // where each message's fields start
  const uint8_t* before[4] = {};  // where the fields before its last one end
  const uint8_t tags[4] = {kFrameResponse, kResponseFile, kFileData, kDataBytes};
  const uint8_t* p = start;
  for (int i = 0; i < 4; ++i) {
    at[i] = p;
    if (!findLastField(tags[i], &p, avail, frame_end, &before[i])) return false;
  }
  const auto data_size = static_cast<size_t>(frame_end - p);
  if (data_size == 0 || p > avail) return false;

  auto d = std::make_unique<Detached>();
  google::protobuf::MessageLite* msgs[4] = {&d->frame, nullptr, nullptr, nullptr};
  for (int i = 0; i < 4; ++i) {
    if (i == 1) msgs[1] = d->frame.mutable_response();
    if (i == 2) msgs[2] = d->frame.mutable_response()->mutable_file();
    if (i == 3) msgs[3] = d->frame.mutable_response()->mutable_file()->mutable_data();
    google::protobuf::io::CodedInputStream in(at[i], static_cast<int>(before[i] - at[i]));
    if (!msgs[i]->MergeFromCodedStream(&in) || !in.ConsumedEntireMessage()) return false;
  }
  d->wire_size = kLengthPrefixSize + len;
  // What of the data is here already (a little: reads stop soon after a
  // frame's head, see prepare()), then the rest straight into the string.
  d->size = data_size;
  d->have = static_cast<size_t>(avail - p);
  // An answer its caller takes from a pipe keeps only what is here in
  // memory; the rest waits for commitPiped() (or declinePipe()).
  d->pipe_wait = pipe_requests_.contains(d->frame.response().request_id());
  d->data.resize(d->pipe_wait ? d->have : data_size);
  std::memcpy(d->data.data(), p, d->have);
  pos_ = end_ = 0;
  detached_ = std::move(d);
  return true;
}

size_t FrameDecoder::pipeWanted() const {
  return detached_ && detached_->pipe_wait ? detached_->size - detached_->have : 0;
}

void FrameDecoder::commitPiped(std::shared_ptr<PipedBytes> piped) {
  if (pipeWanted() == 0 || piped->size() != pipeWanted()) {
    error_ = protoError(v1::INTERNAL, "piped bytes that the frame being received did not want");
    return;
  }
  detached_->piped = std::move(piped);
  detached_->have = detached_->size;
  detached_->pipe_wait = false;
}

void FrameDecoder::declinePipe() {
  if (!detached_ || !detached_->pipe_wait) return;
  detached_->data.resize(detached_->size);
  detached_->pipe_wait = false;
}

absl::StatusOr<std::optional<DecodedFrame>> FrameDecoder::next() {
  if (!error_.ok()) return error_;
  if (detached_) {
    if (detached_->have < detached_->size) return std::nullopt;
    std::optional<DecodedFrame> result(std::in_place);
    result->wire_size = detached_->wire_size;
    result->frame = std::move(detached_->frame);
    *result->frame.mutable_response()->mutable_file()->mutable_data()->mutable_data() =
        std::move(detached_->data);
    result->piped = std::move(detached_->piped);
    detached_.reset();
    return result;
  }
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
  if (end_ - pos_ < kLengthPrefixSize + len) {
    if (detach_min_ != 0 && len >= detach_min_ && tryDetach(len)) return next();
    return std::nullopt;
  }
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
  detached_.reset();
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
