#!/usr/bin/env bash
# Installs what building and testing Strata needs on a fresh Debian machine (as root, or
# with sudo). Idempotent: packages already present are skipped quickly.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

# Debian packages:
#  fuse3            fusermount3 (auto-unmount) and /dev/fuse tooling for the mount tests
#  librocksdb-dev   RocksDB linked as a system library (saves ~12 min of C++ per cold build)
#  libclang-dev     bindgen for librocksdb-sys
#  protobuf-compiler protoc for the KV service's gRPC code generation
#  strace           `strata trace record` and its tests
#  g++ libssl-dev   SGLang compiles its page hash (C++, -lcrypto) on first use in the
#                   connector tests
#  etcd-server      /usr/bin/etcd for the cache group's membership tests (issue 16); the
#                   tests start their own on loopback ports, so the packaged service is
#                   stopped and disabled below
#  e2fsprogs        mkfs.ext4: a disk-tier test fills a loop-mounted ext4 past its
#                   reserved blocks (installed on Debian already; named to be sure)
apt_pkgs=(fuse3 librocksdb-dev libclang-dev clang protobuf-compiler pkg-config strace g++ libssl-dev etcd-server e2fsprogs)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The package enables an etcd service on 2379; nothing here needs it running (machines
# without systemd, such as containers, never start it).
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now etcd >/dev/null 2>&1 || true
fi

# Python: moto's S3 server for the S3 tests; grpcio for the Python KV client and its tests;
# kubernetes-validate checks deploy/kubernetes against the Kubernetes schemas (offline).
py_pkgs=("moto[server]" "grpcio" "grpcio-tools" "protobuf" "pytest" "kubernetes-validate")
need_pip=0
command -v moto_server >/dev/null 2>&1 || need_pip=1
python3 -c "import grpc, grpc_tools, google.protobuf, pytest, kubernetes_validate" >/dev/null 2>&1 || need_pip=1
if [ "$need_pip" = 1 ]; then
  echo "installing Python packages: ${py_pkgs[*]}"
  python3 -m pip install -q --disable-pip-version-check "${py_pkgs[@]}"
fi
# pyenv puts console scripts behind shims; make sure moto_server resolves now.
command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
command -v moto_server >/dev/null
echo "dependencies ready"
