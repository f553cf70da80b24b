#!/usr/bin/env bash
# Builds the siphon-agent container image without a daemon: an OCI image
# layout (oci-layout, index.json, blobs/sha256/...) packed as a tar that
# `ctr -n k8s.io image import` (or `skopeo copy oci-archive:...`) reads, with
# the manifest.json of a docker-archive beside it, so `docker load` reads it
# too. It is the same image images/Dockerfile describes (same paths,
# entrypoint, env and labels), made from a binary built on this machine
# instead of in a builder stage, for hosts with no Docker engine. Like scripts/build-test-image.sh the
# layout is written with tar and sha256sum, byte for byte the same on every
# run for the same inputs (sorted names, fixed owners, modes and times).
#
# Content (one uncompressed layer, no shell):
#   /usr/local/bin/siphon-agent           the agent (debug sections stripped)
#   /usr/local/bin/siphon-containerd      its containerd (gRPC) helper, from
#     beside the agent binary
#   /usr/sbin/xtables-{nft,legacy}-multi   iptables for the fallback steal
#     backend, with the {ip,ip6}tables{,-nft,-legacy}{,-save,-restore}
#     symlinks (plain iptables* are the nft flavour, Debian's default)
#   /usr/lib/<triplet>/xtables/            the iptables extension modules
#   every shared library the above need (ldd), at its path, and the dynamic
#     loader; /lib, /lib64, /bin, /sbin as the host's merged-/usr symlinks
#   /etc/protocols, /etc/services (iptables resolves "tcp" through them),
#     /etc/passwd, /etc/group (root only)
#   /tmp (1777), /run, /var/run -> ../run, /proc, /sys, /dev mount points
# Config: Entrypoint ["/usr/local/bin/siphon-agent"], Cmd ["--help"],
#   Env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin,
#   User 0:0, labels org.opencontainers.image.{title,version,source,revision}.
#
# Usage: scripts/build-image.sh [--agent BIN] [--version V] [--source URL]
#                               OUT.tar [IMAGE_NAME]
#   --agent    default build/agent/siphon-agent (build it Release: cmake
#              -DCMAKE_BUILD_TYPE=Release; any build type works)
#   --version  default: what `BIN --version` prints
#   --source   default: the git remote "origin" of this checkout, else
#              "unknown"
#   IMAGE_NAME default docker.io/siphon/siphon-agent:VERSION (stored in the
#              index as io.containerd.image.name, which ctr uses as its name)
set -euo pipefail

# shellcheck source=lib/oci-layout.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/oci-layout.sh"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog="build-image"

die() {
  echo "$prog: $*" >&2
  exit 1
}
usage() {
  echo "usage: scripts/build-image.sh [--agent BIN] [--version V] [--source URL] OUT.tar [IMAGE_NAME]" >&2
  exit 2
}

agent="$repo/build/agent/siphon-agent"
version=""
source_url=""
positional=()
while [ $# -gt 0 ]; do
  case "$1" in
    --agent) [ $# -ge 2 ] || usage; agent="$2"; shift 2 ;;
    --agent=*) agent="${1#*=}"; shift ;;
    --version) [ $# -ge 2 ] || usage; version="$2"; shift 2 ;;
    --version=*) version="${1#*=}"; shift ;;
    --source) [ $# -ge 2 ] || usage; source_url="$2"; shift 2 ;;
    --source=*) source_url="${1#*=}"; shift ;;
    -h|--help) sed -n '2,35p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; positional+=("$@"); break ;;
    -*) echo "$prog: unknown option $1" >&2; usage ;;
    *) positional+=("$1"); shift ;;
  esac
done
[ "${#positional[@]}" -ge 1 ] && [ "${#positional[@]}" -le 2 ] || usage
out="${positional[0]}"

for tool in ldd readelf tar sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done

# ------------------------------------------------------------ the inputs
[ -e "$agent" ] || die "agent binary $agent does not exist (build it: cmake --build build --target siphon-agent, or pass --agent BIN)"
[ -f "$agent" ] || die "agent binary $agent is not a regular file"
[ -r "$agent" ] || die "agent binary $agent is not readable"
[ "$(head -c 4 "$agent" | tail -c 3)" = "ELF" ] || die "agent binary $agent is not an ELF executable"
LC_ALL=C readelf -h "$agent" 2>/dev/null | grep -Eq 'Type:[[:space:]]+(EXEC|DYN)' ||
  die "agent binary $agent is an ELF file but not an executable"
[ -x "$agent" ] || die "agent binary $agent is not executable (chmod +x)"
# siphon-containerd, which the agent runs to ask containerd (gRPC stays out
# of the agent), is built beside it.
helper="$(dirname "$agent")/siphon-containerd"
[ -x "$helper" ] || die "$helper is missing: it is built with siphon-agent (cmake --build build --target siphon-agent) and the agent needs it beside it for containerd"

