#!/usr/bin/env bash
# Siphon demo: installs the dependencies, builds siphon-agent and siphon, then
# plays a pod and an operator on this machine:
#   1. a "pod": a network namespace of its own (loopback only) with a DNS
#      server (dnsmasq) and the application: busybox httpd in a root
#      directory of its own (chroot), with a known environment;
#   2. siphon-agent targeting that application by PID, on 127.0.0.1 with a
#      random token;
#   3. the siphon CLI asking the agent for `info` and `env`, reading a file
#      of the pod's root, resolving a name with the pod's DNS, and talking to
#      the pod's server from inside the pod;
#   4. `siphon steal`: the pod's port 8080 answered by a server on this
#      machine while it runs, by the pod's own server again after; and a
#      download through it that goes on, byte-exact, across a cut of the
#      CLI's connection to the agent (the session resumes);
#   5. two HTTP-filtered steals sharing the pod's port 8080: requests with
#      `x-user: alice` answered by alice's server, `x-user: bob` by bob's,
#      the others by the pod's own application;
#   6. `siphon exec`: a program on this machine that reaches a service only
#      the pod can reach, by its short name, sees the pod's environment and
#      hostname, and answers the pod's own traffic on port 8080 while it
#      runs.
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
dns_pid=""
agent_pid=""
steal_pid=""
steal_a_pid=""
steal_b_pid=""
mirror_pid=""
exec_pid=""
orders_pid=""
local_pid=""
local_a_pid=""
local_b_pid=""
curl_pid=""
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
  [ -n "$curl_pid" ] && stop "$curl_pid"
  [ -n "$steal_pid" ] && stop "$steal_pid"
  [ -n "$steal_a_pid" ] && stop "$steal_a_pid"
  [ -n "$steal_b_pid" ] && stop "$steal_b_pid"
  [ -n "$mirror_pid" ] && stop "$mirror_pid"
  [ -n "$exec_pid" ] && stop "$exec_pid"
  [ -n "$orders_pid" ] && stop "$orders_pid"
  [ -n "$local_pid" ] && stop "$local_pid"
  [ -n "$local_a_pid" ] && stop "$local_a_pid"
  [ -n "$local_b_pid" ] && stop "$local_b_pid"
  [ -n "$agent_pid" ] && stop "$agent_pid"
  [ -n "$pod_pid" ] && stop "$pod_pid"
  [ -n "$dns_pid" ] && stop "$dns_pid"
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
step "A pod: network namespace $netns, its DNS server and its application"
ip netns add "$netns"
netns_created=1
ip -n "$netns" link set lo up

# The application's root: busybox and a web page, and the resolver settings
# a Kubernetes pod gets (its DNS server, search domains, ndots).
rootfs="$tmp/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/www"
cp /bin/busybox "$rootfs/bin/busybox"
printf 'Hello from the demo-shop pod\n' >"$rootfs/www/index.html"
printf 'nameserver 127.0.0.1\nsearch demo-shop.svc.cluster.local svc.cluster.local\noptions ndots:5\n' \
  >"$rootfs/etc/resolv.conf"
printf '127.0.0.1 localhost\n' >"$rootfs/etc/hosts"
printf 'demo-shop-7d9f\n' >"$rootfs/etc/hostname"

# The pod's DNS server answers names that exist only in this pod.
ip netns exec "$netns" dnsmasq --keep-in-foreground --no-resolv --no-hosts \
  --listen-address=127.0.0.1 --bind-interfaces --port=53 --pid-file= --user=root \
  --address=/db.demo-shop.svc.cluster.local/10.96.0.15 \
  --address=/orders.demo-shop.svc.cluster.local/10.96.0.20 >"$tmp/dnsmasq.log" 2>&1 &
dns_pid=$!

# `ip netns exec`, `env` and `chroot` exec in place, so $! ends up being the
# PID of busybox httpd itself, in the namespace, in its root, with exactly
# this environment.
ip netns exec "$netns" env -i \
  APP_NAME=demo-shop \
  DATABASE_URL=postgres://db:5432/shop \
  LOG_LEVEL=debug \
  "$(command -v chroot)" "$rootfs" /bin/busybox httpd -f -p 127.0.0.1:8080 -h /www &
pod_pid=$!
for _ in $(seq 100); do
  [ "$(readlink "/proc/$pod_pid/root" 2>/dev/null)" = "$rootfs" ] &&
    ip netns exec "$netns" /bin/busybox nc -z 127.0.0.1 8080 2>/dev/null && break
  sleep 0.1
