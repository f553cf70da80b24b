#!/usr/bin/env bash
# Runs the test suite under sanitizers (clang 14; ASan -O0, TSan -O1; -g1):
#
#   scripts/sanitize.sh [--build-only|--test-only] [asan|tsan|all] [ctest args...]
#                                                           (default: all)
#
# asan: AddressSanitizer + LeakSanitizer + UBSan over every test (unit and
#       privileged; the privileged ones skip without root), in build-asan/,
#       but those labelled no-sanitize (their CMakeLists.txt says why).
#       The agent and CLI binaries the tests start are instrumented too.
# tsan: ThreadSanitizer over the unit tests (ctest -L unit), in build-tsan/,
#       but those labelled no-tsan or no-sanitize.
# --build-only configures and builds; --test-only runs the tests of a tree
# built before (scripts/test.sh builds the sanitizer trees in the background
# while other tests run, then tests them).
#
# Both trees are unity builds (eight sources of a target per translation
# unit): half the compile time of one file at a time, since the Asio, Beast
# and protobuf templates each file instantiates are then compiled once per
# eight. The normal build stays one file at a time, so each source still
# compiles on its own (its includes complete), and a name two sources of a
# target both define at file scope fails here: give it a file's own name.
#
# The normal build uses GCC 12; the sanitizer builds use clang 14, which
# compiles this code (Asio coroutines at -O0 with ASan) in less than half
# GCC's time, and is a second compiler over every source with -Werror.
#
# Exits non-zero when a test fails or any instrumented process (a test, or an
# agent or CLI a test started) reports anything. ASan, LSan, UBSan and TSan
# reports are written to files under <build>/sanitizer-reports/ (log_path),
# because a test may not look at the exit status of a child it kills; the
# files are printed at the end. UBSan also aborts (-fno-sanitize-recover):
# the test sees the crash of its process or of the agent/CLI it waits for.
# Suppressions (each with its reason) are in tests/sanitizers/.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
phases=both
case "${1:-}" in
  --build-only) phases=build; shift ;;
  --test-only) phases=test; shift ;;
esac
mode="${1:-all}"
case "$mode" in
  asan | tsan | all) shift || true ;;
  -h | --help)
    sed -n '2,27p' "${BASH_SOURCE[0]}"
    exit 0
    ;;
  -*) mode=all ;;
  *)
    echo "usage: $0 [asan|tsan|all] [ctest args...]" >&2
    exit 2
    ;;
esac
supp="$root/tests/sanitizers"

# configure DIR SANITIZERS OPT: -g1 (line tables) for the reports; NDEBUG as
# in the normal build, so the same code is checked. ASan builds at -O0 (the
# fastest compile); TSan keeps -O1, whose tests run markedly faster.
configure() {
  local tool
  for tool in clang clang++; do
    command -v "$tool" >/dev/null || {
      echo "sanitize.sh: $tool not found (scripts/install-deps.sh installs it)" >&2
      return 1
    }
  done
  CC=clang CXX=clang++ cmake -S "$root" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSIPHON_SANITIZE="$2" -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$3 -g1 -DNDEBUG" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$3 -g1 -DNDEBUG" >/dev/null
}

# The run_* functions are called from `||`, where `set -e` does not apply:
# each failure returns explicitly.

# run_ctest NAME BUILD_DIR [ctest args...]: runs ctest with a fresh report
# directory; fails if ctest fails or any report was written.
run_ctest() {
  local name="$1" dir="$2"
  shift 2
  local reports="$dir/sanitizer-reports"
  rm -rf "$reports"
  mkdir -p "$reports"
  chmod 1777 "$reports" # processes a test runs as another user report too
  local rc=0
  # A bound for a hung test; instrumented tests run 2-5x slower than normal
  # (the slowest normal test takes ~5 s).
  # (-j3 on two cores: as in scripts/test.sh, half a test's time is waiting.)
  ctest --test-dir "$dir" --output-on-failure -j3 --timeout 900 "$@" || rc=$?
  if compgen -G "$reports/*" >/dev/null; then
    echo "sanitize.sh: $name: sanitizer reports:" >&2
    local f
    for f in "$reports"/*; do
      echo "----- $f" >&2
      cat "$f" >&2
    done
    rc=1
  fi
  # UBSan reports (stderr) of a child whose exit status a test ignored still
  # land in the test's output, which ctest keeps.
  local out="$dir/Testing/Temporary/LastTest.log"
  if [ -f "$out" ] && grep -n -m 20 -E ': runtime error: |ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer' "$out" >&2; then
    echo "sanitize.sh: $name: sanitizer reports in the test output above ($out)" >&2
    rc=1
  fi
  if [ "$rc" != 0 ]; then
    echo "sanitize.sh: $name FAILED" >&2
  else
    echo "sanitize.sh: $name passed with no sanitizer report"
  fi
  return "$rc"
}

build_asan() {
  local dir="$root/build-asan"
  configure "$dir" address,undefined -O0 || return 1
  ninja -C "$dir" -j2 siphon_tests || return 1
}

test_asan() {
  local dir="$root/build-asan"
  local log="log_path=$dir/sanitizer-reports/report:log_exe_name=1"
  # abort_on_error: a reporting child dies by SIGABRT, so a test that waits
  # for it sees an unexpected exit even without reading the report.
  ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:disable_coredump=1:$log" \
  UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:$log" \
  LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
    run_ctest asan "$dir" -LE no-sanitize "$@"
}

build_tsan() {
  local dir="$root/build-tsan"
  configure "$dir" thread -O1 || return 1
  ninja -C "$dir" -j2 siphon_unit_tests || return 1
}

test_tsan() {
  local dir="$root/build-tsan"
  # halt_on_error=0: a test run lists all its races, then exits with
  # exitcode (66) and the report files fail the run.
  TSAN_OPTIONS="halt_on_error=0:exitcode=66:second_deadlock_stack=1:suppressions=$supp/tsan.supp:print_suppressions=0:log_path=$dir/sanitizer-reports/report:log_exe_name=1" \
    run_ctest tsan "$dir" -L unit -LE 'no-tsan|no-sanitize' "$@"
}

# run NAME [ctest args...]: the phases asked for, of one sanitizer.
run() {
  local name="$1"
  shift
  if [ "$phases" != test ]; then
    "build_$name" || {
      echo "sanitize.sh: $name build FAILED" >&2
      return 1
    }
  fi
  if [ "$phases" != build ]; then
    "test_$name" "$@" || return 1
  fi
}

rc=0
case "$mode" in
  asan) run asan "$@" || rc=$? ;;
  tsan) run tsan "$@" || rc=$? ;;
  all)
    run asan "$@" || rc=$?
    run tsan "$@" || rc=$?
    ;;
esac
exit "$rc"
