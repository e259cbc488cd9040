#!/usr/bin/env bash
# Replay benchmark set of docs/BENCHMARKS.md ("Replay" section), run on fixed trace files.
#
# usage: run.sh BINARY OUTDIR [TRACEDIR]
#   BINARY   the strata binary (e.g. target/release/strata)
#   OUTDIR   where $w-$c.json / mooncake-$f-$c.json, run.log and timings.tsv go
#   TRACEDIR trace files (default /tmp/strata-replay-traces)
# env:
#   GEN=1    generate missing traces with BINARY (only for the first, "before" run;
#            otherwise a missing trace is an error, so every run replays the same files)
#   ONLY="mixed-10 mooncake-conversation-20 ..."  run only these outputs (names w/o .json)
#   FORCE=1  rerun outputs that already exist (default: skip existing, so a run resumes)
#   NICE=5   niceness (default 5)
# Order: the priority subset first (mixed, kv-prefix, shards, train-small-files,
# inference-skew and both Mooncake traces at 10% and 20%), then the rest.
set -u
BIN=${1:?usage: run.sh BINARY OUTDIR [TRACEDIR]}
OUT=${2:?usage: run.sh BINARY OUTDIR [TRACEDIR]}
TR=${3:-/tmp/strata-replay-traces}
NICE=${NICE:-5}
P=strata,strata-nosemantic,strata-noprefetch,lru,lfu,arc,2random,tinylfu,opt
GEN_W="train-small-files shards checkpoint preprocess inference-skew kv-prefix mixed"
MC="conversation synthetic"
KV=${KV_TRACES:-$(dirname "$0")/../../shared/traces/kv}
mkdir -p "$OUT" "$TR"
BIN=$(readlink -f "$BIN")
[ -x "$BIN" ] || { echo "no binary $BIN" >&2; exit 2; }
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/run.log"; }
log "binary $BIN ($(sha256sum "$BIN" | cut -c1-16)), traces $TR, out $OUT"

# 1. traces
for w in $GEN_W; do
  t=$TR/$w.csv
  if [ ! -s "$t" ]; then
    [ "${GEN:-0}" = 1 ] || { log "MISSING trace $t (set GEN=1 to generate)"; exit 3; }
    log "gen $w"
    nice -n "$NICE" "$BIN" trace gen --workload "$w" --seed 1 --out "$t" || { log "FAIL gen $w"; rm -f "$t"; }
  fi
done
for f in $MC; do
  t=$TR/mooncake-$f.csv.gz
  if [ ! -s "$t" ]; then
    [ "${GEN:-0}" = 1 ] || { log "MISSING trace $t (set GEN=1 to generate)"; exit 3; }
    log "import mooncake $f"
    nice -n "$NICE" "$BIN" trace import --format mooncake "$KV/${f}_trace.jsonl.gz" \
      --block-bytes 2097152 --out "$t" || { log "FAIL import $f"; rm -f "$t"; }
  fi
done
[ -f "$TR/SHA256SUMS" ] || (cd "$TR" && sha256sum *.csv *.csv.gz > SHA256SUMS)
(cd "$TR" && sha256sum --quiet -c SHA256SUMS) || log "WARNING: trace files differ from $TR/SHA256SUMS"

# 2. job list: name trace capacity, priority subset first
PRIO_W="mixed kv-prefix shards train-small-files inference-skew"
jobs=()
for c in 10 20; do
  for w in $PRIO_W; do jobs+=("$w-$c $TR/$w.csv $c"); done
  for f in $MC; do jobs+=("mooncake-$f-$c $TR/mooncake-$f.csv.gz $c"); done
done
for w in $GEN_W; do
  for c in 10 20 40; do
    if [[ " $PRIO_W " == *" $w "* ]] && [ $c != 40 ]; then continue; fi
    jobs+=("$w-$c $TR/$w.csv $c")
  done
done
for f in $MC; do for c in 5 40; do jobs+=("mooncake-$f-$c $TR/mooncake-$f.csv.gz $c"); done; done

# 3. replays
[ -f "$OUT/timings.tsv" ] || printf 'name\tcapacity\twall_s\trc\n' > "$OUT/timings.tsv"
T0=$(date +%s)
fails=0
for j in "${jobs[@]}"; do
  set -- $j; name=$1; trace=$2; c=$3
  if [ -n "${ONLY:-}" ] && ! [[ " $ONLY " == *" $name "* ]]; then continue; fi
  o=$OUT/$name.json
  if [ -s "$o" ] && [ "${FORCE:-0}" != 1 ]; then log "skip $name (exists)"; continue; fi
  [ -s "$trace" ] || { log "FAIL $name: no trace $trace"; fails=$((fails+1)); continue; }
  log "run $name"
  s=$(date +%s.%N)
  nice -n "$NICE" "$BIN" bench replay --trace "$trace" --capacity "$c%" --policies "$P" --json \
    > "$o.tmp" 2> "$OUT/$name.stderr"
  rc=$?
  e=$(date +%s.%N)
  printf '%s\t%s\t%.1f\t%s\n' "$name" "$c" "$(echo "$e - $s" | bc)" "$rc" >> "$OUT/timings.tsv"
  if [ $rc = 0 ] && [ -s "$o.tmp" ]; then mv "$o.tmp" "$o"; [ -s "$OUT/$name.stderr" ] || rm -f "$OUT/$name.stderr"
  else log "FAIL $name rc=$rc (see $OUT/$name.stderr)"; fails=$((fails+1)); fi
done
log "done: $(( $(date +%s) - T0 )) s, $fails failure(s)"
