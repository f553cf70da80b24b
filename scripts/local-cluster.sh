#!/usr/bin/env bash
# A Kubernetes cluster on this machine for Siphon's tests: an API server
# stand-in and two nodes that run pods as real containers, each node with
# its own containerd (scripts/local-cluster/, tests/cluster/README.md).
# Real kubectl works against it.
#
# Usage: scripts/local-cluster.sh up|down|status|node-down NODE|node-up NODE
#   up      starts whatever is not running (idempotent) and ends with three
#           lines: KUBECONFIG=PATH, AGENT_IMAGE=NAME, APP_IMAGE=NAME
#   down    stops everything and removes all it made: processes, containerd
#           state, mounts, network namespaces, links, routes, cgroups, the
#           state directory
#   status  says what runs
#   node-down NODE
#           the node vanishes (power loss, a kernel panic, a partition):
#           SIGKILL to its node agent (the kubelet) and to every process of
#           its containers, at once, no grace, no preStop; then what the node
#           lifecycle controller writes once the node's grace period (40 s)
#           is over, written at once: the node's conditions Unknown, its
#           pods Ready=False, the taints node.kubernetes.io/unreachable
#           NoSchedule and NoExecute. The taint manager then deletes the pods
#           that do not tolerate it, and those with tolerationSeconds that
#           long after; they stay Terminating (nobody can confirm they
#           stopped), and their controllers replace them elsewhere.
#           Not emulated: the node's containerd and shims keep running (their
#           containers are dead), its network namespaces, veths and pod IPs
#           stay until node-up, the 40 s grace itself, a Node object deleted
#           by a cloud controller (`kubectl delete node` does that).
#   node-up NODE
#           the node comes back: the unreachable taints go, its node agent
#           starts again, registers Ready and reconciles what it finds: pods
#           deleted meanwhile are cleaned up, Terminating ones finish, the
#           others get their containers restarted (restartPolicy) or fail
#           (Never).
#
# Root only. State (and the logs, in logs/) under $SIPHON_LOCAL_CLUSTER_DIR
# (default /var/lib/siphon-local-cluster).
#
# The agent image is built from this tree: from $SIPHON_AGENT_BIN (default
# build/agent/siphon-agent, with siphon-containerd beside it) by
# scripts/build-image.sh; when the binary is missing and build/ is a
# configured CMake tree, `cmake --build build --target siphon-agent` builds
# it first. The app image is scripts/build-test-image.sh's busybox image.
# Both are rebuilt only when their inputs change.
#
# Settings (environment):
#   SIPHON_LOCAL_CLUSTER_DIR   the state directory
#   SIPHON_LOCAL_CLUSTER_CIDR  the pods' addresses, a /16 (default
#                              10.244.0.0/16; node N gets 10.244.N.0/24)
#   SIPHON_AGENT_BIN           the siphon-agent binary for the agent image
#   SIPHON_LOCAL_CLUSTER_STREAM_IDLE_TIMEOUT
#                              seconds a port-forward may stay idle before
#                              the API server closes it (default 14400, the
#                              kubelet's); read when the API server starts
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog="local-cluster"
state="${SIPHON_LOCAL_CLUSTER_DIR:-/var/lib/siphon-local-cluster}"
cidr="${SIPHON_LOCAL_CLUSTER_CIDR:-10.244.0.0/16}"
nodes=(local-node-1 local-node-2)
bridge="slc0"
cgroup_root="siphon-local-cluster"
py="/usr/bin/python3"
[ -x "$py" ] || py="python3"
pkg="$repo/scripts/local-cluster"

