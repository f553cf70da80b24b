#!/usr/bin/env bash
# Puts the .proto files that siphon-agent's containerd client is generated from
# into a cache directory. They come from Debian's Go source packages, taken
# with `apt-get download` + `dpkg -x` (not installed: the containerd package
# alone would pull in ~40 Go source packages):
#   golang-github-containerd-containerd-dev  api/services/{tasks,containers}/v1,
#                                            api/types/{mount,metrics,descriptor}.proto,
#                                            api/types/task/task.proto
#   golang-github-gogo-protobuf-dev          gogoproto/gogo.proto (imported by all of them)
# The google/protobuf well-known types come from libprotobuf-dev (/usr/include).
#
# Usage: scripts/fetch-containerd-protos.sh [DEST]
#   DEST defaults to $SIPHON_PROTO_CACHE or /var/cache/siphon/containerd-protos.
# Idempotent: a DEST holding a complete copy (DEST/.complete) is left alone.
# scripts/install-deps.sh runs it; agent/runtime/CMakeLists.txt only reads
# DEST (-DSIPHON_CONTAINERD_PROTO_DIR, else $SIPHON_PROTO_CACHE, else the
# default) and stops with a message naming this script when it is missing.
set -euo pipefail

dest="${1:-${SIPHON_PROTO_CACHE:-/var/cache/siphon/containerd-protos}}"
if [ -f "$dest/.complete" ]; then
  exit 0
fi

pkgs=(golang-github-containerd-containerd-dev golang-github-gogo-protobuf-dev)
src_root=usr/share/gocode/src/github.com
files=(
  containerd/containerd/api/services/tasks/v1/tasks.proto
  containerd/containerd/api/services/containers/v1/containers.proto
  containerd/containerd/api/types/mount.proto
  containerd/containerd/api/types/metrics.proto
  containerd/containerd/api/types/descriptor.proto
  containerd/containerd/api/types/task/task.proto
  gogo/protobuf/gogoproto/gogo.proto
)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# apt-get download runs as the _apt user when it can: let it write here.
chmod 0777 "$work"
cd "$work"
if ! apt-get download -qq "${pkgs[@]}" 2>/dev/null; then
  # A machine whose package lists were never fetched (or are stale).
  if [ "$(id -u)" -ne 0 ]; then
    echo "fetch-containerd-protos: apt-get download ${pkgs[*]} failed; run" \
      "scripts/install-deps.sh as root (it runs apt-get update first)" >&2
    exit 1
  fi
  apt-get update -qq
  apt-get download -qq "${pkgs[@]}"
fi
for deb in *.deb; do
  dpkg -x "$deb" x
done

# Laid out as the files import each other: "github.com/containerd/containerd/
# api/types/mount.proto" and "gogoproto/gogo.proto".
stage="$work/stage"
for f in "${files[@]}"; do
  case "$f" in
    gogo/protobuf/*) to="$stage/${f#gogo/protobuf/}" ;;
    *) to="$stage/github.com/$f" ;;
  esac
  mkdir -p "$(dirname "$to")"
  cp "x/$src_root/$f" "$to"
done
for deb in *.deb; do
  dpkg-deb -f "$deb" Package Version | sed 's/^[^:]*: //' | paste -sd' ' >>"$stage/VERSIONS"
done
touch "$stage/.complete"

mkdir -p "$(dirname "$dest")"
rm -rf "$dest.tmp.$$"
cp -r "$stage" "$dest.tmp.$$"
rm -rf "$dest"
mv "$dest.tmp.$$" "$dest"
echo "fetch-containerd-protos: $dest ($(paste -sd';' "$dest/VERSIONS"))"
