#!/usr/bin/env bash
# The Python KV client's tests, against a real `strata serve` the tests start
# (kvcache/python/tests/conftest.py), including the vLLM connector and the SGLang
# storage backend against the real `vllm` and `sglang` packages from PyPI (CPU tensors).
# Needs grpcio, protobuf and pytest (scripts/install-deps.sh).
#
# The client package is installed the way users do (pip) into a virtualenv that sees the
# system's grpcio/pytest. vllm (with torch) takes ~9.4 GB and minutes to install, so:
#   STRATA_PY_VENV=/path  reuse (or create once) a virtualenv there, kept afterwards;
#   unset                 a throwaway virtualenv, removed at exit.
# A missing engine package is a test failure, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p strata-tools
strata_bin="${CARGO_TARGET_DIR:-$PWD/target}/debug/strata"
case "$strata_bin" in /*) ;; *) strata_bin="$PWD/$strata_bin" ;; esac

cleanup() { rm -rf kvcache/python/build kvcache/python/strata_kv.egg-info; }
if [ -n "${STRATA_PY_VENV:-}" ]; then
  venv="$STRATA_PY_VENV"
else
  venv=$(mktemp -d)
  cleanup() { rm -rf "$venv" kvcache/python/build kvcache/python/strata_kv.egg-info; }
fi
trap cleanup EXIT
[ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
# No pip cache: the wheels would stay on disk beside the venv (several GB for torch).
pip=("$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir)

# The engines: installed unless the virtualenv already holds the pinned versions.
reqs=kvcache/python/requirements-connectors.txt
reqs_nodeps=kvcache/python/requirements-connectors-nodeps.txt
pins=$(grep -hv '^\s*#' "$reqs" "$reqs_nodeps" | grep '==' | tr '\n' ' ')
if ! "$venv/bin/python" - $pins <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
def have(pin):
    name, want = pin.split("==")
    try:
        return version(name) == want
    except PackageNotFoundError:
        return False
sys.exit(0 if all(have(p) for p in sys.argv[1:]) else 1)
PY
then
  # vllm + torch + CUDA wheels: 9.5 GB in the venv; the install peaked at 11.7 GB with
  # pip's unpack directories (fresh clone, 2026-12-02). 13 GB leaves a margin.
  avail_gb=$(df -Pk "$venv" | awk 'NR==2 {print int($4 / 1048576)}')
  if [ "$avail_gb" -lt 13 ]; then
    echo "error: installing vllm needs ~13 GB free next to $venv, $avail_gb GB left" >&2
    exit 1
  fi
  start=$(date +%s)
  "${pip[@]}" -r "$reqs"
  "${pip[@]}" --no-deps -r "$reqs_nodeps"
  echo "connector engines installed in $(( $(date +%s) - start )) s; venv $(du -sh "$venv" | cut -f1)"
fi
"${pip[@]}" --force-reinstall --no-deps ./kvcache/python

# The venv's bin on PATH: SGLang builds its page hash with the ninja pip installed.
# Run from outside the source tree so the installed package is the one imported.
PATH="$venv/bin:$PATH" STRATA_BIN="$strata_bin" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir "$PWD/kvcache/python" "$PWD/kvcache/python/tests"
# Real checkpoint writers (torch, safetensors, numpy, logging) through a real mount.
PATH="$venv/bin:$PATH" STRATA_BIN="$strata_bin" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir "$PWD/tests/python" "$PWD/tests/python"
