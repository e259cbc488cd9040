#!/usr/bin/env python3
"""The programs behind the recorded trace corpus (tools/replay/traces/).

`workloads.py gen KIND DIR` writes the data set of one kind (deterministic, no
downloads); `workloads.py run KIND DIR` is the program whose reads
`strata trace record` records. scripts/record-traces.sh runs both for every trace.

Kinds:
  sqlite   Python's sqlite3: point lookups by primary key, Zipf(1.1) over a random
           permutation of the keys, on a ~40 MB table (4 KiB pages)
  shards   Python tarfile in stream mode ('r|'), webdataset-style: 16 .tar shards of
           samples (.jpg-like payload + .cls), shard order shuffled, 2 epochs
  loader   multiprocessing.Pool(4) data loader: a folder of ~3000 small image-like
           files in 30 class dirs, shuffled each epoch, 2 epochs, a hash per sample
  npy      numpy: np.load of small .npy files, and large .npy files read in 256 KiB
           chunks (np.fromfile after the header) in a shuffled chunk order, 2 passes
  parquet  pyarrow: Parquet files of 8 columns x 4 row groups, scanned with
           projections (2-3 columns) by 3 queries
  h5       h5py: chunked 2-D datasets read in random row blocks
  safetensors  safetensors: full loads of 4 checkpoint shards (16 MiB each), then
           the first two again
  etl      Python csv: an ETL scan, a small dimension table loaded into a dict, then
           8 fact CSV partitions (~6 MB each) read once end to end, joined and
           aggregated (revenue per region and month)
"""

import os
import random
import sys

SEED = 13


_ZIPF_CDF = {}


def zipf_ranks(n, s, count, rng):
    """`count` draws of ranks 0..n-1 with P(k) ~ 1/(k+1)^s (inverse CDF on a table,
    kept between calls: a caller drawing a few ranks per batch builds it once)."""
    import bisect

    cdf = _ZIPF_CDF.get((n, s))
    if cdf is None:
        weights = [1.0 / (k + 1) ** s for k in range(n)]
        total = sum(weights)
        cdf, acc = [], 0.0
        for w in weights:
            acc += w / total
            cdf.append(acc)
        _ZIPF_CDF[(n, s)] = cdf
    return [min(bisect.bisect_left(cdf, rng.random()), n - 1) for _ in range(count)]


def scaled(n):
    return max(1, int(n * float(os.environ.get("SCALE", "1"))))


# --- sqlite -------------------------------------------------------------------------

SQLITE_ROWS = 100_000


def gen_sqlite(d):
    import sqlite3

    path = os.path.join(d, "kv.db")
    if os.path.exists(path):
        os.remove(path)
    rng = random.Random(SEED)
    con = sqlite3.connect(path)
    con.execute("PRAGMA page_size=4096")
    con.execute("CREATE TABLE kv (id INTEGER PRIMARY KEY, payload BLOB)")
    con.executemany(
        "INSERT INTO kv VALUES (?, ?)",
        ((i, rng.randbytes(300 + rng.randrange(200))) for i in range(SQLITE_ROWS)),
    )
    con.commit()
    con.close()


def open_shuffled(path, rows, cache_kib, rng):
    """A SQLite database opened with a page cache of `cache_kib` KiB, and the ids
    0..rows-1 shuffled by `rng` (so skewed ranks land on scattered rows)."""
    import sqlite3

    perm = list(range(rows))
    rng.shuffle(perm)
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA cache_size=-{cache_kib}")
    return perm, con


def run_sqlite(d):
    rng = random.Random(SEED + 1)
    # The default 2 MiB page cache.
    perm, con = open_shuffled(os.path.join(d, "kv.db"), SQLITE_ROWS, 2000, rng)
    n = 0
    for rank in zipf_ranks(SQLITE_ROWS, 1.1, scaled(20_000), rng):
        row = con.execute("SELECT payload FROM kv WHERE id = ?", (perm[rank],)).fetchone()
        n += len(row[0])
    print(f"sqlite: {n} bytes looked up")


# --- tar shards ---------------------------------------------------------------------

SHARDS = 16


