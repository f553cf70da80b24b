#!/usr/bin/env bash
# Builds Siphon and runs its tests: unit tests, and privileged tests (which
# skip themselves with a reason when not run as root); then a short fuzzing
# pass; then the tests again under ASan/UBSan and TSan. That full run is what
# CI runs.
#
# Usage: scripts/test.sh [ctest args...]   e.g. scripts/test.sh -L unit
#        scripts/test.sh --quick [ctest args...]
#   --quick  for development: the build, the unit tests, and one short test
#            of each tests/privileged/<area> (the SMOKE list below); no
#            fuzzing, no sanitizers. A few minutes once built.
# Runnable from any directory.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh

# Each phase's end is printed with the seconds since the start (CI's time).
phase() { echo "test.sh: $1 done after ${SECONDS} s"; }
phase "installing dependencies"

quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j2
phase "the build"

if [ "$quick" = 1 ]; then
  # One short test per privileged area, as ctest names them (a
  # parameterised test's name ends in its "# GetParam() = ..." note, so
  # those are not anchored); keep one per
  # tests/privileged/<area> when an area is added).
  SMOKE=(
    'AgentEnvTest\.ReadyLineNamesTheTarget$'                      # agent
    'ProbeProgramTest\.CountsDatagramsQueuedToAttachedSocket$'    # bpf
    'CapsTest\.APartialStartingSetIsReportedNotAnError$'          # caps
    'CaptureTest\.AnUnknownInterfaceIsNotFound$'                  # capture
    'DnsTest\.ResolvesWhatOnlyThePodCanResolve$'                  # dns
    'ExecTest\.ReachesThePodsServicesByShortName$'                # exec
    'FailoverTest\.KilledAgentMovesTheStealToTheOtherReplica/sk_lookup'  # failover
    'FilesTest\.ReadsAFileThatExistsOnlyInThePodsRoot$'           # files
    'MountTest\.TheTreeIsTheTargetsAsToolsSeeIt$'                 # fuse
    'ReaperTest\.RemovesTheNamespacesOfDeadPidsOnly$'             # harness
    'HttpStealTest\.KeepAliveRequestsAreRoutedOneByOneOnOneConnection/sk_lookup'  # http_steal
    'AgentImageTest\.ImageEntrypointIsTheAgentAndThereIsNoShell$' # image
    'IsolationTest\.'                                             # isolation (its only test)
    'MirrorTest\.BothDirectionsOfAnHttpExchangeInOrder$'          # mirror
    'MirrorBpfTest\.UnmirroredPortGivesNothing$'                  # mirror_bpf
    'StealTakesTheApplicationFacingHop/istio_iptables'            # mesh
    'OutgoingTest\.AClosedPortIsAOneLineErrorAndExitOne$'         # outgoing
    'ContinuityTest\.StolenDownloadSurvivesAKilledTransport$'     # resume
    'ContainerdRuntimeTest\.InfoShowsContainerIdAndRuntime$'      # runtime
    'StealTest\.SecondSessionGetsPortBusy/sk_lookup_ipv4'         # steal
    'StealIptables\.StealsLocalConnectionsOfAddedPortsOnly/nft'  # steal_iptables
    'StealSkLookupTest\.SteeredPortReachesTheAgentFromEverywhere$'  # steal_sk_lookup
  )
  ctest --test-dir build --output-on-failure -j2 -L unit "$@"
  phase "the unit tests"
  ctest --test-dir build --output-on-failure -j2 -R "$(IFS='|'; echo "${SMOKE[*]}")" "$@"
  phase "the privileged smoke tests"
  exit 0
fi

# The sanitizer trees (scripts/sanitize.sh, clang) build in the background,
# niced, while the fuzzing pass and the tests run: the tests leave part of
# the two cores idle, and the builds are most of the run's CPU time. ASan
# builds first, then TSan; each writes its exit status to a file the
# foreground waits for. Skip both with SIPHON_SKIP_SANITIZE=1.
sanitize=1
[ "${SIPHON_SKIP_SANITIZE:-0}" = 1 ] && sanitize=0
san_state="build/sanitizer-builds"
builder=""
if [ "$sanitize" = 1 ]; then
  rm -rf "$san_state"
  mkdir -p "$san_state"
  # set -m: the builder gets its own process group (in this session, so
  # that nice still ranks it below the tests), which the trap can kill whole.
  set -m
  (
    for san in asan tsan; do
      rc=0
      nice -n 10 bash scripts/sanitize.sh --build-only "$san" \
        >"$san_state/$san.log" 2>&1 || rc=$?
      echo "$rc" >"$san_state/$san.rc"
      [ "$rc" = 0 ] || exit "$rc"
    done
  ) &
  builder=$!
  set +m
  # A failed phase ends the script: stop the builds with it.
  trap '[ -n "$builder" ] && kill -- "-$builder" 2>/dev/null || true' EXIT
fi

# wait_built SAN: waits for the background build of SAN; fails (printing its
# log's end) if it failed.
wait_built() {
  local rc_file="$san_state/$1.rc"
  while [ ! -f "$rc_file" ]; do
    if ! kill -0 "$builder" 2>/dev/null && [ ! -f "$rc_file" ]; then
      echo "test.sh: the $1 build stopped without a status" >&2
      tail -n 60 "$san_state/$1.log" >&2 || true
      return 1
    fi
    sleep 2
  done
  if [ "$(cat "$rc_file")" != 0 ]; then
    echo "test.sh: the $1 build failed:" >&2
    tail -n 60 "$san_state/$1.log" >&2
    return 1
  fi
  phase "the $1 build"
}

# A short, bounded libFuzzer pass over the parsers, the frame decoder and the
# handshake (clang build in build-fuzz/). Skip it with SIPHON_SKIP_FUZZ=1.
if [ "${SIPHON_SKIP_FUZZ:-0}" != 1 ]; then
  bash scripts/fuzz.sh --ci
  phase "fuzzing"
fi

# Three tests at once on two cores: the privileged tests spend half their
# time waiting (for agents to start, for timeouts they test); at -j2 a core
# was idle 47% of the time.
ctest --test-dir build --output-on-failure -j3 "$@"
phase "the tests"

# The same tests again under sanitizers: ASan+UBSan over every test in
# build-asan/, TSan over the unit tests in build-tsan/. The ctest args above
# apply there too.
if [ "$sanitize" = 1 ]; then
  wait_built asan
  rc=0
  bash scripts/sanitize.sh --test-only asan "$@" || rc=$?
  wait_built tsan
  bash scripts/sanitize.sh --test-only tsan "$@" || rc=$?
  builder=""
  phase "the sanitizer runs"
  exit "$rc"
fi
