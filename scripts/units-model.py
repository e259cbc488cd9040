#!/usr/bin/env python3
"""An LRU model of fetch units for small reads (issue 13, `Granularity`): replays a
recorded trace through one LRU cache that holds whole 1 MiB blocks or sub-block units,
and prints each job's cost in the replay's link terms (GETs x 20 ms + bytes / 200 MB/s).

  scripts/units-model.py TRACE.csv.gz FILE_BYTES_FOR_CAPACITY PCT... [--path-has sqlite]

Modes: `block` (whole blocks), `dense1` (units until a unit of the block is cached, then
the block: `Granularity::dense_units` = 1), `never` (units always), `fits` (units for a
file more than twice the cache, else dense1: `Granularity::sparse_file_ratio` = 2).
Only reads of at most 64 KiB in files of at least 16 blocks whose path contains
`--path-has` are unit reads (the tracker's pattern is not modelled)."""
import argparse, collections, gzip

B = 1 << 20


def load(p):
    rows = []
    with gzip.open(p, 'rt') if p.endswith('.gz') else open(p) as f:
        for line in f:
            if line.startswith('ts'):
                continue
            _ts, job, path, off, ln, size = line.strip().split(',')
            rows.append((job, path, int(off), int(ln), int(size)))
    return rows


def model(rows, cap, unit, mode, path_has):
    cache = collections.OrderedDict()
    used = 0
    units_in = collections.Counter()
    cost = collections.Counter()

    def insert(k, sz):
        nonlocal used
        cache[k] = sz
        used += sz
        if k[0] == 'u':
            units_in[(k[1], k[2] * unit // B)] += 1
        while used > cap:
            kk, s = cache.popitem(last=False)
            used -= s
            if kk[0] == 'u':
                units_in[(kk[1], kk[2] * unit // B)] -= 1

    for job, path, off, ln, size in rows:
        for b in range(off // B, (off + ln - 1) // B + 1):
            if ('b', path, b) in cache:
                cache.move_to_end(('b', path, b))
                continue
            s, e = max(off, b * B), min(off + ln, (b + 1) * B)
            u0, u1 = s // unit, (e - 1) // unit
            if u0 == u1 and ('u', path, u0) in cache:
                cache.move_to_end(('u', path, u0))
                continue
            small = ln <= 64 << 10 and size >= 16 * B and path_has in path and u0 == u1
            dense = units_in[(path, b)] >= 1
            whole = (not small or mode == 'block' or (mode == 'dense1' and dense)
                     or (mode == 'fits' and size <= 2 * cap and dense))
            sz = B if whole else unit
            cost[job] += 0.02 + sz / 200e6
            insert(('b', path, b) if whole else ('u', path, u0), sz)
    return cost


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('trace')
    ap.add_argument('unique_bytes', type=float, help='bytes the capacity percentages are of')
    ap.add_argument('pcts', type=float, nargs='+')
    ap.add_argument('--path-has', default='')
    ap.add_argument('--unit', type=int, default=4096)
    a = ap.parse_args()
    rows = load(a.trace)
    for pct in a.pcts:
        cap = a.unique_bytes * pct / 100
        for mode in ('block', 'dense1', 'never', 'fits'):
            c = model(rows, cap, a.unit, mode, a.path_has)
            jobs = ' '.join(f'{j}={v:.1f}' for j, v in sorted(c.items()))
            print(f'{pct:g}% {mode:7} total {sum(c.values()):7.1f} s  {jobs}')


if __name__ == '__main__':
    main()
