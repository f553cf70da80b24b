#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/ and
# runs each for a bounded time from the committed corpus
# (tests/fuzz/corpus/<target>/) and the target's built-in seeds; exits
# non-zero when any finds a crash, a leak, undefined behaviour, a timeout or
# runs out of memory (the inputs are kept in build-fuzz/fuzz-artifacts/).
#
#   scripts/fuzz.sh [--ci] [SECONDS] [TARGET...]
#
# SECONDS is per target. TARGET: frame, request, http, http2 (default: all).
#   frame    framing, the handshake helpers, sessions of both roles
#   request  request and stream-open fields the agent parses (files, DNS,
#            addresses, captures, filters, env), target files it reads
#   http     protocol detection, HTTP/1 heads and bodies, steal filters
#   http2    an HTTP/2 client connection served by the filtered-steal engine
#            (nghttp2, header-list and flood limits, routing of each stream)
#
# --ci: 20 s per target by default; new inputs go to a temporary directory,
# so a run depends only on the commit. Without it the default is 300 s per
# target and new inputs accumulate in build-fuzz/fuzz-corpus/<target>/.
# Budget in CI: the build (about 5 min from scratch on 2 cores, seconds
# when build-fuzz/ is warm) plus 4 x 20 s.
#
# Reproduce a crash: build-fuzz/tests/fuzz/<target>_fuzzer ARTIFACT
# Grow the committed corpus: run without --ci, then
#   build-fuzz/tests/fuzz/<target>_fuzzer -merge=1 tests/fuzz/corpus/<target> \
#     build-fuzz/fuzz-corpus/<target>
set -euo pipefail

usage() {
  echo "usage: $0 [--ci] [SECONDS] [frame|request|http|http2 ...]" >&2
  exit 2
}

all_targets=(frame request http http2)
ci=0
seconds=""
targets=()
for arg in "$@"; do
  case "$arg" in
    --ci) ci=1 ;;
    -h | --help) usage ;;
    frame | request | http | http2) targets+=("$arg") ;;
    *[!0-9]* | "") usage ;;
    *) seconds="$arg" ;;
  esac
done
if [[ -z "$seconds" ]]; then
  seconds=$((ci ? 20 : 300))
fi
if ((${#targets[@]} == 0)); then
  targets=("${all_targets[@]}")
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
start=$SECONDS
ninja -C "$build" "${targets[@]/%/_fuzzer}"
echo "fuzz.sh: build took $((SECONDS - start))s"

artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"
if ((ci)); then
  scratch="$(mktemp -d "${TMPDIR:-/tmp}/siphon-fuzz-corpus.XXXXXX")"
  trap 'rm -rf "$scratch"' EXIT
fi

failed=()
for t in "${targets[@]}"; do
  fuzzer="$build/tests/fuzz/${t}_fuzzer"
  seeds="$build/fuzz-seeds/$t"
  committed="$root/tests/fuzz/corpus/$t"
  rm -rf "$seeds"
  mkdir -p "$seeds"
  SIPHON_FUZZ_WRITE_SEEDS="$seeds" "$fuzzer"
  if ((ci)); then
    corpus="$scratch/$t"
  else
    corpus="$build/fuzz-corpus/$t"
  fi
  mkdir -p "$corpus"
  # Frames carry whole sessions; the other inputs are single requests or
  # connection starts.
  max_len=16384
  [[ "$t" == frame ]] && max_len=65536
  echo "fuzz.sh: ${t}_fuzzer for ${seconds}s (corpus $corpus)"
  # libFuzzer exits non-zero on a crash, a leak, a sanitizer report, a
  # timeout (-timeout per input) or running out of memory (-rss_limit_mb).
  # The first corpus directory takes the new inputs; the committed one is
  # only read.
  status=0
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$fuzzer" "$corpus" "$committed" "$seeds" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
    -artifact_prefix="$artifacts/$t-" -print_final_stats=1 || status=$?
  if ((status != 0)); then
    echo "fuzz.sh: ${t}_fuzzer failed (exit $status); inputs in $artifacts/$t-*" >&2
    failed+=("$t")
  fi
done

if ((${#failed[@]} > 0)); then
  echo "fuzz.sh: failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${targets[*]} ran ${seconds}s each, clean"
