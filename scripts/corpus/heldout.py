#!/usr/bin/env python3
"""Held-out programs: traces the policy was never tuned on (tools/replay/traces/heldout/).

The corpus of workloads.py drove issue 13's policy work; these programs were written
and recorded after that work stopped, to check that its figures carry over to other
programs, formats and parameters (other seeds, sizes and skews than the corpus's).
`heldout.py gen KIND DIR` writes a data set (deterministic, no downloads); `heldout.py
run KIND DIR` is the program whose reads `strata trace record` records.
scripts/record-heldout.sh runs both for every kind.

Kinds:
  duckdb    DuckDB (4 threads): aggregates and a filter over 8 snappy Parquet files
            (12 columns, 8 row groups), 4 queries touching different column sets
  sqlrange  Python's sqlite3: a table with a secondary index on a timestamp; a range
            scan over the index (uniform start, ~150 rows) every 32 point lookups by
            rowid (Zipf 0.8), 1 KiB pages
  zip       Python zipfile: one ~60 MB archive of 4,000 stored members (log-normal
            sizes), read in a shuffled order for 2 epochs by one process
  torch     torch.save / torch.load (zip format, mmap off): 3 checkpoints of ~24 MB
            loaded in turn, then the newest twice more (an evaluation loop)
  pandas    pandas.read_csv in 64 K-row chunks over 6 CSV files, then a second query
            over the same files with usecols: two full passes, the second a loop
  zarr      zarr v3: a 2-D float32 array in 128x128 chunks (one file per chunk), 600
            random 256x256 windows (Zipf-skewed over a grid of window origins)
  loader3   multiprocessing.Pool(8) over 4,000 small files in nested class dirs,
            chunksize 16, reshuffled for each of 3 epochs
  mixh      sqlrange, zip and pandas at once, each its own process group

Second round (recorded after the first round's findings were fixed, to check the fixes):
  zipdeflate  Python zipfile: an archive of 3,000 deflated members read in a shuffled
            order for 2 epochs (compressed data read in chunks, not 4 KiB pieces)
  sqljoin   Python's sqlite3, 4 KiB pages: orders joined to customers through an index,
            Zipf(1.2) customer lookups with their last orders (two tables, two indexes)
  h5cols    h5py: a gzip-compressed 2-D dataset in (256, 256) chunks, read as random
            column bands (every chunk row of a column of chunks) and random tiles
  tarrandom Python tarfile in random-access mode ('r:'): members of 8 tar shards
            extracted by name in a Zipf-skewed order (an indexed webdataset)
  parquetrg pyarrow ParquetFile.read_row_group: random row groups (Zipf 1.0) of 6 files,
            2 columns each, 300 reads
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import main as workloads_main, zipf_ranks  # noqa: E402  (the corpus's own)

SEED = 71  # not the corpus's 13


# --- duckdb -------------------------------------------------------------------------


def gen_duckdb(d):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(SEED)
    base = os.path.join(d, "events")
    os.makedirs(base, exist_ok=True)
    for p in range(8):
        n = 160_000
        cols = {f"m{j}": rng.standard_normal(n) for j in range(8)}
        cols["user_id"] = rng.integers(0, 50_000, n)
        cols["country"] = rng.integers(0, 60, n).astype(np.int32)
        cols["ts"] = np.sort(rng.integers(0, 86_400 * 30, n))
        cols["kind"] = rng.integers(0, 12, n).astype(np.int16)
        pq.write_table(pa.table(cols), os.path.join(base, f"part-{p:03d}.parquet"), row_group_size=20_000, compression="snappy")


def run_duckdb(d):
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads TO 4")
    con.execute("SET enable_object_cache TO false")
    glob = os.path.join(d, "events", "*.parquet")
    queries = [
        f"SELECT country, count(*), avg(m0) FROM read_parquet('{glob}') GROUP BY country",
        f"SELECT kind, sum(m1 * m2) FROM read_parquet('{glob}') WHERE ts < 86400 * 10 GROUP BY kind",
        f"SELECT user_id, max(m3) FROM read_parquet('{glob}') WHERE m3 > 3.0 GROUP BY user_id ORDER BY 2 DESC LIMIT 10",
        f"SELECT country, kind, avg(m0), avg(m4) FROM read_parquet('{glob}') GROUP BY ALL",
    ]
    for q in queries:
        print("duckdb:", len(con.execute(q).fetchall()), "rows")


# --- sqlite range scans -------------------------------------------------------------

SQLR_ROWS = 150_000


def gen_sqlrange(d):
    import sqlite3

    path = os.path.join(d, "events.db")
    if os.path.exists(path):
        os.remove(path)
    rng = random.Random(SEED)
    con = sqlite3.connect(path)
    con.execute("PRAGMA page_size=1024")
    con.execute("CREATE TABLE ev (id INTEGER PRIMARY KEY, ts INTEGER, body BLOB)")
    con.executemany(
        "INSERT INTO ev VALUES (?, ?, ?)",
        ((i, rng.randrange(10_000_000), rng.randbytes(150 + rng.randrange(250))) for i in range(SQLR_ROWS)),
    )
    con.execute("CREATE INDEX ev_ts ON ev(ts)")
    con.commit()
    con.close()


def run_sqlrange(d):
    import sqlite3

    rng = random.Random(SEED + 1)
    perm = list(range(SQLR_ROWS))
    rng.shuffle(perm)
    con = sqlite3.connect(os.path.join(d, "events.db"))
    con.execute("PRAGMA cache_size=-1000")
    points = iter(zipf_ranks(SQLR_ROWS, 0.8, 12_000, rng))
    n = 0
    for i in range(12_000):
        if i % 32 == 0:
            lo = rng.randrange(10_000_000 - 10_000)
            n += sum(len(r[0]) for r in con.execute("SELECT body FROM ev WHERE ts BETWEEN ? AND ?", (lo, lo + 10_000)))
        row = con.execute("SELECT body FROM ev WHERE id = ?", (perm[next(points)],)).fetchone()
        n += len(row[0])
    print(f"sqlrange: {n} bytes")


# --- zip archive --------------------------------------------------------------------


def gen_zip(d):
    import zipfile

    rng = random.Random(SEED)
    with zipfile.ZipFile(os.path.join(d, "images.zip"), "w", compression=zipfile.ZIP_STORED) as z:
        for i in range(4000):
            size = min(int(rng.lognormvariate(9.4, 0.7)), 300_000)  # median ~12 KB
            z.writestr(f"train/c{i % 40:02d}/img_{i:05d}.jpg", rng.randbytes(size))


def run_zip(d):
    import hashlib
    import zipfile

    rng = random.Random(SEED + 1)
    with zipfile.ZipFile(os.path.join(d, "images.zip")) as z:
        names = z.namelist()
        for epoch in range(2):
            rng.shuffle(names)
            h = 0
            for name in names:
                h ^= hashlib.md5(z.read(name)).digest()[0]
            print(f"zip: epoch {epoch}: {len(names)} members ({h})")


# --- torch checkpoints --------------------------------------------------------------


def gen_torch(d):
    import torch

    g = torch.Generator().manual_seed(SEED)
    base = os.path.join(d, "ckpt")
    os.makedirs(base, exist_ok=True)
    for step in (1000, 2000, 3000):
        sd = {f"block{b}.{w}": torch.randn(384, 1024, generator=g) for b in range(5) for w in ("q", "k", "v")}
        torch.save({"step": step, "model": sd}, os.path.join(base, f"step-{step}.pt"))


def run_torch(d):
    import torch

    base = os.path.join(d, "ckpt")
    names = sorted(os.listdir(base), key=lambda n: int(n.split("-")[1].split(".")[0]))
    total = 0.0
    for name in names + names[-1:] * 2:
        ck = torch.load(os.path.join(base, name), map_location="cpu", mmap=False, weights_only=True)
        total += sum(float(t[0, 0]) for t in ck["model"].values())
    print(f"torch: {total:.3f}")


# --- pandas -------------------------------------------------------------------------


def gen_pandas(d):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(SEED)
    base = os.path.join(d, "csv")
    os.makedirs(base, exist_ok=True)
    for p in range(6):
        n = 90_000
        pd.DataFrame(
            {
                "id": np.arange(p * n, (p + 1) * n),
                "store": rng.integers(0, 300, n),
                "price": rng.uniform(1, 500, n).round(2),
                "qty": rng.integers(1, 9, n),
                "note": rng.choice(["", "gift", "promo", "return", "bulk order"], n),
            }
        ).to_csv(os.path.join(base, f"sales-{p}.csv"), index=False)


def run_pandas(d):
    import pandas as pd

    base = os.path.join(d, "csv")
    files = sorted(os.listdir(base))
    total = 0.0
    for f in files:
        for chunk in pd.read_csv(os.path.join(base, f), chunksize=65_536):
            total += float((chunk["price"] * chunk["qty"]).sum())
    per_store = None
    for f in files:
        s = pd.read_csv(os.path.join(base, f), usecols=["store", "qty"]).groupby("store")["qty"].sum()
        per_store = s if per_store is None else per_store.add(s, fill_value=0)
    print(f"pandas: {total:.0f}, {len(per_store)} stores")


# --- zarr ---------------------------------------------------------------------------


def gen_zarr(d):
    import numpy as np
    import zarr

    rng = np.random.default_rng(SEED)
    z = zarr.create_array(os.path.join(d, "field.zarr"), shape=(4096, 4096), chunks=(128, 128), dtype="f4", compressors=None, overwrite=True)
    for r in range(0, 4096, 512):
        z[r : r + 512, :] = rng.standard_normal((512, 4096), dtype=np.float32)


def run_zarr(d):
    import zarr

    rng = random.Random(SEED + 1)
    z = zarr.open_array(os.path.join(d, "field.zarr"), mode="r")
    grid = [(r, c) for r in range(0, 4096 - 256, 64) for c in range(0, 4096 - 256, 64)]
    rng.shuffle(grid)
    total = 0.0
    for k in zipf_ranks(len(grid), 0.9, 600, rng):
        r, c = grid[k]
        total += float(z[r : r + 256, c : c + 256].mean())
    print(f"zarr: {total:.3f}")


# --- loader, 3 epochs ---------------------------------------------------------------


def gen_loader3(d):
    rng = random.Random(SEED)
    for i in range(4000):
        cd = os.path.join(d, "data", f"split{i % 4}", f"class{(i // 4) % 50:03d}")
        os.makedirs(cd, exist_ok=True)
        size = min(int(rng.lognormvariate(9.6, 0.8)), 500_000)  # median ~15 KB
        with open(os.path.join(cd, f"s{i:06d}.bin"), "wb") as f:
            f.write(rng.randbytes(size))


def load_sample(path):
    import zlib

    with open(path, "rb") as f:
        return zlib.crc32(f.read()) & 1


def run_loader3(d):
    from multiprocessing import Pool

    files = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(d, "data")) for f in fs)
    rng = random.Random(SEED + 1)
    with Pool(8) as pool:
        for epoch in range(3):
            order = files[:]
            rng.shuffle(order)
            print(f"loader3: epoch {epoch}: {sum(pool.imap(load_sample, order, chunksize=16))}")


# --- second round ---------------------------------------------------------------


def gen_zipdeflate(d):
    import zipfile

    rng = random.Random(SEED + 10)
    words = [bytes(rng.randrange(97, 123) for _ in range(rng.randrange(3, 9))) for _ in range(2000)]
    with zipfile.ZipFile(os.path.join(d, "docs.zip"), "w", compression=zipfile.ZIP_DEFLATED) as z:
        for i in range(3000):
            n = min(int(rng.lognormvariate(8.3, 0.9)), 60_000)  # ~4,000 words median
            text = b" ".join(rng.choice(words) for _ in range(n))
            z.writestr(f"shard{i % 10}/doc_{i:05d}.txt", text + rng.randbytes(n // 4))


def run_zipdeflate(d):
    import zipfile
    import zlib

    rng = random.Random(SEED + 11)
    with zipfile.ZipFile(os.path.join(d, "docs.zip")) as z:
        names = z.namelist()
        for epoch in range(2):
            rng.shuffle(names)
            c = 0
            for name in names:
                with z.open(name) as f:
                    while True:
                        b = f.read(65536)
                        if not b:
                            break
                        c = zlib.crc32(b, c)
            print(f"zipdeflate: epoch {epoch}: {len(names)} ({c})")


SQLJ_CUSTOMERS = 40_000
SQLJ_ORDERS = 250_000


def gen_sqljoin(d):
    import sqlite3

    path = os.path.join(d, "shop.db")
    if os.path.exists(path):
        os.remove(path)
    rng = random.Random(SEED + 20)
    con = sqlite3.connect(path)
    con.execute("PRAGMA page_size=4096")
    con.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, addr BLOB)")
    con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, cust INTEGER, ts INTEGER, body BLOB)")
    con.executemany(
        "INSERT INTO customer VALUES (?, ?, ?)",
        ((i, f"c{i}", rng.randbytes(100 + rng.randrange(100))) for i in range(SQLJ_CUSTOMERS)),
    )
    con.executemany(
        "INSERT INTO orders VALUES (?, ?, ?, ?)",
        ((i, rng.randrange(SQLJ_CUSTOMERS), i * 7, rng.randbytes(80 + rng.randrange(120))) for i in range(SQLJ_ORDERS)),
    )
    con.execute("CREATE INDEX orders_cust ON orders(cust, ts)")
    con.commit()
    con.close()


def run_sqljoin(d):
    import sqlite3

    rng = random.Random(SEED + 21)
    perm = list(range(SQLJ_CUSTOMERS))
    rng.shuffle(perm)
    con = sqlite3.connect(os.path.join(d, "shop.db"))
    con.execute("PRAGMA cache_size=-2000")
    n = 0
    for rank in zipf_ranks(SQLJ_CUSTOMERS, 1.2, 8000, rng):
        rows = con.execute(
            "SELECT c.name, o.ts, o.body FROM customer c JOIN orders o ON o.cust = c.id "
            "WHERE c.id = ? ORDER BY o.ts DESC LIMIT 3",
            (perm[rank],),
        ).fetchall()
        n += len(rows)
    print(f"sqljoin: {n} rows")


def gen_h5cols(d):
    import h5py
    import numpy as np

    rng = np.random.default_rng(SEED + 30)
    with h5py.File(os.path.join(d, "grid.h5"), "w") as f:
        f.create_dataset(
            "field",
            data=(rng.standard_normal((4096, 4096)) * 100).astype(np.int16),
            chunks=(256, 256),
            compression="gzip",
            compression_opts=1,
        )


def run_h5cols(d):
    import h5py

    rng = random.Random(SEED + 31)
    total = 0
    with h5py.File(os.path.join(d, "grid.h5"), "r", rdcc_nbytes=0) as f:
        ds = f["field"]
        for i in range(120):
            if i % 3 == 0:
                c = rng.randrange(0, 4096 - 64)
                total += int(ds[:, c : c + 64].sum())
            else:
                r, c = rng.randrange(0, 4096 - 512), rng.randrange(0, 4096 - 512)
                total += int(ds[r : r + 512, c : c + 512].sum())
    print(f"h5cols: {total}")


def gen_tarrandom(d):
    import io
    import tarfile

    rng = random.Random(SEED + 40)
    os.makedirs(os.path.join(d, "tars"), exist_ok=True)
    for s in range(8):
        with tarfile.open(os.path.join(d, "tars", f"part-{s:03d}.tar"), "w") as tar:
            for i in range(250):
                data = rng.randbytes(min(int(rng.lognormvariate(10.2, 0.6)), 400_000))
                info = tarfile.TarInfo(f"{s:03d}/{i:05d}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def run_tarrandom(d):
    import hashlib
    import tarfile

    rng = random.Random(SEED + 41)
    base = os.path.join(d, "tars")
    tars = {}
    index = []
    for name in sorted(os.listdir(base)):
        t = tarfile.open(os.path.join(base, name), "r:")
        tars[name] = t
        index += [(name, m) for m in t.getmembers()]
    rng.shuffle(index)
    h = 0
    for k in zipf_ranks(len(index), 0.9, 3000, rng):
        name, m = index[k]
        h ^= hashlib.sha1(tars[name].extractfile(m).read()).digest()[0]
    print(f"tarrandom: {h}")


def gen_parquetrg(d):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(SEED + 50)
    os.makedirs(os.path.join(d, "pq"), exist_ok=True)
    for p in range(6):
        n = 240_000
        cols = {f"f{j}": rng.standard_normal(n).astype(np.float32) for j in range(6)}
        cols["label"] = rng.integers(0, 1000, n)
        pq.write_table(pa.table(cols), os.path.join(d, "pq", f"train-{p}.parquet"), row_group_size=20_000, compression="none")


def run_parquetrg(d):
    import pyarrow.parquet as pq

    rng = random.Random(SEED + 51)
    base = os.path.join(d, "pq")
    files = [pq.ParquetFile(os.path.join(base, f), memory_map=False) for f in sorted(os.listdir(base))]
    groups = [(i, g) for i, f in enumerate(files) for g in range(f.num_row_groups)]
    rng.shuffle(groups)
    rows = 0
    for k in zipf_ranks(len(groups), 1.0, 300, rng):
        i, g = groups[k]
        rows += files[i].read_row_group(g, columns=["f0", "label"]).num_rows
    print(f"parquetrg: {rows}")


if __name__ == "__main__":
    workloads_main(globals(), __doc__)
