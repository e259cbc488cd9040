#!/usr/bin/env python3
# usage: scripts/corpus/h5_block_model.py tools/replay/traces/h5.csv.gz (docs/BENCHMARKS.md,
# "Resampled streams: told apart from shuffled epochs, and frequency does not pay").
# Block-level model of the recorded h5 trace: a read hits when every 1 MiB block it
# touches is resident; k blocks of cache; no prefetch, no sub-block units.
import collections, gzip, sys
rows = [l.strip().split(",") for l in gzip.open(sys.argv[1], "rt")][1:]
reads = [list(range(int(r[3]) >> 20, (int(r[3]) + int(r[4]) - 1 >> 20) + 1)) for r in rows]
cnt = collections.Counter(b for rd in reads for b in rd)
pos = collections.defaultdict(list)
for i, rd in enumerate(reads):
    for b in rd:
        pos[b].append(i)
for k in (6, 12, 25):
    top = {b for b, _ in cnt.most_common(k)}  # hindsight frequency: the k most read blocks
    static = sum(all(b in top for b in rd) for rd in reads)
    lru, hl = collections.OrderedDict(), 0
    cache, ptr, hb = set(), collections.Counter(), 0
    for i, rd in enumerate(reads):
        hl += all(b in lru for b in rd)
        for b in rd:
            lru.pop(b, None)
            lru[b] = 1
            if len(lru) > k:
                lru.popitem(last=False)
        hb += all(b in cache for b in rd)
        for b in rd:
            ptr[b] += 1
        for b in rd:
            if b not in cache:
                cache.add(b)
                if len(cache) > k:
                    nxt = lambda x: pos[x][ptr[x]] if ptr[x] < len(pos[x]) else 1 << 60
                    cache.remove(max((x for x in cache if x not in rd), key=nxt))
    n = len(reads)
    print(f"{k} blocks: hindsight top-k {static / n:.3f}  LRU {hl / n:.3f}  Belady {hb / n:.3f}")
