// Capture filters, compiled away from the NetnsWorker and within bounds.
//
// pcap_compile() needs no namespace, only the capture's link type and
// snapshot length: it runs on a dead handle (pcap_open_dead). The filter is
// then installed on the open capture (PacketSource::setFilter, a setsockopt
// that is cheap and namespace-blind). It used to compile inside openPcap()
// on the NetnsWorker, the one thread every netns operation of the agent
// shares (passthrough sockets, listeners, DNS...), and libpcap's compiler
// has no time limit: its optimizer grows much faster than the expression
// (a chain of a few hundred `host A or` terms takes seconds), so one client
// could stall them all.
//
// Bounds:
//   size     kMaxFilterBytes (capture_spec.h), checked before anything runs;
//   time     each compile runs on a thread of its own; the capture waits at
//            most `deadline` for it and is then refused (TIMEOUT). libpcap
//            cannot be interrupted: the thread runs on to its end and its
//            result is dropped;
//   threads  at most `max_running` compiles run at a time, those past their
//            deadline included; one more is refused (RESOURCE_EXHAUSTED).
//
// Threads: compile() on the event loop (any single-threaded executor); the
// compile function on a thread of its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "siphon/transport/asio.h"

struct bpf_program;

namespace siphon::agent::capture {

inline constexpr auto kFilterCompileDeadline = std::chrono::seconds(2);
inline constexpr size_t kMaxFilterCompiles = 4;

// A BPF program libpcap compiled; freed with it.
class CompiledFilter {
 public:
  CompiledFilter(std::string expression, std::unique_ptr<bpf_program> program);
  // No program: what the fakes of tests compile to.
  explicit CompiledFilter(std::string expression);
  ~CompiledFilter();
  CompiledFilter(const CompiledFilter&) = delete;
  CompiledFilter& operator=(const CompiledFilter&) = delete;

  const std::string& expression() const { return expression_; }
  // Null for the fakes of tests.
  bpf_program* program() const { return program_.get(); }

 private:
  std::string expression_;
  std::unique_ptr<bpf_program> program_;
};

using CompiledFilterOr = absl::StatusOr<std::shared_ptr<const CompiledFilter>>;

// Compiles `expression` (optimized, netmask unknown) for captures of DLT_
// link type `dlt` and `snaplen`, on the calling thread. INVALID_ARGUMENT
// with libpcap's words ("capture filter 'tcp prot 80': can't parse filter
// expression: syntax error").
CompiledFilterOr compilePcapFilter(const std::string& expression, int dlt, uint32_t snaplen);

using FilterCompileFunction =
    std::function<CompiledFilterOr(const std::string& expression, int dlt, uint32_t snaplen)>;

// Runs compiles within the bounds at the top of the file.
class FilterCompiler {
 public:
  FilterCompiler(FilterCompileFunction compile, std::chrono::milliseconds deadline,
                 size_t max_running);
  // A compile still running hands its result to nobody once its caller
  // is gone (filter_compiler.cc, Job).
  ~FilterCompiler();
  FilterCompiler(const FilterCompiler&) = delete;
  FilterCompiler& operator=(const FilterCompiler&) = delete;

  // The compiled filter, or the compile's error, TIMEOUT past the deadline,
  // RESOURCE_EXHAUSTED when max_running compiles run already. Resumes on
  // the caller's executor.
  net::awaitable<CompiledFilterOr> compile(std::string expression, int dlt, uint32_t snaplen);

  // Compiles running now (tests).
  size_t runningForTest() const;

 private:
  struct Shared;
  FilterCompileFunction compile_;
  std::chrono::milliseconds deadline_;
  size_t max_running_;
  // Shared with the compile threads, which may outlive us.
  std::shared_ptr<Shared> shared_;
};

}  // namespace siphon::agent::capture