if [ -z "$version" ]; then
  version="$("$agent" --version 2>/dev/null | head -n1 | tr -d '[:space:]')" ||
    die "$agent --version failed: is it siphon-agent, built for this machine?"
  [ -n "$version" ] || die "$agent --version printed nothing: is it siphon-agent?"
fi
case "$version" in
  *[!A-Za-z0-9._+-]*) die "version \"$version\" has characters an image tag cannot hold" ;;
esac
if [ -z "$source_url" ]; then
  source_url="$(git -C "$repo" remote get-url origin 2>/dev/null || true)"
  source_url="${source_url:-unknown}"
fi
revision="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
name="${positional[1]:-docker.io/siphon/siphon-agent:$version}"
case "$name" in
  *[[:space:]\"\\]*) die "image name \"$name\" may not hold spaces, quotes or backslashes" ;;
esac
case "$source_url" in
  *[\"\\]*) die "--source may not hold quotes or backslashes" ;;
esac

arch="$(oci_arch)" || die "unknown machine $(uname -m)"
# The binary must run here: its libraries are this host's.
machine="$(LC_ALL=C readelf -h "$agent" | sed -n 's/^ *Machine: *//p')"
case "$arch:$machine" in
  amd64:*X86-64*|arm64:*AArch64*|arm:*ARM*|ppc64le:*PowerPC64*|s390x:*S/390*|riscv64:*RISC-V*) ;;
  *) die "agent binary $agent is built for \"$machine\", not this $(uname -m) host" ;;
esac

# iptables, for the iptables steal backend (agent/steal/iptables/ runs
# {ip,ip6}tables-{nft,legacy}-{save,restore} found in /usr/sbin or PATH).
nft_multi=""
legacy_multi=""
for d in /usr/sbin /sbin; do
  [ -z "$nft_multi" ] && [ -x "$d/xtables-nft-multi" ] && nft_multi="$d/xtables-nft-multi"
  [ -z "$legacy_multi" ] && [ -x "$d/xtables-legacy-multi" ] && legacy_multi="$d/xtables-legacy-multi"
done
[ -n "$nft_multi" ] || die "xtables-nft-multi not found in /usr/sbin (apt-get install iptables)"
[ -n "$legacy_multi" ] || die "xtables-legacy-multi not found in /usr/sbin (apt-get install iptables)"
xtables_dir=""
for d in /usr/lib/*-linux-gnu*/xtables /usr/lib/xtables /lib/xtables; do
  if [ -d "$d" ]; then xtables_dir="$(readlink -f "$d")"; break; fi
done
[ -n "$xtables_dir" ] || die "the iptables extensions directory (/usr/lib/<triplet>/xtables) is missing"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs"

# ------------------------------------------------------------ the rootfs
# Merged /usr as on the host (Debian 12: /lib -> usr/lib, ...), so the
# loader's path in every binary (/lib64/ld-linux-x86-64.so.2) and ldd's
# paths resolve in the image as they do here.
for top in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$top" ]; then
    ln -s "$(readlink "/$top")" "$rootfs/$top"
  fi
done

# Copies a host file's content (symlinks followed) to the same path in the
# image, under the host's canonical directory (so /lib/x/libc.so.6 lands in
# /usr/lib/x/ when /lib -> usr/lib).
put_file() {
  local src="$1" mode="$2" dir dst
  dir="$(readlink -f "$(dirname "$src")")"
  dst="$rootfs$dir/$(basename "$src")"
  [ -e "$dst" ] && return 0
  mkdir -p "$rootfs$dir"
  cp -L "$src" "$dst"
  chmod "$mode" "$dst"
}