done
if [ "$(readlink "/proc/$pod_pid/root" 2>/dev/null)" != "$rootfs" ]; then
  echo "demo: the pod's application did not start" >&2
  exit 1
fi
echo "pod application: busybox httpd, PID $pod_pid, $(readlink "/proc/$pod_pid/ns/net"), root $rootfs"

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

step "Files of the pod's root (the host has no /www)"
show siphon fs ls /www
show siphon fs cat /www/index.html

step "DNS as the pod resolves it (search domains, the pod's dnsmasq)"
show siphon dns lookup db
printf '\033[36m$ %s\033[0m\n' "getent hosts db.demo-shop.svc.cluster.local   # on the host"
getent hosts db.demo-shop.svc.cluster.local || echo "(not resolvable on the host)"

step "An outgoing connection from inside the pod (127.0.0.1:8080 is the pod's own server)"
printf '\033[36m$ %s\033[0m\n' "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | siphon connect 127.0.0.1:8080"
printf 'GET / HTTP/1.0\r\n\r\n' | siphon connect 127.0.0.1:8080

step "Steal the pod's port 8080 to a server on this machine"
# The developer's side: a local web server on a free loopback port.
mkdir -p "$tmp/local-www"
printf 'Hello from the developer machine (stolen from the pod)\n' >"$tmp/local-www/index.html"
for local_port in $(seq 28080 28180); do
  ss -Htln "sport = :$local_port" | grep -q . || break
