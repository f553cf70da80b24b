#!/usr/bin/env bash
# Builds in Release and runs the benchmarks; prints each fast-path figure as a
# ratio against its baseline from the same run. (The traffic benchmarks of
# issue 5 will join here.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIPHON_TESTS=OFF >/dev/null
ninja -C build-release codec_bench
mkdir -p bench/results
./build-release/bench/codec_bench --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true \
  --benchmark_out=bench/results/latest.json --benchmark_out_format=json
python3 - <<'PY'
import json
runs = json.load(open("bench/results/latest.json"))["benchmarks"]
med = {b["run_name"]: b["real_time"] for b in runs if b.get("aggregate_name") == "median"}
print("\n| scenario | fast path (ns) | generated classes (ns) | speed-up |")
print("|---|---|---|---|")
for name, t in sorted(med.items()):
    if "_FastPath/" not in name:
        continue
    base = med.get(name.replace("_FastPath/", "_Generated/"))
    if base:
        print(f"| {name.replace('_FastPath', '')} | {t:.0f} | {base:.0f} | {base / t:.1f}x |")
PY
