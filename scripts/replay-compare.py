#!/usr/bin/env python3
"""Replay results as markdown tables.

  compare.py DIR                 summary of one output dir (per trace/capacity/policy)
  compare.py BEFORE AFTER        side by side: before | after | delta, per metric
options:
  --metrics a,b,...   fields of each result (default hit_ratio,byte_hit_ratio,total_jct_s,
                      mean_read_latency_ms; others: jct_s, p99_read_latency_ms,
                      prefetch_bytes, prefetch_precision, accesses, replay_wall_s, ...)
  --changed-only      (two dirs) only rows where some metric differs
Files are DIR/<trace>-<capacity>.json as written by run.sh
(`strata bench replay --json`).
"""
import argparse, glob, json, os, re, sys

ORDER = ["train-small-files", "shards", "checkpoint", "preprocess", "inference-skew",
         "kv-prefix", "mixed", "mooncake-conversation", "mooncake-synthetic"]
DEFAULT = "hit_ratio,byte_hit_ratio,total_jct_s,mean_read_latency_ms"


def load(d):
    out = {}
    for f in glob.glob(os.path.join(d, "*.json")):
        m = re.fullmatch(r"(.+)-(\d+)\.json", os.path.basename(f))
        if not m:
            continue
        try:
            with open(f) as fh:
                r = json.load(fh)
        except (OSError, ValueError) as e:
            print(f"warning: {f}: {e}", file=sys.stderr)
            continue
        out[(m.group(1), int(m.group(2)))] = r
    return out


def key(k):
    t, c = k
    return (ORDER.index(t) if t in ORDER else len(ORDER), t, c)


def fmt(m, v):
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    if m.endswith("ratio") or m == "prefetch_precision":
        return f"{v:.4f}"
    return f"{v:.3f}"


def delta(m, a, b):
    if a is None or b is None or not all(isinstance(x, (int, float)) for x in (a, b)):
        return "-"
    d = b - a
    if d == 0:
        return "="
    s = f"{d:+.4f}" if m.endswith("ratio") else f"{d:+.3f}"
    if a != 0 and not m.endswith("ratio"):
        s += f" ({100 * d / abs(a):+.1f}%)"
    return s


def rows(rep):
    return {r["policy"]: r for r in rep.get("results", [])}


def header(rep):
    return (f"unique {rep['unique_bytes'] / 1e6:,.0f} MB, "
            f"capacity {rep['capacity_bytes'] / 1e6:,.1f} MB")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--metrics", default=DEFAULT)
    ap.add_argument("--changed-only", action="store_true")
    a = ap.parse_args()
    ms = a.metrics.split(",")
    if len(a.dirs) == 1:
        data = load(a.dirs[0])
        cur = None
        for k in sorted(data, key=key):
            t, c = k
            if t != cur:
                cur = t
                print(f"\n### {t}\n")
                print("| cap | policy | " + " | ".join(ms) + " |")
                print("|---|---|" + "---|" * len(ms))
            for p, r in rows(data[k]).items():
                print(f"| {c}% | {p} | " + " | ".join(fmt(m, r.get(m)) for m in ms) + " |")
        return
    if len(a.dirs) != 2:
        ap.error("one or two dirs")
    A, B = load(a.dirs[0]), load(a.dirs[1])
    print(f"before = `{a.dirs[0]}`, after = `{a.dirs[1]}`; delta = after - before "
          f"(`=`: identical)")
    for k in sorted(set(A) | set(B), key=key):
        if k not in A or k not in B:
            print(f"\n**{k[0]} {k[1]}%**: only in {'before' if k in A else 'after'}")
    cur, ndiff, ncells = None, 0, 0
    for k in sorted(set(A) & set(B), key=key):
        t, c = k
        ra, rb = rows(A[k]), rows(B[k])
        lines = []
        for p in list(ra) + [p for p in rb if p not in ra]:
            x, y = ra.get(p, {}), rb.get(p, {})
            diff = any(x.get(m) != y.get(m) for m in ms)
            ncells += len(ms)
            ndiff += sum(x.get(m) != y.get(m) for m in ms)
            if a.changed_only and not diff:
                continue
            cells = []
            for m in ms:
                cells += [fmt(m, x.get(m)), fmt(m, y.get(m)), delta(m, x.get(m), y.get(m))]
            lines.append(f"| {c}% | {p} | " + " | ".join(cells) + " |")
        if t != cur:
            cur = t
            print(f"\n### {t}\n")
            print("| cap | policy | " + " | ".join(f"{m} before | after | Δ" for m in ms) + " |")
            print("|---|---|" + "---|" * (3 * len(ms)))
        if A[k].get("unique_bytes") != B[k].get("unique_bytes"):
            print(f"| {c}% | (unique bytes differ: {A[k].get('unique_bytes')} vs "
                  f"{B[k].get('unique_bytes')}) |")
        print("\n".join(lines))
    print(f"\n{ndiff} of {ncells} compared values differ.")


if __name__ == "__main__":
    main()
