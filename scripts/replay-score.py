#!/usr/bin/env python3
"""Scores strata against the baselines on a directory of replay JSONs (issue 13 targets).

  replay-score.py DIR [--before DIR0] [--full]

Per trace and capacity: strata's total JCT and its ratio to the best baseline's
(lru, lfu, arc, 2random, tinylfu) and to LRU's, strata's request hit ratio minus the
best baseline's (points), strata's replay CPU time per access over LRU's (LRU's
wall-clock accesses/s over strata's for reports without it), and for multi-job traces
the worst tenant's JCT ratio to its LRU JCT. Then the geometric mean of JCT/best and,
for the multi-tenant mixes (traces named `mix*`), their own targets: total JCT <= 0.7x
LRU's and no tenant above 1.1x its JCT under LRU. `--before`: strata's total JCT there too.
`--full`: the table of every policy (markdown), as in docs/BENCHMARKS.md.
"""
import argparse, glob, json, math, os, re

BASE = ["lru", "lfu", "arc", "2random", "tinylfu"]
# Issue 13's targets on the multi-tenant mixes.
MIX_TOTAL_VS_LRU = 0.7
MIX_TENANT_VS_LRU = 1.1


def load(d):
    out = {}
    for f in glob.glob(os.path.join(d, "*.json")):
        m = re.fullmatch(r"(.+)-(\d+)\.json", os.path.basename(f))
        if m:
            with open(f) as fh:
                out[(m.group(1), int(m.group(2)))] = {r["policy"]: r for r in json.load(fh)["results"]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--before")
    ap.add_argument("--full", action="store_true")
    a = ap.parse_args()
    now = load(a.dir)
    before = load(a.before) if a.before else {}
    if a.full:
        print("| trace | cap | policy | hit ratio | byte hit ratio | total JCT (s) | mean read (ms) |")
        print("|---|---|---|---|---|---|---|")
        for k in sorted(now):
            rs = now[k]
            best = min((rs[b]["total_jct_s"] for b in BASE + ["strata"] if b in rs))
            for p, r in rs.items():
                j = f"{r['total_jct_s']:.2f}"
                if r["total_jct_s"] == best and p != "opt":
                    j = f"**{j}**"
                print(f"| {k[0]} | {k[1]}% | {p} | {r['hit_ratio']:.3f} | {r['byte_hit_ratio']:.3f} | {j} | {r['mean_read_latency_ms']:.2f} |")
        return
    hdr = "| trace | cap | strata JCT | best baseline | JCT/best | JCT/LRU | hr - best hr (pt) | worst tenant / its LRU | lru/strata speed |"
    if before:
        hdr += " before JCT | after/before |"
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    fails = 0
    logs = []
    mixes = []
    for k in sorted(now):
        rs = now[k]
        if "strata" not in rs:
            continue
        s = rs["strata"]
        bb = min((b for b in BASE if b in rs), key=lambda b: rs[b]["total_jct_s"])
        best_hr = max(rs[b]["hit_ratio"] for b in BASE if b in rs)
        lru = rs.get("lru")
        ratio = s["total_jct_s"] / max(rs[bb]["total_jct_s"], 1e-9)
        hr_pt = 100 * (s["hit_ratio"] - best_hr)
        logs.append(math.log(max(ratio, 1e-9)))
        worst = "-"
        if lru and 1 < len(s["job_jct_s"]) <= 16:  # tenants, not KV requests
            wj = max(s["job_jct_s"], key=lambda j: s["job_jct_s"][j] / max(lru["job_jct_s"][j], 1e-9))
            w = s["job_jct_s"][wj] / max(lru["job_jct_s"][wj], 1e-9)
            worst = f"{w:.2f}"
            if k[0].startswith(("mix", "ho-mix")):
                mixes.append((k, s["total_jct_s"] / max(lru["total_jct_s"], 1e-9), w, wj))
        # CPU time per access where the report has it (wall time on a loaded machine
        # spread this ratio 2-60x between runs), else the wall-clock rate.
        if lru and "replay_cpu_ns_per_access" in s and "replay_cpu_ns_per_access" in lru:
            speed = s["replay_cpu_ns_per_access"] / max(lru["replay_cpu_ns_per_access"], 1e-9)
        else:
            speed = lru["replay_accesses_per_s"] / max(s["replay_accesses_per_s"], 1e-9) if lru else float("nan")
        ok = ratio <= 1.0 + 1e-9 and hr_pt >= -1.0
        fails += not ok
        line = (f"| {k[0]} | {k[1]}% | {s['total_jct_s']:.2f} | {bb} {rs[bb]['total_jct_s']:.2f} | "
                f"{'' if ok else '**'}{ratio:.3f}{'' if ok else '**'} | "
                f"{s['total_jct_s'] / max(lru['total_jct_s'], 1e-9):.3f} | {hr_pt:+.1f} | {worst} | {speed:.1f} |")
        if before and k in before and "strata" in before[k]:
            b = before[k]["strata"]["total_jct_s"]
            line += f" {b:.2f} | {s['total_jct_s'] / max(b, 1e-9):.3f} |"
        print(line)
    print(f"\n{fails} of {sum(1 for k in now if 'strata' in now[k])} (trace, capacity) pairs miss "
          "'JCT <= best baseline and hit ratio within 1 point'")
    if logs:
        print(f"geomean strata JCT / best baseline: {math.exp(sum(logs) / len(logs)):.4f} over {len(logs)}")
    if mixes:
        print(f"\nmulti-tenant mixes (targets: total <= {MIX_TOTAL_VS_LRU}x LRU, every tenant <= "
              f"{MIX_TENANT_VS_LRU}x its LRU JCT)\n")
        print("| trace | cap | total / LRU | worst tenant / its LRU | worst tenant | met |")
        print("|---|---|---|---|---|---|")
        met = 0
        for k, t, w, wj in mixes:
            ok = t <= MIX_TOTAL_VS_LRU + 1e-9 and w <= MIX_TENANT_VS_LRU + 1e-9
            met += ok
            print(f"| {k[0]} | {k[1]}% | {t:.3f} | {w:.2f} | {wj} | {'yes' if ok else 'no'} |")
        print(f"\n{met} of {len(mixes)} mix pairs meet both mix targets")


if __name__ == "__main__":
    main()
