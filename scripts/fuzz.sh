#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ and runs frame_fuzzer
# for a bounded time; exits non-zero when it finds a crash (the input is kept
# in build-fuzz/fuzz-artifacts/).
#
#   scripts/fuzz.sh [--ci] [SECONDS]
#
# --ci: start from the seeds only (no corpus kept between runs, so a run does
# not depend on an earlier one) and default to 60 s. Without it the corpus in
# build-fuzz/fuzz-corpus/ grows from run to run and the default is 300 s.
# Reproduce a crash: build-fuzz/tests/fuzz/frame_fuzzer ARTIFACT
set -euo pipefail

usage() {
  echo "usage: $0 [--ci] [SECONDS]" >&2
  exit 2
}

ci=0
seconds=""
for arg in "$@"; do
  case "$arg" in
    --ci) ci=1 ;;
    -h | --help) usage ;;
    *[!0-9]* | "") usage ;;
    *) seconds="$arg" ;;
  esac
done
if [[ -z "$seconds" ]]; then
  seconds=$((ci ? 60 : 300))
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"

# The main build uses GCC; libFuzzer needs clang (and, for clang 14,
# libclang-rt-14-dev, which install-deps.sh installs).
for tool in clang clang++ cmake ninja; do
  command -v "$tool" >/dev/null || {
    echo "fuzz.sh: $tool not found" >&2
    exit 1
  }
done

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSIPHON_FUZZ=ON -DSIPHON_TESTS=ON >/dev/null
ninja -C "$build" frame_fuzzer

fuzzer="$build/tests/fuzz/frame_fuzzer"
seeds="$build/fuzz-seeds/frame"
artifacts="$build/fuzz-artifacts"
rm -rf "$seeds"
mkdir -p "$seeds" "$artifacts"
SIPHON_FUZZ_WRITE_SEEDS="$seeds" "$fuzzer"

if ((ci)); then
  corpus="$(mktemp -d "${TMPDIR:-/tmp}/siphon-fuzz-corpus.XXXXXX")"
  trap 'rm -rf "$corpus"' EXIT
else
  corpus="$build/fuzz-corpus/frame"
  mkdir -p "$corpus"
fi

echo "fuzz.sh: frame_fuzzer for ${seconds}s (corpus $corpus)"
# libFuzzer exits non-zero on a crash, a leak, a sanitizer report, a timeout
# (-timeout per input) or running out of memory (-rss_limit_mb).
status=0
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  "$fuzzer" "$corpus" "$seeds" \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -artifact_prefix="$artifacts/" -print_final_stats=1 || status=$?
if ((status != 0)); then
  echo "fuzz.sh: frame_fuzzer failed (exit $status); inputs in $artifacts/" >&2
  exit 1
fi
echo "fuzz.sh: frame_fuzzer ran ${seconds}s clean"
