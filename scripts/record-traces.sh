#!/usr/bin/env bash
# Records the real-program trace corpus in tools/replay/traces/ (see its README): for
# each kind, generates the data set locally (scripts/corpus/workloads.py gen, seeded, no
# downloads), then records the program reading it with `strata trace record`.
#
#   scripts/record-traces.sh                 # every kind
#   scripts/record-traces.sh sqlite mix      # some
#
# Environment: STRATA (the binary, default `strata` on PATH), WORK (data sets, default
# /tmp/strata-corpus, ~500 MB), OUT (default tools/replay/traces). Needs strace and
# python3; numpy, pyarrow, h5py and safetensors for their kinds (missing ones are
# skipped with a note).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
STRATA=${STRATA:-strata}
WORK=${WORK:-/tmp/strata-corpus}
OUT=${OUT:-$repo/tools/replay/traces}
W=(python3 "$repo/scripts/corpus/workloads.py")
kinds=("$@")
[ "${#kinds[@]}" -gt 0 ] || kinds=(sqlite shards loader npy parquet h5 safetensors mix etl mix4)
mkdir -p "$WORK" "$OUT"

# The Python module a kind needs beyond the standard library.
needs() {
  case "$1" in
    npy) echo numpy ;;
    parquet) echo pyarrow ;;
    h5) echo h5py ;;
    safetensors) echo safetensors ;;
  esac
}

gen() {
  local mod
  mod=$(needs "$1")
  if [ -n "$mod" ] && ! python3 -c "import $mod" 2>/dev/null; then
    echo "skipping $1: python module $mod is not installed" >&2
    return 1
  fi
  echo "generating $1 in $WORK/$1" >&2
  "${W[@]}" gen "$1" "$WORK/$1"
}

# record NAME CMD...: the trace of CMD's reads under $WORK, paths like `sqlite/kv.db`.
record() {
  local name=$1
  shift
  (cd "$WORK" && "$STRATA" trace record --root "$WORK" --out "$OUT/$name.csv.gz" -- "$@")
}

for k in "${kinds[@]}"; do
  case "$k" in
    mix)
      # Three tenants at once, each in its own process group (`set -m`: job control
      # gives every background job its own group), so each is one job in the trace.
      for part in sqlite shards loader; do gen "$part"; done
      record mix bash -c "set -m
        ${W[*]} run sqlite $WORK/sqlite &
        ${W[*]} run shards $WORK/shards &
        ${W[*]} run loader $WORK/loader &
        wait"
      ;;
    mix4)
      # The four tenants of issue 13's held-out mix: mix's three plus the ETL scan,
      # each its own process group as in mix.
      for part in sqlite shards loader etl; do gen "$part"; done
      record mix4 bash -c "set -m
        ${W[*]} run sqlite $WORK/sqlite &
        ${W[*]} run shards $WORK/shards &
        ${W[*]} run loader $WORK/loader &
        ${W[*]} run etl $WORK/etl &
        wait"
      ;;
    *)
      gen "$k" || continue
      record "$k" "${W[@]}" run "$k" "$WORK/$k"
      ;;
  esac
done
