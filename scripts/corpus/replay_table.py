#!/usr/bin/env python3
"""Markdown table of `strata bench replay --json` reports: one row per (trace, capacity,
policy), the best total JCT of each (trace, capacity) in bold.

  replay_table.py DIR   # reads DIR/<trace>-<capacity>.json
"""
import json
import os
import sys


def main():
    d = sys.argv[1]
    reports = []
    for name in os.listdir(d):
        if name.endswith(".json"):
            trace, cap = name[: -len(".json")].rsplit("-", 1)
            with open(os.path.join(d, name)) as f:
                reports.append((trace, int(cap), json.load(f)))
    print("| trace | capacity | policy | hit ratio | byte hit ratio | total JCT (s) | mean read (ms) |")
    print("|---|---|---|---|---|---|---|")
    for trace, cap, rep in sorted(reports, key=lambda r: (r[0], r[1])):
        best = min(r["total_jct_s"] for r in rep["results"] if r["policy"] != "opt")
        for r in rep["results"]:
            jct = f"{r['total_jct_s']:.2f}"
            if r["policy"] != "opt" and r["total_jct_s"] == best:
                jct = f"**{jct}**"
            print(
                f"| {trace} | {cap}% | {r['policy']} | {r['hit_ratio']:.3f} | "
                f"{r['byte_hit_ratio']:.3f} | {jct} | {r['mean_read_latency_ms']:.2f} |"
            )


if __name__ == "__main__":
    main()
