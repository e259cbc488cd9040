#!/usr/bin/env bash
# Regenerates the checked-in gRPC stubs of strata.kv.v1 from the SAME proto the Rust
# service is built from (../proto). Needs `pip install grpcio-tools`. CI can check the
# stubs are current with: ./regen.sh && git diff --exit-code strata_kv/_gen
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m grpc_tools.protoc -I ../proto --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" strata/kv/v1/kv.proto
for f in kv_pb2.py kv_pb2.pyi kv_pb2_grpc.py; do
  # The generated service module imports its messages by their proto package path;
  # inside this package they are a sibling module.
  sed 's/^from strata\.kv\.v1 import kv_pb2 as /from . import kv_pb2 as /' "$tmp/strata/kv/v1/$f" > "strata_kv/_gen/$f"
done
echo "regenerated strata_kv/_gen from ../proto/strata/kv/v1/kv.proto"