# Every library `ldd` names for the given files, and their loader (one ldd
# run for all of them: the xtables modules are over a hundred).
put_libs_of() {
  local out line path
  out="$(LC_ALL=C ldd "$@" 2>&1)" || die "ldd $*: $out"
  if grep -q 'not found' <<<"$out"; then
    die "ldd: a library is missing on this host:"$'\n'"$(grep -e 'not found' -e '^/.*:$' <<<"$out")"
  fi
  while IFS= read -r path; do
    [ -n "$path" ] && put_file "$path" 0755
  done < <(while IFS= read -r line; do
             case "$line" in
               *"=> /"*) path="${line#*=> }"; echo "${path%% (*}" ;;
               [[:space:]]/*) path="${line#"${line%%[![:space:]]*}"}"; echo "${path%% (*}" ;;
             esac
           done <<<"$out" | sort -u)
}

# The agent and its containerd helper, without debug sections (a
# RelWithDebInfo build is ~90 MB of DWARF); strip keeps the symbol table for
# stack traces.
mkdir -p "$rootfs/usr/local/bin"
for bin in "$agent" "$helper"; do
  if command -v strip >/dev/null; then
    strip --strip-debug -o "$rootfs/usr/local/bin/$(basename "$bin")" "$bin" ||
      die "strip --strip-debug $bin failed"
  else
    cp "$bin" "$rootfs/usr/local/bin/$(basename "$bin")"
  fi
  chmod 0755 "$rootfs/usr/local/bin/$(basename "$bin")"
done

mkdir -p "$rootfs/usr/sbin"
cp -L "$nft_multi" "$rootfs/usr/sbin/xtables-nft-multi"
cp -L "$legacy_multi" "$rootfs/usr/sbin/xtables-legacy-multi"
chmod 0755 "$rootfs/usr/sbin/xtables-nft-multi" "$rootfs/usr/sbin/xtables-legacy-multi"
for fam in iptables ip6tables; do
  for verb in "" -save -restore; do
    ln -s xtables-nft-multi "$rootfs/usr/sbin/$fam-nft$verb"
    ln -s xtables-legacy-multi "$rootfs/usr/sbin/$fam-legacy$verb"
    ln -s xtables-nft-multi "$rootfs/usr/sbin/$fam$verb"
  done
done
mkdir -p "$rootfs$xtables_dir"
for m in "$xtables_dir"/*.so; do
  [ -e "$m" ] || continue
  cp -L "$m" "$rootfs$xtables_dir/"
  chmod 0644 "$rootfs$xtables_dir/$(basename "$m")"
done
put_libs_of "$agent" "$helper" "$nft_multi" "$legacy_multi" "$xtables_dir"/*.so
# Library content is mode 0644 except the loader, which must be executable.
find "$rootfs" -type f -name '*.so*' -exec chmod 0644 {} +
while IFS= read -r interp; do
  [ -n "$interp" ] && chmod 0755 "$rootfs$(readlink -f "$(dirname "$interp")")/$(basename "$interp")"
done < <(LC_ALL=C readelf -l "$agent" "$nft_multi" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p' | sort -u)

mkdir -p "$rootfs/etc"
for f in /etc/protocols /etc/services; do
  if [ -f "$f" ]; then
    cp "$f" "$rootfs$f"
    chmod 0644 "$rootfs$f"
  else
    echo "$prog: warning: $f is missing (apt-get install netbase); iptables will resolve only numeric protocols" >&2
  fi
done
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\n' >"$rootfs/etc/group"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"

mkdir -p "$rootfs/tmp" "$rootfs/run" "$rootfs/proc" "$rootfs/sys" "$rootfs/dev" "$rootfs/var" \
  "$rootfs/root"
chmod 1777 "$rootfs/tmp"
chmod 0700 "$rootfs/root"
ln -s ../run "$rootfs/var/run"
find "$rootfs" -type d -exec chmod go-w {} + 2>/dev/null || true
chmod 1777 "$rootfs/tmp"

# The merged-/usr links whose target holds nothing in the image go.
for top in bin sbin lib lib32 lib64 libx32; do
  if [ -L "$rootfs/$top" ] && [ ! -e "$rootfs/$top" ]; then rm "$rootfs/$top"; fi
done

for sh in bin/sh usr/bin/sh bin/bash usr/bin/bash bin/busybox usr/bin/busybox; do
  [ ! -e "$rootfs/$sh" ] || die "internal: a shell ($sh) ended up in the image"
done

# ------------------------------------------------------------ the layout
layout="$work/layout"
oci_init_layout "$layout"
read -r layer_digest layer_size < <(oci_put_layer "$layout" "$rootfs")

labels="$(printf '"org.opencontainers.image.title":"siphon-agent","org.opencontainers.image.version":"%s","org.opencontainers.image.source":"%s","org.opencontainers.image.revision":"%s","org.opencontainers.image.description":"Siphon node-local traffic agent"' \
  "$version" "$source_url" "$revision")"
config="$(printf '{"architecture":"%s","os":"linux","config":{"User":"0:0","Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":["/usr/local/bin/siphon-agent"],"Cmd":["--help"],"WorkingDir":"/","Labels":{%s}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"scripts/build-image.sh"}]}' \
  "$arch" "$labels" "$layer_digest")"
read -r config_digest config_size < <(printf '%s' "$config" | oci_put_blob "$layout")

read -r manifest_digest manifest_size < <(oci_put_manifest "$layout" "$config_digest" \
  "$config_size" "$layer_digest" "$layer_size" "$labels")
# Docker Engine before 25 (Debian 12's docker.io is 20.10) loads only the
# docker-archive form: a manifest.json naming the config, the layers and the
# tag. It reads the same blobs, so the tar carries both indexes and loads
# with `docker load` and `podman load` as well as with `ctr image import`.
printf '[{"Config":"blobs/sha256/%s","RepoTags":["%s"],"Layers":["blobs/sha256/%s"]}]' \
  "$config_digest" "$name" "$layer_digest" >"$layout/manifest.json"
oci_pack "$layout" "$manifest_digest" "$manifest_size" "$arch" "$name" "$work/image.tar"
tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layout" -rf "$work/image.tar" manifest.json
mkdir -p "$(dirname "$out")"
mv "$work/image.tar" "$out"
echo "$prog: $out ($name, version $version, $((layer_size / 1024 / 1024)) MiB, manifest sha256:$manifest_digest)"
