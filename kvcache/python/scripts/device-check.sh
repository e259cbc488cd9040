#!/usr/bin/env bash
# The GPU end-to-end check of the vLLM connector (issue 15), for a machine with an
# NVIDIA GPU (CI has none; run it where one is lent). vLLM serves a small randomly
# initialised Llama created locally (no hub download); the same long prompt runs in
# three fresh processes: without Strata, with Strata cold (blocks saved), with Strata
# warm (blocks loaded). Prints JSON: time to first token of each, and whether the
# generated tokens are identical (greedy decoding; they must be).
#
# usage: device-check.sh [OUT_DIR]     env: STRATA_BIN (default target/release/strata,
#        else target/debug/strata), VENV (default /tmp/strata-device-venv: created with
#        the PyPI vllm wheel if missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
bin=${STRATA_BIN:-$repo/target/release/strata}
[ -x "$bin" ] || bin=$repo/target/debug/strata
[ -x "$bin" ] || { echo "no strata binary: cargo build --release -p strata-tools" >&2; exit 2; }
nvidia-smi -L >/dev/null || { echo "no NVIDIA GPU visible (nvidia-smi failed)" >&2; exit 2; }
venv=${VENV:-/tmp/strata-device-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check vllm==0.33.0
fi
"$venv/bin/pip" install -q --disable-pip-version-check "$repo/kvcache/python"

# The daemon: memory tier only, KV on loopback and its Unix socket.
"$bin" serve --cache-dir "$out/cache" --listen 127.0.0.1:0 --admin 127.0.0.1:0 \
  --memory 8GiB --disk 0 > "$out/serve.out" 2> "$out/serve.err" &
serve=$!
trap 'kill $serve 2>/dev/null; wait $serve 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q '^ready' "$out/serve.out" && break; sleep 0.2; done
grep -q '^ready' "$out/serve.out" || { cat "$out/serve.err" >&2; exit 1; }
sock=$(awk '$1=="kv" && $2=="unix" {print $3}' "$out/serve.out")

"$venv/bin/python" "$here/device_check.py" make-model "$out/model"
for run in plain strata-cold strata-warm; do
  "$venv/bin/python" "$here/device_check.py" run "$out/model" "$run" "unix://$sock" > "$out/$run.json"
done
"$venv/bin/python" "$here/device_check.py" report "$out"