done
/bin/busybox httpd -f -p "127.0.0.1:$local_port" -h "$tmp/local-www" &
local_pid=$!
in_pod_curl() { ip netns exec "$netns" curl -sS --max-time 5 http://127.0.0.1:8080/; }
printf '\033[36m$ %s\033[0m\n' "curl http://127.0.0.1:8080/   # inside the pod, before"
in_pod_curl
printf '\033[36m$ %s\033[0m\n' "siphon steal --port 8080 --to 127.0.0.1:$local_port &"
# The binary itself, not the siphon() function: a function in the
# background is a subshell, and the signal below must reach the CLI.
"$cli_bin" --token-file "$token_file" steal --port 8080 --to "127.0.0.1:$local_port" \
  2>"$tmp/steal.log" &
steal_pid=$!
for _ in $(seq 100); do
  grep -q 'stealing port' "$tmp/steal.log" && break
  kill -0 "$steal_pid" 2>/dev/null || break
  sleep 0.1
done
cat "$tmp/steal.log"
printf '\033[36m$ %s\033[0m\n' "curl http://127.0.0.1:8080/   # inside the pod, while stealing"
in_pod_curl

# Continuity: a 48 MiB download through the steal while the connection
# between the CLI and the agent is killed (ss -K, as a network blip would):
# the CLI reconnects and resumes the session, and the download completes
# byte-exact.
head -c $((48 << 20)) /dev/urandom >"$tmp/local-www/big.bin"
printf '\033[36m$ %s\033[0m\n' "curl --limit-rate 16M http://127.0.0.1:8080/big.bin   # inside the pod"
ip netns exec "$netns" curl -sS --max-time 60 --limit-rate 16M -o "$tmp/big.got" \
  http://127.0.0.1:8080/big.bin &
curl_pid=$!
sleep 1
agent_port="${listen##*:}"
printf '\033[36m$ %s\033[0m\n' "ss -K state established 'sport = :$agent_port'   # kill the agent's end of the CLI's connection, mid-download"
ss -K state established "sport = :$agent_port" 2>/dev/null | tail -n +2
wait "$curl_pid"
curl_pid=""
printf '\033[36m$ %s\033[0m\n' "sha256sum big.bin big.got"
(cd "$tmp" && sha256sum local-www/big.bin big.got)
cmp "$tmp/local-www/big.bin" "$tmp/big.got"
echo "the download went on across the cut, byte-exact; the CLI says:"
grep 'resumed' "$tmp/steal.log"

printf '\033[36m$ %s\033[0m\n' "kill -INT %siphon-steal"
kill -INT "$steal_pid"
wait "$steal_pid" && code=0 || code=$?
steal_pid=""
cat "$tmp/steal.log"
[ "$code" -eq 0 ]
printf '\033[36m$ %s\033[0m\n' "curl http://127.0.0.1:8080/   # inside the pod, after"
in_pod_curl

step "Two developers share the pod's port 8080: each steals only the requests with their header"
# Two local servers, one per developer, on free loopback ports.
free_port() {
  local p
  for p in $(seq "$1" $(($1 + 100))); do
    ss -Htln "sport = :$p" | grep -q . || { echo "$p"; return; }
  done
  return 1
}
mkdir -p "$tmp/alice-www" "$tmp/bob-www"
printf "Hello from alice's machine\n" >"$tmp/alice-www/index.html"
printf "Hello from bob's machine\n" >"$tmp/bob-www/index.html"
alice_port="$(free_port 28200)"
/bin/busybox httpd -f -p "127.0.0.1:$alice_port" -h "$tmp/alice-www" &
local_a_pid=$!
bob_port="$(free_port $((alice_port + 1)))"
/bin/busybox httpd -f -p "127.0.0.1:$bob_port" -h "$tmp/bob-www" &
local_b_pid=$!
for port in "$alice_port" "$bob_port"; do
  for _ in $(seq 50); do
    ss -Htln "sport = :$port" | grep -q . && break
    sleep 0.1
  done
done
# Waits for "stealing port" in a steal's log; fails if the CLI exits first.
wait_stealing() {
  local pid="$1" log="$2"
  for _ in $(seq 100); do
    grep -q 'stealing port' "$log" && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "demo: siphon steal did not start:" >&2
  cat "$log" >&2
  return 1
}
printf '\033[36m$ %s\033[0m\n' "siphon steal --port 8080 --to 127.0.0.1:$alice_port --filter-header 'x-user: ^alice\$' &   # alice"
"$cli_bin" --token-file "$token_file" --client-name alice steal --port 8080 \
  --to "127.0.0.1:$alice_port" --filter-header 'x-user: ^alice$' 2>"$tmp/steal-alice.log" &
steal_a_pid=$!
wait_stealing "$steal_a_pid" "$tmp/steal-alice.log"
cat "$tmp/steal-alice.log"
printf '\033[36m$ %s\033[0m\n' "siphon steal --port 8080 --to 127.0.0.1:$bob_port --filter-header 'x-user: ^bob\$' &   # bob"
"$cli_bin" --token-file "$token_file" --client-name bob steal --port 8080 \
  --to "127.0.0.1:$bob_port" --filter-header 'x-user: ^bob$' 2>"$tmp/steal-bob.log" &
steal_b_pid=$!
wait_stealing "$steal_b_pid" "$tmp/steal-bob.log"
cat "$tmp/steal-bob.log"
for user in alice bob carol ""; do
  if [ -n "$user" ]; then
    printf '\033[36m$ %s\033[0m\n' "curl -H 'x-user: $user' http://127.0.0.1:8080/   # inside the pod"
    got="$(ip netns exec "$netns" curl -sS --max-time 5 -H "x-user: $user" http://127.0.0.1:8080/)"
  else
    printf '\033[36m$ %s\033[0m\n' "curl http://127.0.0.1:8080/   # inside the pod, no header"
    got="$(in_pod_curl)"
  fi
  echo "$got"
  case "$user" in
    alice) want="Hello from alice's machine" ;;
    bob) want="Hello from bob's machine" ;;
    *) want="Hello from the demo-shop pod" ;;
  esac
  [ "$got" = "$want" ]
done
printf '\033[36m$ %s\033[0m\n' "kill -INT %siphon-steal-alice %siphon-steal-bob"
for pid in "$steal_a_pid" "$steal_b_pid"; do kill -INT "$pid"; done
wait "$steal_a_pid" && code_a=0 || code_a=$?
wait "$steal_b_pid" && code_b=0 || code_b=$?
steal_a_pid=""
steal_b_pid=""
echo "alice's steal:"
cat "$tmp/steal-alice.log"
echo "bob's steal:"
cat "$tmp/steal-bob.log"
[ "$code_a" -eq 0 ] && [ "$code_b" -eq 0 ]
printf '\033[36m$ %s\033[0m\n' "curl -H 'x-user: alice' http://127.0.0.1:8080/   # inside the pod, after"
ip netns exec "$netns" curl -sS --max-time 5 -H "x-user: alice" http://127.0.0.1:8080/

