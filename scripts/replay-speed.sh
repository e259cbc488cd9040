#!/usr/bin/env bash
# Replay cost of strata against lru (issue 13: "strata within 3x of lru's accesses per
# second"), as replay thread CPU time per block access, on every trace of the corpus.
# Runs are interleaved (run 1 of every trace, then run 2, ...) and alternate the policy
# order within the process (lru,strata / strata,lru), so a burst of load or a warm
# cache does not favour one side; prints the medians as a markdown table.
#
# usage: scripts/replay-speed.sh OUTDIR [GENDIR]
# env: BIN (default: the replay_json example), CAP (default 10%), RUNS (default 3)
set -eu
OUT=${1:?usage: replay-speed.sh OUTDIR [GENDIR]}
GEN=${2:-/work/replay-traces}
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/examples/replay_json}
CAP=${CAP:-10%}
RUNS=${RUNS:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
. "$ROOT/scripts/replay-traces.sh"
for i in $(seq 1 "$RUNS"); do
  if [ $((i % 2)) -eq 1 ]; then order=lru,strata; else order=strata,lru; fi
  for t in "${traces[@]}"; do
    set -- $t
    nice -n 5 "$BIN" "$2" "$CAP" "$order" > "$OUT/$1-$i.json.tmp" && mv "$OUT/$1-$i.json.tmp" "$OUT/$1-$i.json"
  done
done
python3 - "$OUT" <<'PY'
import glob, json, math, os, statistics, sys
out = sys.argv[1]
rows = {}
for f in glob.glob(os.path.join(out, "*.json")):
    name = os.path.basename(f)[:-5].rsplit("-", 1)[0]
    r = {x["policy"]: x for x in json.load(open(f))["results"]}
    d = rows.setdefault(name, {"cpu": [], "wall": [], "lru_ns": [], "strata_ns": []})
    d["acc"] = r["lru"]["accesses"]
    d["cpu"].append(r["strata"]["replay_cpu_ns_per_access"] / r["lru"]["replay_cpu_ns_per_access"])
    d["wall"].append(r["lru"]["replay_accesses_per_s"] / r["strata"]["replay_accesses_per_s"])
    d["lru_ns"].append(r["lru"]["replay_cpu_ns_per_access"])
    d["strata_ns"].append(r["strata"]["replay_cpu_ns_per_access"])
med = statistics.median
fmt = lambda xs: f"{med(xs):.2f} ({' / '.join('%.2f' % x for x in sorted(xs))})"
print("| trace | block accesses | lru CPU ns/access | strata CPU ns/access | strata/lru CPU (median; runs) | lru/strata wall accesses/s (median; runs) |")
print("|---|---|---|---|---|---|")
gm = {"cpu": [], "wall": []}
for n in sorted(rows):
    d = rows[n]
    for k in gm:
        gm[k].append(math.log(med(d[k])))
    print(f"| {n} | {d['acc']} | {med(d['lru_ns']):.0f} | {med(d['strata_ns']):.0f} | {fmt(d['cpu'])} | {fmt(d['wall'])} |")
g = {k: math.exp(sum(v) / len(v)) for k, v in gm.items()}
print(f"\ngeomean of medians: CPU {g['cpu']:.2f}x, wall {g['wall']:.2f}x; "
      f"{sum(1 for n in rows if med(rows[n]['cpu']) <= 3.0)} of {len(rows)} traces within 3x by CPU time")
PY
