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
    'FailoverTest\.KilledAgentMovesTheStealToTheOtherReplica/sk_lookup'  # failover
    'FilesTest\.ReadsAFileThatExistsOnlyInThePodsRoot$'           # files
    'ReaperTest\.RemovesTheNamespacesOfDeadPidsOnly$'             # harness
    'HttpStealTest\.KeepAliveRequestsAreRoutedOneByOneOnOneConnection/sk_lookup'  # http_steal
    'AgentImageTest\.ImageEntrypointIsTheAgentAndThereIsNoShell$' # image
    'IsolationTest\.'                                             # isolation (its only test)
    'MirrorTest\.BothDirectionsOfAnHttpExchangeInOrder$'          # mirror
    'MirrorBpfTest\.UnmirroredPortGivesNothing$'                  # mirror_bpf
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