step "Mirror the pod's port 8080: a copy of each connection, the application keeps serving"
printf '\033[36m$ %s\033[0m\n' "siphon mirror --port 8080 --both &"
"$cli_bin" --token-file "$token_file" mirror --port 8080 --both \
  >"$tmp/mirror.out" 2>"$tmp/mirror.log" &
mirror_pid=$!
for _ in $(seq 100); do
  grep -q 'mirror: port' "$tmp/mirror.log" && break
  kill -0 "$mirror_pid" 2>/dev/null || break
  sleep 0.1
done
printf '\033[36m$ %s\033[0m\n' "curl http://127.0.0.1:8080/   # inside the pod: the application answers"
in_pod_curl
sleep 0.5
printf '\033[36m$ %s\033[0m\n' "kill -INT %siphon-mirror"
kill -INT "$mirror_pid"
wait "$mirror_pid" && code=0 || code=$?
mirror_pid=""
echo "stdout (both directions, with markers):"
cat "$tmp/mirror.out"
echo "stderr:"
cat "$tmp/mirror.log"
[ "$code" -eq 0 ]
grep -q 'GET / HTTP/1.1' "$tmp/mirror.out"

step "siphon exec: a program on this machine, as if it ran in the pod"
# A service only the pod reaches: 10.96.0.20 is an address of the pod's own
# loopback (a ClusterIP in a real cluster), named orders.demo-shop... by the
# pod's DNS. This machine has no route to it but its default one, and sends
# nothing there: the program's connections are made by the agent, in the pod.
ip -n "$netns" addr add 10.96.0.20/32 dev lo
mkdir -p "$tmp/orders-www"
printf 'orders service: 3 open orders\n' >"$tmp/orders-www/index.html"
ip netns exec "$netns" /bin/busybox httpd -f -p 10.96.0.20:80 -h "$tmp/orders-www" &
orders_pid=$!
for _ in $(seq 50); do
  ip netns exec "$netns" /bin/busybox nc -z 10.96.0.20 80 2>/dev/null && break
  sleep 0.1
done
printf '\033[36m$ %s\033[0m\n' "curl http://orders/   # on the host: not a name here"
curl -sS --max-time 2 http://orders/ 2>&1 | head -1 || true
show siphon exec -- sh -c 'curl -sS http://orders/; echo "APP_NAME=$APP_NAME on $(hostname)"'
# The same program answers the pod's port 8080 while it runs: a local web
# server, its connections stolen from the pod.
printf 'Hello from a program on the developer machine (siphon exec --steal)\n' \
  >"$tmp/local-www/exec.html"
printf '\033[36m$ %s\033[0m\n' "siphon exec --steal 8080:18080 -- python3 -m http.server 18080 --bind 127.0.0.1 &"
"$cli_bin" --token-file "$token_file" exec --steal 8080:18080 -- \
  /usr/bin/python3 -m http.server 18080 --bind 127.0.0.1 --directory "$tmp/local-www" \
  >"$tmp/exec.out" 2>"$tmp/exec.log" &
exec_pid=$!
for _ in $(seq 100); do
  grep -q 'stealing port 8080' "$tmp/exec.log" &&
    ip netns exec "$netns" curl -sf --max-time 2 http://127.0.0.1:8080/exec.html >/dev/null 2>&1 &&
    break
  kill -0 "$exec_pid" 2>/dev/null || break
  sleep 0.1
done
printf '\033[36m$ %s\033[0m\n' "curl http://127.0.0.1:8080/exec.html   # inside the pod"
ip netns exec "$netns" curl -sS --max-time 5 http://127.0.0.1:8080/exec.html
printf '\033[36m$ %s\033[0m\n' "kill -TERM %siphon-exec"
kill -TERM "$exec_pid"
wait "$exec_pid" && code=0 || code=$?
exec_pid=""
echo "siphon exec exited with $code (the program's code: 128+SIGTERM); its stderr:"
cat "$tmp/exec.log"
[ "$code" -eq 143 ]
printf '\033[36m$ %s\033[0m\n' "curl http://127.0.0.1:8080/   # inside the pod, after: the application again"
in_pod_curl

step "A wrong token is refused (exit code 4)"
echo wrong-token >"$tmp/wrong"
printf '\033[36m$ %s\033[0m\n' "siphon --token-file wrong env"
"$cli_bin" --token-file "$tmp/wrong" env && code=0 || code=$?
echo "exit code: $code"
[ "$code" -eq 4 ]

step "Agent log (stderr)"
cat "$tmp/agent.log"
