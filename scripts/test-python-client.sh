#!/usr/bin/env bash
# The Python KV client's tests, against a real `strata serve` the tests start
# (kvcache/python/tests/conftest.py). Needs grpcio, protobuf and pytest (installed by
# scripts/install-deps.sh). Installs the client package the way users do (pip) into a
# throwaway virtualenv that sees the system's grpcio/pytest, so nothing global changes.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p strata-tools
venv=$(mktemp -d)
trap 'rm -rf "$venv" kvcache/python/build kvcache/python/strata_kv.egg-info' EXIT
python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check ./kvcache/python
# Run from outside the source tree so the installed package is the one imported.
STRATA_BIN="$PWD/target/debug/strata" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir "$PWD/kvcache/python" "$PWD/kvcache/python/tests"
