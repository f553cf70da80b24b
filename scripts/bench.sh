#!/usr/bin/env bash
# Siphon's benchmarks: builds in Release, sets up a client, a pod and a node
# network namespace, and measures every scenario of bench/README.md next to
# its baselines in the same run (direct, peer = iptables REDIRECT + two socat
# hops). Writes bench/results/latest.json and latest.md and prints the table.
#
# Usage: sudo scripts/bench.sh [--quick] [--only GROUP,...]
#   --quick   3 repetitions of 2 s (about 6 minutes once built), for development
#   --only    bulk,bulk8,http,short,filtered,idle,forward,startup,rss,services,mirror,isolation,mount,exec,handover,links,kube,workloads,codec
#   --links   RTT_MS:LOSS_PERCENT,... the links group's links (default 20:0,50:0,20:0.5,50:0.5)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "bench: run as root (network namespaces, BPF, iptables)" >&2
  exit 1
fi
bash scripts/install-deps.sh
# Load tools and baselines, only needed here (CI does not run the benchmarks).
# fio and ping: the mount group (random reads, the emulated link's RTT);
# dnsperf: the exec group.
bench_pkgs=(iperf3 wrk nginx-light python3 fio iputils-ping dnsperf)
missing=()
for p in "${bench_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

build=build-release
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIPHON_TESTS=OFF >/dev/null
ninja -C "$build" siphon-agent siphon service_bench codec_bench linkemu fuse_ceiling

args=("$@")
only=""
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[$i]}" = "--only" ] && only="${args[$((i + 1))]:-}"
done
if [ -z "$only" ] || [[ ",$only," == *",codec,"* ]]; then
  # The protocol's data-frame fast path against generated protobuf classes.
  "$build/bench/codec_bench" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_out=bench/results/codec.json --benchmark_out_format=json >/dev/null
fi
exec /usr/bin/python3 bench/run.py --build "$build" "$@"
