#!/usr/bin/env bash
# Builds the small OCI image the privileged runtime tests run under a real
# containerd: an OCI image layout (oci-layout, index.json, blobs/sha256/...)
# packed as a tar that `ctr image import` reads. No registry, no daemon: the
# layout is written by hand with tar and sha256sum, byte for byte the same on
# every run (sorted names, fixed owners and times).
#
# Content:
#   /bin/busybox (from Debian's busybox-static) and symlinks sh, sleep, cat, env
#   /only-in-container.txt  "siphon test image: only in the container\n"
#   config Env: PATH=/bin, RUNTIME_ONLY_VAR=from-image; Cmd: /bin/sh
#
# Usage: scripts/build-test-image.sh OUT.tar [IMAGE_NAME]
#   IMAGE_NAME defaults to docker.io/siphon-test/busybox:1 (stored in the
#   index as io.containerd.image.name, which ctr uses as the image's name).
set -euo pipefail

# shellcheck source=lib/oci-layout.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/oci-layout.sh"

out="${1:?usage: build-test-image.sh OUT.tar [IMAGE_NAME]}"
name="${2:-docker.io/siphon-test/busybox:1}"
busybox="${SIPHON_BUSYBOX:-/bin/busybox}"

if [ ! -f "$busybox" ] || [ "$(head -c 4 "$busybox" | tail -c 3)" != "ELF" ]; then
  echo "build-test-image: $busybox is not an ELF binary (install busybox-static)" >&2
  exit 1
fi
# A dynamically linked busybox would need its libc inside the image.
if LC_ALL=C readelf -l "$busybox" 2>/dev/null | grep -q 'INTERP'; then
  echo "build-test-image: $busybox is dynamically linked; the image needs busybox-static" >&2
  exit 1
fi

arch="$(oci_arch)" || { echo "build-test-image: unknown machine $(uname -m)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

rootfs="$work/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/proc" "$rootfs/dev" "$rootfs/sys" "$rootfs/etc"
cp "$busybox" "$rootfs/bin/busybox"
chmod 0755 "$rootfs/bin/busybox"
for applet in sh sleep cat env ls; do
  ln -s busybox "$rootfs/bin/$applet"
done
printf 'siphon test image: only in the container\n' >"$rootfs/only-in-container.txt"
chmod 0644 "$rootfs/only-in-container.txt"
chmod 1777 "$rootfs/tmp"

layout="$work/layout"
oci_init_layout "$layout"
read -r layer_digest layer_size < <(oci_put_layer "$layout" "$rootfs")

config="$(printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/bin","RUNTIME_ONLY_VAR=from-image"],"Cmd":["/bin/sh"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"scripts/build-test-image.sh"}]}' \
  "$arch" "$layer_digest")"
read -r config_digest config_size < <(printf '%s' "$config" | oci_put_blob "$layout")

read -r manifest_digest manifest_size < <(
  oci_put_manifest "$layout" "$config_digest" "$config_size" "$layer_digest" "$layer_size")
oci_pack "$layout" "$manifest_digest" "$manifest_size" "$arch" "$name" "$out"
echo "build-test-image: $out ($name, manifest sha256:$manifest_digest)"
