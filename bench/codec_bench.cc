// Data frames: the hand-written fast path against the generated protobuf
// classes (the baseline), same payloads, same run. Read the ratio of the two
// rows of each size, not the absolute times. `scripts/bench.sh` runs it.
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>

#include "siphon/protocol/codec.h"
#include "siphon/protocol/session.h"

namespace siphon::protocol {
namespace {

std::string payload(size_t n) { return std::string(n, 'x'); }

void BM_EncodeData_FastPath(benchmark::State& state) {
  std::string p = payload(static_cast<size_t>(state.range(0)));
  char header[kMaxDataHeaderSize];
  for (auto _ : state) {
    size_t n = encodeDataHeader(7, p.size(), header);
    benchmark::DoNotOptimize(n);
    benchmark::DoNotOptimize(p.data());  // the payload goes out as its own buffer
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

void BM_EncodeData_Generated(benchmark::State& state) {
  std::string p = payload(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    v1::Frame f;
    f.mutable_data()->set_stream_id(7);
    f.mutable_data()->set_payload(p);
    std::string out = encodeFrame(f);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

std::string manyFrames(size_t payload_size, size_t count) {
  std::string wire;
  std::string p = payload(payload_size);
  for (size_t i = 0; i < count; ++i) wire += encodeDataFrame(7, p);
  return wire;
}

void BM_DecodeData_FastPath(benchmark::State& state) {
  std::string wire = manyFrames(static_cast<size_t>(state.range(0)), 64);
  FrameDecoder decoder(1 << 20);
  for (auto _ : state) {
    decoder.feed(wire);
    size_t bytes = 0;
    while (true) {
      auto f = decoder.next();
      if (!f.ok() || !f->has_value()) break;
      bytes += (*f)->data.payload.size();
    }
    benchmark::DoNotOptimize(bytes);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0) * 64);
}

void BM_DecodeData_Generated(benchmark::State& state) {
  std::string wire = manyFrames(static_cast<size_t>(state.range(0)), 64);
  std::string recv(wire.size(), '\0');
  for (auto _ : state) {
    // The same receive copy the fast path pays in feed().
    std::memcpy(recv.data(), wire.data(), wire.size());
    size_t at = 0, bytes = 0;
    while (at + kLengthPrefixSize <= recv.size()) {
      auto* p = reinterpret_cast<const uint8_t*>(recv.data() + at);
      uint32_t len = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
      v1::Frame f;
      f.ParseFromArray(recv.data() + at + kLengthPrefixSize, static_cast<int>(len));
      bytes += f.data().payload().size();
      at += kLengthPrefixSize + len;
    }
    benchmark::DoNotOptimize(bytes);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0) * 64);
}

BENCHMARK(BM_EncodeData_FastPath)->Arg(64)->Arg(16 << 10)->Arg(256 << 10);
BENCHMARK(BM_EncodeData_Generated)->Arg(64)->Arg(16 << 10)->Arg(256 << 10);
BENCHMARK(BM_DecodeData_FastPath)->Arg(64)->Arg(16 << 10)->Arg(256 << 10);
BENCHMARK(BM_DecodeData_Generated)->Arg(64)->Arg(16 << 10)->Arg(256 << 10);

}  // namespace
}  // namespace siphon::protocol

BENCHMARK_MAIN();