die() {
  echo "$prog: $*" >&2
  exit 1
}
note() { echo "$prog: $*" >&2; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it starts containerd and makes network namespaces)"
case "$state" in
  /*) ;;
  *) die "SIPHON_LOCAL_CLUSTER_DIR must be an absolute path" ;;
esac

# A pid file's process, if it is alive and is what we started (its cmdline
# holds the marker).
alive() {
  local pidfile="$1" marker="$2" pid
  [ -f "$pidfile" ] || return 1
  pid="$(cat "$pidfile" 2>/dev/null)" || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$marker" || return 1
  echo "$pid"
}

# Starts a daemon in its own session, output to LOG, pid in PIDFILE; waits
# until the pid runs the daemon's own command line (not yet the forked
# shell), so that alive() can tell it from a pid reused by another program.
daemon() {
  local pidfile="$1" logfile="$2" pid i
  shift 2
  setsid "$@" </dev/null >>"$logfile" 2>&1 &
  pid=$!
  echo "$pid" >"$pidfile"
  for ((i = 0; i < 50; i++)); do
    [ -r "/proc/$pid/cmdline" ] || return 0
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "${*: -2}" && return 0
    sleep 0.02
  done
}

# Sends SIGTERM, waits up to SECONDS, then SIGKILL.
stop_pid() {
  local pid="$1" secs="$2" i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < secs * 10; i++)); do
    [ -d "/proc/$pid" ] || return 0
    grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null && return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

node_dir() { echo "$state/nodes/$1"; }
node_sock() { echo "$(node_dir "$1")/host/run/containerd/containerd.sock"; }
node_cidr() {
  local i="$1" base
  base="${cidr%/*}"
  IFS=. read -r a b _ _ <<<"$base"
  echo "$a.$b.$i.0/24"
}

need_tools() {
  local t
  for t in containerd ctr runc containerd-shim-runc-v2 ip openssl unshare mount setsid; do
    command -v "$t" >/dev/null || die "$t is not installed (scripts/install-deps.sh installs it)"
  done
  "$py" -c 'import ssl, asyncio' 2>/dev/null || die "$py cannot run the cluster (python3 with ssl)"
}

# ------------------------------------------------------------------ images
agent_image() {
  local bin="${SIPHON_AGENT_BIN:-$repo/build/agent/siphon-agent}" helper stamp tar name
  if [ ! -x "$bin" ] && [ -z "${SIPHON_AGENT_BIN:-}" ] && [ -f "$repo/build/build.ninja" ]; then
    note "building siphon-agent (cmake --build build --target siphon-agent)"
    cmake --build "$repo/build" --target siphon-agent >&2 || die "building siphon-agent failed"
  fi
  [ -x "$bin" ] || die "no agent binary at $bin: configure and build this tree (cmake -S . -B build -G Ninja && cmake --build build --target siphon-agent) or set SIPHON_AGENT_BIN"
  helper="$(dirname "$bin")/siphon-containerd"
  stamp="$( (sha256sum "$bin" "$helper" "$repo/scripts/build-image.sh" "$repo/scripts/lib/oci-layout.sh") | sha256sum | cut -c1-16)"
  tar="$state/images/agent-$stamp.tar"
  if [ ! -f "$tar" ]; then
    rm -f "$state"/images/agent-*.tar
    "$repo/scripts/build-image.sh" --agent "$bin" "$tar" >&2 || die "building the agent image failed"
  fi
  name="$("$py" -c 'import json,sys,tarfile
t=tarfile.open(sys.argv[1]); i=json.load(t.extractfile("index.json"))
print(i["manifests"][0]["annotations"]["io.containerd.image.name"])' "$tar")"
  echo "$tar $name"
}

app_image() {
  local stamp tar name="docker.io/siphon-test/busybox:1"
  stamp="$( (sha256sum /bin/busybox "$repo/scripts/build-test-image.sh" "$repo/scripts/lib/oci-layout.sh") | sha256sum | cut -c1-16)"
  tar="$state/images/app-$stamp.tar"
  if [ ! -f "$tar" ]; then
    rm -f "$state"/images/app-*.tar
    "$repo/scripts/build-test-image.sh" "$tar" "$name" >&2 || die "building the app image failed"
  fi
  echo "$tar $name"
}

# The manifest digest an image tar holds.
tar_digest() {
  "$py" -c 'import json,sys,tarfile
t=tarfile.open(sys.argv[1]); print(json.load(t.extractfile("index.json"))["manifests"][0]["digest"])' "$1"
}

import_image() {
  local n="$1" tar="$2" name="$3" sock have want
  sock="$(node_sock "$n")"
  want="$(tar_digest "$tar")"
  have="$(ctr -a "$sock" -n k8s.io images ls 2>/dev/null | awk -v n="$name" '$1 == n {print $3}')"
  if [ "$have" != "$want" ]; then
    ctr -a "$sock" -n k8s.io images import "$tar" >/dev/null ||
      die "importing $name into $n's containerd failed"
  fi
}

# ------------------------------------------------------------------ pki
make_pki() {
  local pki="$state/pki"
  mkdir -p "$pki"
  chmod 0700 "$pki"
  if [ ! -f "$pki/ca.crt" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 3650 -subj /CN=siphon-local-cluster-ca \
      2>/dev/null || die "openssl: making the CA failed"
  fi
  if [ ! -f "$pki/apiserver.crt" ]; then
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" -subj /CN=kube-apiserver \
      2>/dev/null || die "openssl: making the server key failed"
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n' >"$pki/ext.cnf"
    openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
      -CAcreateserial -out "$pki/apiserver.crt" -days 3650 -extfile "$pki/ext.cnf" \
      2>/dev/null || die "openssl: signing the server certificate failed"
  fi
  if [ ! -f "$pki/tokens.csv" ]; then
    local admin restricted
    admin="$(openssl rand -hex 24)"
    restricted="$(openssl rand -hex 24)"
    {
      echo "$admin,admin,uid-admin,system:masters"
      echo "$restricted,siphon-restricted,uid-siphon-restricted,"
      for n in "${nodes[@]}"; do
        echo "$(openssl rand -hex 24),system:node:$n,uid-$n,system:nodes"
      done
    } >"$pki/tokens.csv.tmp"
    chmod 0600 "$pki/tokens.csv.tmp"
    mv "$pki/tokens.csv.tmp" "$pki/tokens.csv"
  fi
  for n in "${nodes[@]}"; do
    grep ",system:node:$n," "$pki/tokens.csv" | cut -d, -f1 >"$pki/$n.token"
    chmod 0600 "$pki/$n.token"
  done
}

write_kubeconfig() {
  local port="$1" pki="$state/pki" admin restricted
  admin="$(grep ',admin,' "$pki/tokens.csv" | cut -d, -f1)"
  restricted="$(grep ',siphon-restricted,' "$pki/tokens.csv" | cut -d, -f1)"
  cat >"$state/kubeconfig.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: siphon-local
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: siphon-local-admin
  user:
    token: $admin
- name: siphon-local-restricted
  user:
    token: $restricted
contexts:
- name: siphon-local
  context:
    cluster: siphon-local
    user: siphon-local-admin
    namespace: default
- name: siphon-local-restricted
  context:
    cluster: siphon-local
    user: siphon-local-restricted
    namespace: default
current-context: siphon-local
EOF
  chmod 0600 "$state/kubeconfig.tmp"
  mv "$state/kubeconfig.tmp" "$state/kubeconfig"
}

# ------------------------------------------------------------------ up
check_cidr() {
  local line
  while read -r line; do
    case "$line" in
      *" dev $bridge "*) continue ;;
    esac
    local dst="${line%% *}"
    [ "$dst" = "default" ] && continue
    if "$py" - "$dst" "$cidr" <<'EOF'
import ipaddress, sys
a = ipaddress.ip_network(sys.argv[1], strict=False)
b = ipaddress.ip_network(sys.argv[2], strict=False)
sys.exit(0 if a.overlaps(b) else 1)
EOF
    then
      die "the pod CIDR $cidr overlaps this machine's route \"$line\"; set SIPHON_LOCAL_CLUSTER_CIDR to a free /16"
    fi
  done < <(ip -4 route show)
}

start_apiserver() {
  local pidfile="$state/apiserver.pid" old=0 port=0 attempt i pid
  if alive "$pidfile" "lcluster apiserver" >/dev/null; then
    return 0
  fi
  [ -f "$state/apiserver.port" ] && old="$(cat "$state/apiserver.port")"
  port="$old"
  for attempt in 1 2; do
    rm -f "$state/apiserver.port.new"
    daemon "$pidfile" "$state/logs/apiserver.log" env PYTHONPATH="$pkg" "$py" -m lcluster \
      apiserver --port "$port" --port-file "$state/apiserver.port.new" \
      --tokens "$state/pki/tokens.csv" --cert "$state/pki/apiserver.crt" \
      --key "$state/pki/apiserver.key" --data "$state/objects.json" \
      --stream-idle-timeout "${SIPHON_LOCAL_CLUSTER_STREAM_IDLE_TIMEOUT:-14400}"
    pid="$(cat "$pidfile")"
    for ((i = 0; i < 100; i++)); do
      [ -f "$state/apiserver.port.new" ] && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    [ -f "$state/apiserver.port.new" ] && break
    if ! kill -0 "$pid" 2>/dev/null && [ "$port" != 0 ] &&
      tail -5 "$state/logs/apiserver.log" | grep -q "address already in use"; then
      # Its old port is taken now: any port, and the nodes restart to
      # learn it (they keep their pods).
      port=0
      continue
    fi
    kill -0 "$pid" 2>/dev/null && die "the API server did not start (see $state/logs/apiserver.log)"
    die "the API server exited at start-up: $(tail -5 "$state/logs/apiserver.log")"
  done
  mv "$state/apiserver.port.new" "$state/apiserver.port"
  if [ "$old" != 0 ] && [ "$(cat "$state/apiserver.port")" != "$old" ]; then
    local n
    for n in "${nodes[@]}"; do
      pid="$(alive "$(node_dir "$n")/node.pid" "lcluster node --name $n ")" && stop_pid "$pid" 10
    done
  fi
}

start_containerd() {
  local n="$1" d sock pidfile
  d="$(node_dir "$n")"
  sock="$(node_sock "$n")"
  pidfile="$d/containerd.pid"
  mkdir -p "$d/containerd" "$(dirname "$sock")"
  if alive "$pidfile" "$d/containerd/config.toml" >/dev/null; then
    return 0
  fi
  cat >"$d/containerd/config.toml" <<EOF
version = 2
root = "$d/containerd/root"
state = "$d/containerd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/containerd/opt"
EOF
  daemon "$pidfile" "$state/logs/$n-containerd.log" containerd --config "$d/containerd/config.toml"
  local i
  for ((i = 0; i < 100; i++)); do
    [ -S "$sock" ] && ctr -a "$sock" version >/dev/null 2>&1 && return 0
    alive "$pidfile" "$d/containerd/config.toml" >/dev/null ||
      die "containerd of $n exited at start-up: $(tail -5 "$state/logs/$n-containerd.log")"
    sleep 0.1
  done
  die "containerd of $n never listened on $sock"
}

start_node() {
  local n="$1" i="$2" d port
  d="$(node_dir "$n")"
  port="$(cat "$state/apiserver.port")"
  if alive "$d/node.pid" "lcluster node --name $n " >/dev/null; then
    return 0
  fi
  daemon "$d/node.pid" "$state/logs/$n.log" env PYTHONPATH="$pkg" "$py" -m lcluster node \
    --name "$n" --dir "$d" --server "https://127.0.0.1:$port" --ca "$state/pki/ca.crt" \
    --token-file "$state/pki/$n.token" --pod-cidr "$(node_cidr "$i")" --cluster-cidr "$cidr" \
    --bridge "$bridge" --containerd-socket "$(node_sock "$n")" \
    --cgroup-parent "/$cgroup_root/$n"
}

wait_nodes_ready() {
  local port i out
  port="$(cat "$state/apiserver.port")"
  for ((i = 0; i < 300; i++)); do
    out="$(PYTHONPATH="$pkg" "$py" -m lcluster nodes --server "https://127.0.0.1:$port" \
      --ca "$state/pki/ca.crt" --token-file "$state/pki/${nodes[0]}.token" 2>/dev/null || true)"
    local ok=1 n
    for n in "${nodes[@]}"; do
      grep -q "^$n Ready" <<<"$out" || ok=0
    done
    [ "$ok" = 1 ] && return 0
    for n in "${nodes[@]}"; do
      kill -0 "$(cat "$(node_dir "$n")/node.pid")" 2>/dev/null ||
        die "node $n exited: $(tail -5 "$state/logs/$n.log")"
    done
    sleep 0.1
  done
  die "the nodes did not become Ready (see $state/logs/)"
}

cmd_up() {
  need_tools
  mkdir -p "$state/logs" "$state/images" "$state/nodes"
  [ -f "$state/run-containerd-existed" ] ||
    { [ -e /run/containerd ] && echo 1 || echo 0; } >"$state/run-containerd-existed"
  check_cidr
  local sock_len
  sock_len="$(node_sock "${nodes[0]}").ttrpc"
  [ "${#sock_len}" -lt 100 ] || die "$state is too long a path for containerd's sockets"
  make_pki
  local agent app
  agent="$(agent_image)"
  app="$(app_image)"
  start_apiserver
  write_kubeconfig "$(cat "$state/apiserver.port")"
  local i=1 n
  for n in "${nodes[@]}"; do
    start_containerd "$n"
    import_image "$n" "${agent%% *}" "${agent#* }"
    import_image "$n" "${app%% *}" "${app#* }"
    start_node "$n" "$i"
    i=$((i + 1))
  done
  wait_nodes_ready
  echo "KUBECONFIG=$state/kubeconfig"
  echo "AGENT_IMAGE=${agent#* }"
  echo "APP_IMAGE=${app#* }"
}

# ------------------------------------------------------------------ down
cmd_down() {
  [ -d "$state" ] || { note "nothing to remove ($state does not exist)"; return 0; }
  local n d pid
  # The nodes first: each stops its pods' containers and removes their
  # network namespaces as it leaves.
  for n in "${nodes[@]}"; do
    d="$(node_dir "$n")"
    pid="$(alive "$d/node.pid" "lcluster node --name $n ")" && stop_pid "$pid" 30
  done
  pid="$(alive "$state/apiserver.pid" "lcluster apiserver")" && stop_pid "$pid" 5
  for n in "${nodes[@]}"; do
    d="$(node_dir "$n")"
    local sock
    sock="$(node_sock "$n")"
    if [ -S "$sock" ] && ctr -a "$sock" version >/dev/null 2>&1; then
      local c
      for c in $(ctr -a "$sock" -n k8s.io containers ls -q 2>/dev/null); do
        ctr -a "$sock" -n k8s.io task kill -s SIGKILL "$c" >/dev/null 2>&1 || true
        ctr -a "$sock" -n k8s.io task delete --force "$c" >/dev/null 2>&1 || true
        ctr -a "$sock" -n k8s.io containers delete "$c" >/dev/null 2>&1 || true
      done
    fi
    pid="$(alive "$d/containerd.pid" "$d/containerd/config.toml")" && stop_pid "$pid" 10
    # Shims started for this containerd, and container processes left in
    # the node's cgroups.
    local p
    for p in /proc/[0-9]*; do
      [ -r "$p/cmdline" ] || continue
      if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q "containerd-shim.*$sock"; then
        kill -KILL "${p#/proc/}" 2>/dev/null || true
      elif grep -q "/$cgroup_root/$n/" "$p/cgroup" 2>/dev/null; then
        kill -KILL "${p#/proc/}" 2>/dev/null || true
      fi
    done
    if [ -d "$d/runc" ]; then
      local id
      for id in $(runc --root "$d/runc" list -q 2>/dev/null); do
        runc --root "$d/runc" delete --force "$id" >/dev/null 2>&1 || true
      done
    fi
  done
  # Mounts under the state directory (rootfs overlays, tmpfs volumes, IPC
  # namespaces), deepest first.
  local mp
  while read -r mp; do
    umount -l "$mp" 2>/dev/null || true
  done < <(awk -v d="$state" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo |
    awk '{print length($0) " " $0}' | sort -rn | cut -d' ' -f2-)
  # Network: the pods' namespaces and veths, the bridge (its addresses and
  # routes go with it).
  if [ -d /run/netns ]; then
    local ns
    for ns in /run/netns/slc-*; do
      [ -e "$ns" ] && ip netns del "$(basename "$ns")" 2>/dev/null || true
    done
  fi
  local link
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^slcv' || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link show "$bridge" >/dev/null 2>&1 && ip link del "$bridge" 2>/dev/null || true
  # Cgroups, deepest first, in every hierarchy.
  local root
  for root in /sys/fs/cgroup /sys/fs/cgroup/*; do
    [ -d "$root/$cgroup_root" ] || continue
    find "$root/$cgroup_root" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # containerd 1.6 puts its shims' sockets in /run/containerd whatever its
  # state directory: remove what is left of it if it was not there before.
  if [ "$(cat "$state/run-containerd-existed" 2>/dev/null || echo 1)" = 0 ]; then
    rmdir /run/containerd/s /run/containerd/fifo /run/containerd/runc/k8s.io \
      /run/containerd/runc /run/containerd 2>/dev/null || true
  fi
  # kubectl's discovery cache for this cluster's address.
  if [ -f "$state/apiserver.port" ]; then
    rm -rf "${HOME:-/root}/.kube/cache/discovery/127.0.0.1_$(cat "$state/apiserver.port")"
  fi
  if awk -v d="$state" 'index($5, d) == 1 {found=1} END {exit !found}' /proc/self/mountinfo; then
    die "mounts are left under $state; not removing it"
  fi
  rm -rf "$state"
  note "removed"
}

# ------------------------------------------------------------------ node-down, node-up
node_index() {
  local i=1 n
  for n in "${nodes[@]}"; do
    [ "$n" = "$1" ] && { echo "$i"; return 0; }
    i=$((i + 1))
  done
  die "no node $1 (nodes: ${nodes[*]})"
}

lcluster_helper() {
  PYTHONPATH="$pkg" "$py" -m lcluster "$1" --name "$2" \
    --server "https://127.0.0.1:$(cat "$state/apiserver.port")" --ca "$state/pki/ca.crt" \
    --token-file "$state/pki/$2.token"
}

cmd_node_down() {
  local n="$1" d pid p
  node_index "$n" >/dev/null
  alive "$state/apiserver.pid" "lcluster apiserver" >/dev/null || die "the cluster is not up"
  d="$(node_dir "$n")"
  if pid="$(alive "$d/node.pid" "lcluster node --name $n ")"; then
    kill -KILL "$pid"
    while [ -d "/proc/$pid" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; do
      sleep 0.05
    done
  fi
  # Every process of the node's containers: they live in its cgroups.
  for p in /proc/[0-9]*; do
    if grep -q "/$cgroup_root/$n/" "$p/cgroup" 2>/dev/null; then
      kill -KILL "${p#/proc/}" 2>/dev/null || true
    fi
  done
  lcluster_helper node-lost "$n" || die "marking $n unreachable failed"
  note "$n is down: NotReady (Unknown), node.kubernetes.io/unreachable:NoExecute"
}

cmd_node_up() {
  local n="$1" i
  i="$(node_index "$n")"
  alive "$state/apiserver.pid" "lcluster apiserver" >/dev/null || die "the cluster is not up"
  lcluster_helper node-back "$n" || die "removing the unreachable taints of $n failed"
  start_containerd "$n"
  start_node "$n" "$i"
  wait_nodes_ready
  note "$n is up"
}

# ------------------------------------------------------------------ status
cmd_status() {
  if [ ! -d "$state" ]; then
    echo "not running ($state does not exist)"
    return 0
  fi
  local pid n d
  if pid="$(alive "$state/apiserver.pid" "lcluster apiserver")"; then
    echo "apiserver: running (pid $pid) on https://127.0.0.1:$(cat "$state/apiserver.port" 2>/dev/null)"
  else
    echo "apiserver: not running"
  fi
  for n in "${nodes[@]}"; do
    d="$(node_dir "$n")"
    local a="not running" c="not running"
    pid="$(alive "$d/node.pid" "lcluster node --name $n ")" && a="running (pid $pid)"
    pid="$(alive "$d/containerd.pid" "$d/containerd/config.toml")" && c="running (pid $pid)"
    echo "$n: agent $a, containerd $c, pods $(node_cidr "${n##*-}")"
  done
  if alive "$state/apiserver.pid" "lcluster apiserver" >/dev/null; then
    PYTHONPATH="$pkg" "$py" -m lcluster nodes --server "https://127.0.0.1:$(cat "$state/apiserver.port")" \
      --ca "$state/pki/ca.crt" --token-file "$state/pki/${nodes[0]}.token" 2>/dev/null |
      sed 's/^/node /' || true
    echo "KUBECONFIG=$state/kubeconfig"
  fi
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  node-down | node-up)
    [ $# -eq 2 ] || die "usage: scripts/local-cluster.sh $1 NODE"
    if [ "$1" = node-down ]; then cmd_node_down "$2"; else cmd_node_up "$2"; fi
    ;;
  *)
    echo "usage: scripts/local-cluster.sh up|down|status|node-down NODE|node-up NODE" >&2
    exit 2
    ;;
esac
