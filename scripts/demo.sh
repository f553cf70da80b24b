#!/usr/bin/env bash
# Siphon demo: installs the dependencies, builds siphon-agent and siphon, then
# plays a pod and an operator on this machine:
#   1. a "pod": a process with a known environment in a network namespace of
#      its own (loopback only);
#   2. siphon-agent targeting that process by PID, on 127.0.0.1 with a random
#      token;
#   3. the siphon CLI asking the agent for `info` and `env`.
# Everything it creates (namespace, processes, temporary files) is removed on
# exit, on failure and on Ctrl-C too.
#
# Usage: sudo scripts/demo.sh          (runnable from any directory)
# SIPHON_BUILD_DIR picks another build directory than build/.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$(pwd)"
build="${SIPHON_BUILD_DIR:-build}"

if [ "$(id -u)" -ne 0 ]; then
  echo "demo: needs root (network namespaces; the agent reads another process's /proc/PID)" >&2
  echo "demo: run: sudo $0" >&2
  exit 1
fi

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() {
  # Prints a command as a user would type it (quoting what the shell would
  # expand), then runs it.
  local line="" a
  for a in "$@"; do
    case "$a" in
      *[!A-Za-z0-9_./:=,-]*) line+=" '$a'" ;;
      *) line+=" $a" ;;
    esac
  done
  printf '\033[36m$%s\033[0m\n' "$line"
  "$@"
}

step "Dependencies"
bash scripts/install-deps.sh

step "Build (${build}/)"
cmake -S . -B "$build" -G Ninja
ninja -C "$build" siphon-agent siphon
agent_bin="$root/$build/agent/siphon-agent"
cli_bin="$root/$build/layer-protocol/cli/siphon"

# ---------------------------------------------------------------- clean-up
netns="siphon-demo-$$-$(head -c 3 /dev/urandom | od -An -tx1 | tr -d ' \n')"
netns_created=0
pod_pid=""
agent_pid=""
tmp="$(mktemp -d /tmp/siphon-demo.XXXXXX)"

stop() {
  # SIGTERM, then SIGKILL if it has not exited within 5 s; always reaped.
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  [ -n "$agent_pid" ] && stop "$agent_pid"
  [ -n "$pod_pid" ] && stop "$pod_pid"
  [ "$netns_created" -eq 1 ] && ip netns del "$netns"
  rm -rf "$tmp"
  if [ "$rc" -ne 0 ]; then
    echo "demo: failed (exit $rc); everything it created has been removed" >&2
  else
    echo
    echo "demo: done; agent, pod process, namespace $netns and temporary files removed"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- the pod
step "A pod: network namespace $netns with a process in it"
ip netns add "$netns"
netns_created=1
ip -n "$netns" link set lo up
# `ip netns exec` and `env` exec in place, so $! ends up being the PID of
# sleep itself, running in the namespace with exactly this environment.
ip netns exec "$netns" env -i \
  APP_NAME=demo-shop \
  DATABASE_URL=postgres://db:5432/shop \
  LOG_LEVEL=debug \
  /bin/sleep 3600 &
pod_pid=$!
for _ in $(seq 100); do
  [ "$(cat "/proc/$pod_pid/comm" 2>/dev/null)" = sleep ] && break
  sleep 0.1
done
if [ "$(cat "/proc/$pod_pid/comm" 2>/dev/null)" != sleep ]; then
  echo "demo: the pod process did not start" >&2
  exit 1
fi
echo "pod process: PID $pod_pid, $(readlink "/proc/$pod_pid/ns/net")"

# ---------------------------------------------------------------- the agent
step "siphon-agent targeted --pid $pod_pid"
token_file="$tmp/token"
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token_file")
# The agent's own environment must not show up in `siphon env`: mark it.
SIPHON_DEMO_AGENT_ONLY=1 "$agent_bin" --listen 127.0.0.1:0 --token-file "$token_file" \
  targeted --pid "$pod_pid" >"$tmp/ready" 2>"$tmp/agent.log" &
agent_pid=$!
for _ in $(seq 300); do
  grep -q '^siphon-agent ready ' "$tmp/ready" 2>/dev/null && break
  if ! kill -0 "$agent_pid" 2>/dev/null; then
    wait "$agent_pid" && code=0 || code=$?
    agent_pid=""
    echo "demo: siphon-agent exited with code $code before it was ready; its log:" >&2
    cat "$tmp/agent.log" >&2
    exit 1
  fi
  sleep 0.1
done
ready="$(grep '^siphon-agent ready ' "$tmp/ready" || true)"
if [ -z "$ready" ]; then
  echo "demo: no ready line from siphon-agent; its log:" >&2
  cat "$tmp/agent.log" >&2
  exit 1
fi
echo "$ready"
listen="$(sed -n 's/^siphon-agent ready .*listen=\([^ ]*\).*/\1/p' <<<"$ready")"

# ---------------------------------------------------------------- the CLI
export SIPHON_AGENT="$listen"
siphon() { "$cli_bin" --token-file "$token_file" "$@"; }

step "The CLI (SIPHON_AGENT=$listen, --token-file with the agent's token)"
show siphon info
echo
show siphon env
echo
show siphon env --include 'APP_*' --json

step "A wrong token is refused (exit code 4)"
echo wrong-token >"$tmp/wrong"
printf '\033[36m$ %s\033[0m\n' "siphon --token-file wrong env"
"$cli_bin" --token-file "$tmp/wrong" env && code=0 || code=$?
echo "exit code: $code"
[ "$code" -eq 4 ]

step "Agent log (stderr)"
cat "$tmp/agent.log"
