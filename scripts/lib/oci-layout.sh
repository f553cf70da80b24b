# Writing an OCI image layout (oci-layout, index.json, blobs/sha256/...) by
# hand, with tar and sha256sum, and packing it as the tar that `ctr image
# import` (or `skopeo copy oci-archive:...`) reads. Shared by
# scripts/build-image.sh and scripts/build-test-image.sh; sourced, not run.
# Every output is byte for byte the same on every run for the same inputs
# (sorted names, fixed owners and times).
#
# The image is one uncompressed layer. The order of calls:
#   oci_init_layout LAYOUT
#   read -r layer_digest layer_size < <(oci_put_layer LAYOUT ROOTFS)
#   read -r config_digest config_size < <(printf '%s' "$config" | oci_put_blob LAYOUT)
#   read -r manifest_digest manifest_size < <(oci_put_manifest LAYOUT ...)
#   oci_pack LAYOUT MANIFEST_DIGEST MANIFEST_SIZE ARCH NAME OUT

# The OCI architecture of this machine; fails (printing nothing) for a
# machine it does not know.
oci_arch() {
  case "$(uname -m)" in
    x86_64) echo amd64 ;;
    aarch64) echo arm64 ;;
    armv7l) echo arm ;;
    ppc64le) echo ppc64le ;;
    s390x) echo s390x ;;
    riscv64) echo riscv64 ;;
    *) return 1 ;;
  esac
}

# Creates the layout directory LAYOUT and its blob store.
oci_init_layout() {
  mkdir -p "$1/blobs/sha256"
}

# Writes stdin as a blob of LAYOUT; prints "DIGEST SIZE".
oci_put_blob() {
  local layout="$1" tmp digest size
  tmp="$layout/blob.tmp"
  cat >"$tmp"
  digest="$(sha256sum "$tmp" | cut -d' ' -f1)"
  size="$(stat -c %s "$tmp")"
  mv "$tmp" "$layout/blobs/sha256/$digest"
  echo "$digest $size"
}

# Writes the directory ROOTFS as an uncompressed, reproducible layer blob of
# LAYOUT (its digest is also its diff_id); prints "DIGEST SIZE".
oci_put_layer() {
  local layout="$1" rootfs="$2"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$rootfs" -cf - . | oci_put_blob "$layout"
}

# Writes the manifest of a one-layer image as a blob of LAYOUT; prints
# "DIGEST SIZE". ANNOTATIONS, when given, is the inside of the manifest's
# annotations object ("key":"value",...); without it there is none.
oci_put_manifest() {
  local layout="$1" config_digest="$2" config_size="$3" layer_digest="$4" layer_size="$5"
  local annotations="${6:-}" extra=""
  [ -z "$annotations" ] || extra=",\"annotations\":{$annotations}"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]%s}' \
    "$config_digest" "$config_size" "$layer_digest" "$layer_size" "$extra" |
    oci_put_blob "$layout"
}

# Writes oci-layout and index.json (one manifest, for linux/ARCH, named NAME:
# io.containerd.image.name, which ctr uses as the image's name, and the tag
# as org.opencontainers.image.ref.name) into LAYOUT, then packs LAYOUT as
# the tar OUT (written to OUT.tmp, then renamed).
oci_pack() {
  local layout="$1" manifest_digest="$2" manifest_size="$3" arch="$4" name="$5" out="$6"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest_digest" "$manifest_size" "$arch" "$name" "${name##*:}" >"$layout/index.json"
  mkdir -p "$(dirname "$out")"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layout" \
    -cf "$out.tmp" oci-layout index.json blobs
  mv "$out.tmp" "$out"
}
