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

case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  armv7l) arch=arm ;;
  ppc64le) arch=ppc64le ;;
  s390x) arch=s390x ;;
  riscv64) arch=riscv64 ;;
  *) echo "build-test-image: unknown machine $(uname -m)" >&2; exit 1 ;;
esac

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
mkdir -p "$layout/blobs/sha256"

# Writes stdin as a blob; prints "DIGEST SIZE".
put_blob() {
  local tmp="$layout/blob.tmp" digest size
  cat >"$tmp"
  digest="$(sha256sum "$tmp" | cut -d' ' -f1)"
  size="$(stat -c %s "$tmp")"
  mv "$tmp" "$layout/blobs/sha256/$digest"
  echo "$digest $size"
}

# An uncompressed layer: its digest is also its diff_id.
read -r layer_digest layer_size < <(
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$rootfs" -cf - . | put_blob)

config="$(printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/bin","RUNTIME_ONLY_VAR=from-image"],"Cmd":["/bin/sh"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"scripts/build-test-image.sh"}]}' \
  "$arch" "$layer_digest")"
read -r config_digest config_size < <(printf '%s' "$config" | put_blob)

manifest="$(printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
  "$config_digest" "$config_size" "$layer_digest" "$layer_size")"
read -r manifest_digest manifest_size < <(printf '%s' "$manifest" | put_blob)

printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$manifest_digest" "$manifest_size" "$arch" "$name" "${name##*:}" >"$layout/index.json"

mkdir -p "$(dirname "$out")"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layout" \
  -cf "$out.tmp" oci-layout index.json blobs
mv "$out.tmp" "$out"
echo "build-test-image: $out ($name, manifest sha256:$manifest_digest)"
