#!/usr/bin/env bash
# Installs every build and test dependency of Siphon from Debian's packages.
# Idempotent and non-interactive: packages already present are left alone.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git
  libboost-dev libboost-system-dev
  libprotobuf-dev protobuf-compiler
  libabsl-dev libfmt-dev libspdlog-dev libcli11-dev
  # Kubernetes sessions (layer-protocol/kube/): the API's JSON, read and
  # written without protobuf.
  nlohmann-json3-dev
  libbpf-dev bpftool clang llvm libclang-rt-14-dev lld
  libelf-dev zlib1g-dev
  libnl-3-dev libnl-route-3-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  iproute2 procps util-linux
  # Runtime resolution: containerd's gRPC API (stubs generated at build time),
  # and a real containerd + runc + busybox image for the privileged tests.
  libgrpc++-dev protobuf-compiler-grpc containerd runc busybox-static umoci
  # DNS inside the target, and a real DNS server for the tests.
  libc-ares-dev dnsmasq-base
  # Test peers: echo services, relays.
  socat
  # Steal: the iptables backend (nft and legacy), curl in the tests and demo.
  iptables curl
  # Capture: libpcap in the agent, tshark to read the files back in the tests.
  libpcap-dev tshark
  # Filtered steal: RE2 (filters) and nghttp2 (HTTP/2) in the agent; real
  # HTTP/2 and WebSocket clients and servers, and wrk, in the tests.
  libre2-dev libnghttp2-dev nghttp2-client nghttp2-server python3-websockets nginx-light wrk
  # Operations and security: TLS (OpenSSL through Asio; the openssl tool makes
  # the tests' throwaway certificates), capability tools for the least-privilege
  # tests, PyYAML for the manifest checker.
  libssl-dev openssl libcap2-bin python3-yaml netbase
  # `siphon fs mount`: libfuse3 and fusermount3; the tools its tests run on
  # the mount (git, sqlite3; diff, find and tar are in every Debian).
  libfuse3-dev fuse3 git sqlite3
  # `siphon exec`: real programs in its tests (dig reads resolv.conf itself,
  # busybox's wget is static).
  bind9-dnsutils
  # Docker-API runtimes, real engines in tests/privileged/docker: Debian's
  # Docker Engine (dockerd, and its client at /usr/bin/docker) and Podman
  # (its Docker-compatible service; conmon comes with it). Both run containers
  # with the runc above; the tests start private daemons, never the system's.
  docker.io podman
)

# containerd's .proto files, for the agent's gRPC client generated at build
# time: unpacked from Debian's Go source packages into /var/cache/siphon (or
# $SIPHON_PROTO_CACHE), not installed (see the script). CMake only reads
# them, and stops with a message naming this script when they are missing.
if [ "$(id -u)" -eq 0 ] || [ -n "${SIPHON_PROTO_CACHE:-}" ]; then
  bash "$(dirname "${BASH_SOURCE[0]}")/fetch-containerd-protos.sh"
elif [ ! -f /var/cache/siphon/containerd-protos/.complete ]; then
  echo "install-deps: containerd's .proto files are missing; run as root, or set" \
    "SIPHON_PROTO_CACHE=DIR (configure then reads DIR)" >&2
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages (${missing[*]}); run as root to install them" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Packages with a daemon (docker.io, containerd, dnsmasq, nginx) start it on
# install where services can start. A system dockerd would add a bridge,
# NAT and filter rules (a FORWARD policy of DROP) and turn on ip_forward,
# under the feet of the steal and mesh tests; the tests start the daemons
# they need themselves. Unless the host already has a policy, none is
# started during this install (policy-rc.d exit 101: "action forbidden").
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# scripts/install-deps.sh: no service starts during its install\nexit 101\n' >"$policy"
  chmod 0755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
