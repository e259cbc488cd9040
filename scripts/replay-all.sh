#!/usr/bin/env bash
# Every trace the policy is judged on (issue 13): the 10 recorded corpus traces, the 7
# generator workloads and both Mooncake traces, at 10/20/40% of unique bytes, every
# policy; one JSON per trace and capacity (the format of `strata bench replay --json`).
#
# usage: scripts/replay-all.sh OUTDIR [GENDIR]
#   GENDIR  the generator and Mooncake traces as scripts/replay-set.sh makes them
#           (`strata trace gen --workload W --seed 1`, `strata trace import --format
#           mooncake --block-bytes 2097152`); default /work/replay-traces
# env: BIN (default: the replay_json example, built with
#      `cargo build --release -p strata-replay --examples`), CAPS (default "10 20 40"),
#      ONLY (trace names), P (policies), SET=heldout (the held-out traces instead)
set -eu
OUT=${1:?usage: replay-all.sh OUTDIR [GENDIR]}
GEN=${2:-/work/replay-traces}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/examples/replay_json}
CAPS=${CAPS:-10 20 40}
P=${P:-strata,strata-noprefetch,strata-blocks,lru,lfu,arc,2random,tinylfu,opt}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
. "$ROOT/scripts/replay-traces.sh"
for t in "${traces[@]}"; do
  set -- $t
  if [ -n "${ONLY:-}" ] && ! [[ " $ONLY " == *" $1 "* ]]; then continue; fi
  for c in $CAPS; do
    nice -n 5 "$BIN" "$2" "$c%" "$P" > "$OUT/$1-$c.json.tmp" && mv "$OUT/$1-$c.json.tmp" "$OUT/$1-$c.json"
  done
done
