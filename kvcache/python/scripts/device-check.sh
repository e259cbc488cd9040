#!/usr/bin/env bash
# The GPU end-to-end check of Strata's KV path (issue 15): a small randomly initialised
# Llama created locally (no hub download), the same long prompt in three fresh
# processes: without Strata (plain), with Strata cold (KV saved), with Strata warm (KV
# loaded; by CUDA IPC handle from the daemon's GPU tier). Prints one JSON object: time
# to first token of each, whether the generated tokens are identical (greedy; they
# must be), what was loaded and how. Exit 0 = passed, 1 = a check failed, 2 = no GPU,
# 3 = a prerequisite is missing (the message says which).
#
# usage: device-check.sh [--cpu-dry-run] [OUT_DIR]
#   --cpu-dry-run  everything a machine without a GPU can run: the tiny model on the
#                  CPU, the daemon with an emulated GPU tier (its device handles are a
#                  memfd the client maps), the hf engine. Used here to test the script.
# env: STRATA_BIN   the daemon (default target/device-check/strata, then
#                   target/release/strata); on a GPU it must be built with CUDA:
#                     cargo build --release -p strata-tools --features cuda
#                     strip -o target/device-check/strata target/release/strata
#                   (~30 MB stripped: small enough to carry to a device machine; it
#                   loads libcuda at run time, so it builds without a GPU or toolkit)
#      PYTHON       the interpreter (default python3; needs torch, transformers,
#                   grpcio and protobuf >= 7.35: strata_kv's generated stubs)
#      ENGINE       vllm | hf (default: vllm when `import vllm` works, else hf)
#      BUDGET_S     wall-clock budget of the whole check (default 600: a 15-minute
#                   device lease minus the machine's start and a rerun's margin)
#
# Why an hf engine: the device machines lent here run an image with torch and
# transformers but no vLLM, nothing can be fetched there, and what a run may carry is
# 64 MiB; vLLM 0.33.0 is a ~400 MB wheel (more with its dependencies) built against its
# own pinned torch, not the image's. Where vLLM is installed (ENGINE=vllm), the vLLM
# connector itself is checked; elsewhere the hf engine checks the daemon, the client,
# the device-handle path and the loaded KV (byte-exact), and the JSON says which ran.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
dry=0
if [ "${1:-}" = "--cpu-dry-run" ]; then dry=1; shift; fi
out=${1:-$(mktemp -d)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
budget=${BUDGET_S:-600}
deadline=$(( $(date +%s) + budget ))
py=${PYTHON:-python3}
export PYTHONPATH="$repo/kvcache/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

die() { echo "device-check: $2" >&2; exit "$1"; }
# Runs "$@" bounded by what is left of the budget (and at most $1 seconds).
bounded() {
  local cap=$1; shift
  local left=$(( deadline - $(date +%s) ))
  [ "$left" -gt 5 ] || die 1 "budget of ${budget}s spent before: $*"
  [ "$left" -lt "$cap" ] && cap=$left
  timeout --kill-after=10 "$cap" "$@" || { rc=$?; [ $rc -eq 124 ] && die 1 "timed out after ${cap}s: $*"; return $rc; }
}

# -- prerequisites (fail fast, say what is missing) -----------------------------------
bin=${STRATA_BIN:-}
for b in "$bin" "$repo/target/device-check/strata" "$repo/target/release/strata" "$repo/target/debug/strata"; do
  [ -n "$b" ] && [ -x "$b" ] && { bin=$b; break; }
done
[ -x "$bin" ] || die 3 "no strata binary: cargo build --release -p strata-tools --features cuda (see the header)"
if [ $dry -eq 0 ]; then
  nvidia-smi -L >/dev/null 2>&1 || die 2 "no NVIDIA GPU visible (nvidia-smi failed)"
  size=gpu gpu_device=0
else
  size=cpu gpu_device=emulated
fi
"$py" -c "import torch, transformers, grpc, strata_kv" 2>"$out/import.err" \
  || die 3 "$py cannot import torch, transformers, grpcio or strata_kv: $(tail -1 "$out/import.err")"
if [ $dry -eq 0 ]; then
  "$py" -c "import torch; assert torch.cuda.is_available()" || die 2 "torch sees no GPU"
fi
engine=${ENGINE:-}
if [ -z "$engine" ]; then
  if [ $dry -eq 0 ] && "$py" -c "import vllm" 2>/dev/null; then engine=vllm; else engine=hf; fi
fi
[ "$engine" = vllm ] && { "$py" -c "import vllm" 2>/dev/null || die 3 "ENGINE=vllm but vllm does not import"; }
echo "device-check: engine $engine, preset $size, strata $bin, budget ${budget}s" >&2

# -- the daemon: a GPU tier (CUDA, or emulated in the dry run) above memory -----------
cat > "$out/strata.toml" <<EOF
[cache]
gpu = "16GiB"
gpu_device = "$gpu_device"
EOF
"$bin" serve --cache-dir "$out/cache" --listen 127.0.0.1:0 --admin 127.0.0.1:0 \
  --memory 8GiB --disk 0 --config "$out/strata.toml" > "$out/serve.out" 2> "$out/serve.err" &
serve=$!
trap 'kill $serve 2>/dev/null; wait $serve 2>/dev/null || true' EXIT
for _ in $(seq 150); do
  grep -q '^ready' "$out/serve.out" && break
  kill -0 $serve 2>/dev/null || break
  sleep 0.2
done
grep -q '^ready' "$out/serve.out" || die 3 "strata serve did not start (built without --features cuda?): $(tail -3 "$out/serve.err")"
sock=$(awk '$1=="kv" && $2=="unix" {print $3}' "$out/serve.out")

# -- the model, then the three runs ---------------------------------------------------
bounded 180 "$py" "$here/device_check.py" make-model "$out/model" "$size"
for run in plain strata-cold strata-warm; do
  bounded 240 "$py" "$here/device_check.py" run "$out/model" "$run" "unix://$sock" "$engine" > "$out/$run.json" \
    2> "$out/$run.err" || die 1 "$run failed: $(tail -3 "$out/$run.err")"
done
"$py" "$here/device_check.py" report "$out"
