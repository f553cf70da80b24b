#!/usr/bin/env bash
# Builds Siphon and runs its tests: unit tests, and privileged tests (which
# skip themselves with a reason when not run as root); then a short fuzzing
# pass; then the tests again under ASan/UBSan and TSan.
#
# Usage: scripts/test.sh [ctest args...]   e.g. scripts/test.sh -L unit
# Runnable from any directory.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh

# Each phase's end is printed with the seconds since the start (CI's time).
phase() { echo "test.sh: $1 done after ${SECONDS} s"; }
phase "installing dependencies"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j2
phase "the build"

# A short, bounded libFuzzer pass over the frame decoder and handshake
# (clang build in build-fuzz/). It runs before ctest so that ctest's summary
# is the last thing printed. Skip it with SIPHON_SKIP_FUZZ=1.
if [ "${SIPHON_SKIP_FUZZ:-0}" != 1 ]; then
  bash scripts/fuzz.sh --ci
  phase "fuzzing"
fi

ctest --test-dir build --output-on-failure -j2 "$@"
phase "the tests"

# The same tests again under sanitizers (scripts/sanitize.sh): ASan+UBSan over
# every test in build-asan/, TSan over the unit tests in build-tsan/. The
# ctest args above apply there too. About 28 minutes on two cores, most of it
# the two builds; skip with SIPHON_SKIP_SANITIZE=1.
if [ "${SIPHON_SKIP_SANITIZE:-0}" != 1 ]; then
  bash scripts/sanitize.sh all "$@"
  phase "the sanitizer runs"
fi