def gen_shards(d):
    import io
    import tarfile

    rng = random.Random(SEED)
    os.makedirs(os.path.join(d, "shards"), exist_ok=True)
    for s in range(SHARDS):
        with tarfile.open(os.path.join(d, "shards", f"train-{s:04d}.tar"), "w") as tar:
            for i in range(64):
                key = f"{s:04d}_{i:05d}"
                size = int(rng.lognormvariate(10.8, 0.5))  # median ~50 KB
                for ext, data in (("jpg", rng.randbytes(size)), ("cls", b"%d" % rng.randrange(100))):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def run_shards(d):
    import hashlib
    import tarfile

    rng = random.Random(SEED + 1)
    names = sorted(os.listdir(os.path.join(d, "shards")))
    n = 0
    for _epoch in range(2):
        rng.shuffle(names)
        for name in names:
            with tarfile.open(os.path.join(d, "shards", name), "r|") as tar:
                for m in tar:
                    f = tar.extractfile(m)
                    if f is not None:
                        hashlib.sha1(f.read()).digest()
                        n += 1
    print(f"shards: {n} members")


# --- multiprocessing loader ----------------------------------------------------------

CLASSES = 30
PER_CLASS = 100


def gen_loader(d):
    rng = random.Random(SEED)
    for c in range(CLASSES):
        cd = os.path.join(d, "images", f"n{c:04d}")
        os.makedirs(cd, exist_ok=True)
        for i in range(PER_CLASS):
            size = min(int(rng.lognormvariate(9.9, 0.6)), 400_000)  # median ~20 KB
            with open(os.path.join(cd, f"img_{i:05d}.jpg"), "wb") as f:
                f.write(rng.randbytes(size))


def load_sample(path):
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()[0]


def run_loader(d):
    from multiprocessing import Pool

    root = os.path.join(d, "images")
    files = sorted(
        os.path.join(root, c, f) for c in sorted(os.listdir(root)) for f in os.listdir(os.path.join(root, c))
    )
    rng = random.Random(SEED + 1)
    with Pool(4) as pool:
        for epoch in range(2):
            order = files[:]
            rng.shuffle(order)
            s = sum(pool.imap(load_sample, order, chunksize=8))
            print(f"loader: epoch {epoch}: {len(order)} samples ({s})")


# --- numpy --------------------------------------------------------------------------


def gen_npy(d):
    import numpy as np

    rng = np.random.default_rng(SEED)
    os.makedirs(os.path.join(d, "npy"), exist_ok=True)
    for i in range(6):  # 8 MiB each
        np.save(os.path.join(d, "npy", f"feat-{i}.npy"), rng.standard_normal((2048, 1024), dtype=np.float32))
    for i in range(20):  # small label / index arrays
        np.save(os.path.join(d, "npy", f"labels-{i}.npy"), rng.integers(0, 1000, 5000, dtype=np.int64))


