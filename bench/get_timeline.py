#!/usr/bin/env python3
"""The object GETs of one read in s3rver's request log (bench/peer.py writes it to
<work>/s3rver.log, one line per request: METHOD PATH RANGE STATUS BYTES START_MS END_MS):
when each started and ended, its size, and how many were in flight, so a cold read's
ramp (first requests' sizes, time to the first byte, concurrency over time) can be
compared between systems.

Usage: bench/get_timeline.py <work>/s3rver.log [--path /bench/large.bin] [--skip N]
  --skip N: ignore the first N matching GETs (earlier runs in the same log); by default
  the log is split into runs at gaps of over 1 s and the last run is shown.
"""

import argparse
import statistics


def parse(path, want):
    rows = []
    with open(path, errors="replace") as f:
        for line in f:
            p = line.split()
            if len(p) < 7 or p[0] != "GET" or p[1] != want or not p[4].isdigit():
                continue
            rows.append((int(p[5]), int(p[6]), int(p[4]), p[2]))
    rows.sort()
    return rows


def runs(rows, gap_ms=1000):
    out, cur, last_end = [], [], None
    for r in rows:
        if last_end is not None and r[0] - last_end > gap_ms:
            out.append(cur)
            cur = []
        cur.append(r)
        last_end = r[1] if last_end is None else max(last_end, r[1])
    if cur:
        out.append(cur)
    return out


def in_flight_at(rows, t):
    return sum(1 for s, e, _, _ in rows if s <= t < e)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--path", default="/bench/large.bin")
    ap.add_argument("--run", type=int, default=-1, help="which run (split at 1 s gaps)")
    ap.add_argument("--first", type=int, default=24, help="GETs listed one by one")
    args = ap.parse_args()
    all_runs = runs(parse(args.log, args.path))
    print(f"{len(all_runs)} runs in the log: GETs {[len(r) for r in all_runs]}")
    rows = all_runs[args.run]
    t0 = rows[0][0]
    span = max(e for _, e, _, _ in rows) - t0
    mib = sum(b for _, _, b, _ in rows) / (1 << 20)
    print(f"run {args.run}: {len(rows)} GETs, {mib:.0f} MiB over {span} ms "
          f"({mib / max(span, 1) * 1000:.0f} MiB/s while GETs were open)")
    sizes = [b >> 10 for _, _, b, _ in rows]
    print(f"sizes KiB: median {statistics.median(sizes):.0f}, "
          f"distinct {sorted(set(sizes))[:12]}")
    print("first GETs: start_ms end_ms KiB in_flight_at_start")
    for s, e, b, _ in rows[: args.first]:
        print(f"  {s - t0:6d} {e - t0:6d} {b >> 10:6d} {in_flight_at(rows, s)}")
    step = 100
    print(f"in flight (and MiB completed) per {step} ms:")
    line = []
    for t in range(0, span + step, step):
        done = sum(b for _, e, b, _ in rows if t0 + t <= e < t0 + t + step) / (1 << 20)
        line.append(f"{t}:{in_flight_at(rows, t0 + t)}/{done:.0f}")
    print("  " + " ".join(line))


if __name__ == "__main__":
    main()
