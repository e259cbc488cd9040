#!/usr/bin/env python3
"""replay-merge.py BASE NEW OUT: BASE's JSONs (every policy of scripts/replay-all.sh) with the
policies NEW has (e.g. a strata-only run, P=strata) replaced by NEW's: so a policy change is
scored against the baselines without rerunning them."""
import json, glob, os, sys
base, new, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
for f in glob.glob(os.path.join(base, "*.json")):
    b = json.load(open(f))
    nf = os.path.join(new, os.path.basename(f))
    if os.path.exists(nf):
        n = {r["policy"]: r for r in json.load(open(nf))["results"]}
        b["results"] = [n.get(r["policy"], r) for r in b["results"]]
    json.dump(b, open(os.path.join(out, os.path.basename(f)), "w"))