def run_npy(d):
    import numpy as np

    rng = random.Random(SEED + 1)
    base = os.path.join(d, "npy")
    total = 0.0
    for i in range(20):
        total += float(np.load(os.path.join(base, f"labels-{i}.npy")).sum())
    chunk_rows = 64  # 64 rows x 1024 float32 = 256 KiB
    for _pass in range(2):
        for i in rng.sample(range(6), 6):
            with open(os.path.join(base, f"feat-{i}.npy"), "rb") as f:
                version = np.lib.format.read_magic(f)
                read_header = {(1, 0): np.lib.format.read_array_header_1_0}.get(
                    version, np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(f)
                start = f.tell()
                row_bytes = shape[1] * dtype.itemsize
                chunks = list(range(shape[0] // chunk_rows))
                rng.shuffle(chunks)
                for c in chunks:
                    f.seek(start + c * chunk_rows * row_bytes)
                    a = np.fromfile(f, dtype=dtype, count=chunk_rows * shape[1])
                    total += float(a.mean())
    print(f"npy: {total:.3f}")


# --- parquet ------------------------------------------------------------------------


def gen_parquet(d):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(SEED)
    os.makedirs(os.path.join(d, "parquet"), exist_ok=True)
    for day in range(6):
        n = 200_000
        cols = {f"c{j}": rng.standard_normal(n) for j in range(6)}
        cols["user"] = rng.integers(0, 10_000, n)
        cols["label"] = rng.integers(0, 2, n)
        pq.write_table(pa.table(cols), os.path.join(d, "parquet", f"day={day}.parquet"), row_group_size=50_000, compression="none")


def run_parquet(d):
    import pyarrow.parquet as pq

    base = os.path.join(d, "parquet")
    files = sorted(os.listdir(base))
    for cols in (["user", "label"], ["user", "c0", "c1"], ["label", "c4"]):
        rows = 0
        for f in files:
            rows += pq.read_table(os.path.join(base, f), columns=cols, memory_map=False, use_threads=False).num_rows
        print(f"parquet: {cols}: {rows} rows")


# --- h5py ---------------------------------------------------------------------------


def gen_h5(d):
    import h5py
    import numpy as np

    rng = np.random.default_rng(SEED)
    with h5py.File(os.path.join(d, "data.h5"), "w") as f:
        for name in ("images", "masks"):
            f.create_dataset(name, data=rng.standard_normal((4096, 2048), dtype=np.float32), chunks=(64, 2048))


def run_h5(d):
    import h5py

    rng = random.Random(SEED + 1)
    total = 0.0
    with h5py.File(os.path.join(d, "data.h5"), "r", rdcc_nbytes=0) as f:
        for _ in range(scaled(400)):
            name = rng.choice(("images", "images", "masks"))
            r = rng.randrange(0, 4096 - 32)
            total += float(f[name][r : r + 32].mean())
    print(f"h5: {total:.3f}")


# --- safetensors --------------------------------------------------------------------


def gen_safetensors(d):
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(SEED)
    os.makedirs(os.path.join(d, "ckpt"), exist_ok=True)
    for s in range(4):
        tensors = {f"layer{s}.{i}.weight": rng.standard_normal((512, 1024), dtype=np.float32) for i in range(8)}
        save_file(tensors, os.path.join(d, "ckpt", f"model-{s:05d}-of-00004.safetensors"))


def run_safetensors(d):
    from safetensors.numpy import load

    base = os.path.join(d, "ckpt")
    files = sorted(os.listdir(base))
    total = 0.0
    # A full load of every shard (the way a loader reads a shard without mmap: safe_open
    # maps the file, and page-fault reads are invisible to strace), then the first two
    # again (a second process of the same job restarting).
    for f in files + files[:2]:
        with open(os.path.join(base, f), "rb") as fh:
            total += sum(float(t[0, 0]) for t in load(fh.read()).values())
    print(f"safetensors: {total:.3f}")


# --- ETL scan (csv) -----------------------------------------------------------------

ETL_PARTS = 8
ETL_ROWS = 110_000  # per partition: ~6 MB of CSV each
ETL_CUSTOMERS = 20_000


def gen_etl(d):
    import csv

    rng = random.Random(SEED)
    base = os.path.join(d, "etl")
    os.makedirs(base, exist_ok=True)
    regions = ["emea", "amer", "apac", "latam"]
    with open(os.path.join(base, "customers.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["customer_id", "region", "segment", "since"])
        for c in range(ETL_CUSTOMERS):
            w.writerow([c, rng.choice(regions), rng.choice(["retail", "smb", "corp"]), 2000 + rng.randrange(25)])
    order = 0
    for p in range(ETL_PARTS):
        with open(os.path.join(base, f"orders-{p:02d}.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["order_id", "date", "customer_id", "sku", "qty", "unit_price", "status"])
            for _ in range(ETL_ROWS):
                order += 1
                date = f"2026-{1 + rng.randrange(12):02d}-{1 + rng.randrange(28):02d}"
                status = "returned" if rng.random() < 0.05 else "shipped"
                w.writerow([order, date, rng.randrange(ETL_CUSTOMERS), f"SKU{rng.randrange(5000):05d}",
                            1 + rng.randrange(5), f"{rng.uniform(1, 200):.2f}", status])


def run_etl(d):
    import csv
    from collections import defaultdict

    base = os.path.join(d, "etl")
    # Default buffering, as an ETL script is written: 8 KiB reads, one pass per file.
    with open(os.path.join(base, "customers.csv"), newline="") as f:
        region = {int(r["customer_id"]): r["region"] for r in csv.DictReader(f)}
    revenue = defaultdict(float)
    rows = 0
    for name in sorted(n for n in os.listdir(base) if n.startswith("orders-")):
        with open(os.path.join(base, name), newline="") as f:
            for r in csv.DictReader(f):
                rows += 1
                if r["status"] == "shipped":
                    revenue[(region[int(r["customer_id"])], r["date"][:7])] += int(r["qty"]) * float(r["unit_price"])
    top = max(revenue.items(), key=lambda kv: kv[1])
    print(f"etl: {rows} rows, {len(revenue)} groups, top {top[0]} {top[1]:.0f}")


def main(kinds=None, doc=__doc__):
    """`gen KIND DIR` / `run KIND DIR` with the `gen_KIND` / `run_KIND` functions of
    `kinds` (this module's globals by default; heldout.py passes its own)."""
    kinds = globals() if kinds is None else kinds
    if len(sys.argv) != 4 or sys.argv[1] not in ("gen", "run"):
        sys.exit(doc)
    _, what, kind, d = sys.argv
    fn = kinds.get(f"{what}_{kind}")
    if fn is None:
        sys.exit(f"unknown kind {kind!r}\n{doc}")
    os.makedirs(d, exist_ok=True)
    fn(d)


if __name__ == "__main__":
    main()
