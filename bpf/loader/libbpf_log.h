// libbpf prints to stderr by default, warnings and info alike. Every loader
// routes it to spdlog instead, before its first libbpf call: warnings
// (including the verifier log when a load fails) at warn, the chatter at
// debug. The print callback is process-wide in libbpf; installing it is done
// once, whichever loader comes first.
#pragma once

namespace siphon::bpf {

void routeLibbpfLogs();

}  // namespace siphon::bpf
