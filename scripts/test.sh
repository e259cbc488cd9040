#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs dependencies, then runs every
# Rust test (unit, property, conformance, recovery, real FUSE mounts, real S3 server,
# gRPC end to end) and the Python client's tests. Each test bounds its own time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

# FUSE tests mount through the kernel: they need /dev/fuse (root in CI).
[ -e /dev/fuse ] || { echo "error: /dev/fuse is missing; the FUSE tests cannot run" >&2; exit 1; }

export RUST_BACKTRACE=1
# The Python tests first: their throwaway virtualenv (vllm + torch, ~9.4 GB) is removed
# when they end, so it and the workspace's test build never fill the disk together.
scripts/test-python-client.sh
cargo test --workspace --all-targets
# The Kubernetes manifests against the API schemas (unknown fields are errors).
python3 -m kubernetes_validate --strict --quiet deploy/kubernetes/*.yaml
