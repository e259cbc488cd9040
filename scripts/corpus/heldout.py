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

Third round (recorded 2026-12-02 afternoon on main at c91eb2d, to test generalization again):
  embed     numpy: embedding lookups, rows of two .npy tables (100,000 and 300,000 x 128
            float32) read one by one with np.fromfile after a seek (stdio buffered),
            Zipf 0.9 / 1.1 ids over a permutation, deduplicated per batch, 250 batches
  feather   pyarrow.feather.read_table(memory_map=False) with column projection: 150
            queries of 2-3 of 16 columns (a few hot ones) over 5 uncompressed Feather
            files (64 K-row record batches), the newest file the most (Zipf 1.0)
  tpslice   a safetensors checkpoint (3 shards) loaded tensor-parallel: 4 ranks at once
            (column-parallel weights one range each, row-parallel ones a piece per row),
            then 2 ranks, then 1 (the byte ranges get_slice touches, read with pread)
  cligrep   GNU grep -r, gzip -dc, tar -cf over a 3,000-file source tree and 8 gzip'd
            logs: whole-tree searches, a hot subtree searched again and again, the
            newest logs re-read
  jsonlog   a JSON-lines log query tool: each of 60 queries reads a small index file,
            seeks into 1-5 hourly segments through it and scans to the window's end,
            windows Zipf(1.1)-skewed to the newest hours
  valloader torch DataLoader (4 workers, shuffle) over 5,000 files for 3 epochs, and a
            validation set of 500 files (2 workers, in order) after each epoch
  mixh3     embed, jsonlog and cligrep at once, each its own process group

Fourth round (recorded 2026-12-03 07:00 UTC on main at dda8230):
  tokwin    a GPT pretraining sampler the way nanoGPT reads its data: random windows of
            1,025 uint16 tokens from a 96 MB train.bin (batches of 12, np.fromfile at
            an offset, the file opened per window), and every 100 steps an evaluation
            of 20 batches from train.bin and from a 6 MB val.bin
  lora      a multi-LoRA inference server: 120 safetensors adapters (1-6 MB), requests
            for adapters Zipf(1.0)-skewed, the process keeping the 6 most recently used
            loaded (vLLM's max_loras) and loading the others whole (read, then parsed by
            safetensors.numpy.load)

Fifth round (recorded 2026-12-03 on main at 2e1dab7, before any policy work on it):
  cheaders  gcc -fsyntax-only over 360 C files that each include 8-20 of 90 shared
            headers (Zipf-popular, include-guarded): a full build, then an edit-compile
            loop (30 rounds of 6 recently edited files), then a rebuild by 4 compilers at
            once; hot small headers re-read by every compiler amid a stream of cold sources
  audiocrop python `wave` under multiprocessing.Pool(4): 240 WAV files (16 kHz mono,
            8-60 s), 3 shuffled epochs, each sample a random 2 s crop (setpos, readframes)
  vodstream 6 threads playing videos: 150 files of 1-8 MB, Zipf(0.9) popularity, each
            play starting at 0 (70%) or a random seek, reading 256 KiB chunks for a random
            share of the file, 900 plays
  mixh4     cheaders, audiocrop and vodstream at once, each its own process group

Sixth round (recorded 2026-12-03 on main at c1a8b73, before any policy work on it):
  pyimport  24 short-lived Python processes, 4 at a time, each its own session (a service's
            workers restarting): each imports a Zipf-popular set of modules from a tree of
            30 packages x 16 compiled modules that import each other (the .pyc files read
            whole, the sources only stat'ed), a shared hot set read by every process
  ivfsearch an IVF vector index on disk: 1,024 inverted lists of 64-d float32 vectors in one
            file (sizes log-normal), the centroids and offsets read once; 4 threads answer
            1,200 queries, each reading the 8 lists nearest to it (np.fromfile at an
            offset), queries drawn near Zipf(1.0)-popular clusters
  mixh5     pyimport, ivfsearch and tokwin at once, each its own process group

Seventh round (recorded 2026-12-03 after the sixth round's readahead change, before any
policy work on it):
  diskann   a DiskANN-style graph index on disk: 200,000 nodes of 256 B (a 32-d vector and
            32 neighbour ids) in 4 KiB pages, compressed vectors in memory; 2 threads run
            1,500 beam searches from the medoid, each reading the pages of the nodes it
            expands (pread), query targets Zipf(1.0)-popular clusters
  tfinterleave  a tf.data-style reader: 16 record shards (length-prefixed records of 20-80
            KB), 4 shards read at once a record from each in turn (cycle length 4), shard
            order reshuffled for each of 2 epochs
  mixh6     diskann, tfinterleave and lora at once, each its own process group

Eighth round (recorded 2026-12-03 after the recency guard, before any policy work on it):
  lsmkv     a LevelDB-style store: 20 sorted tables of 4 KiB data blocks (an index block
            and footer at each table's end); 4 threads run 12,000 point lookups of
            Zipf(0.9)-popular keys scattered over the key space, through a table cache of
            6 open tables (opening one reads its footer and index), and every 2,000
            lookups a verification pass reads 2 tables whole in 256 KiB pieces
  ragdocs   a retrieval store: 30,000 JSON documents (0.5-6 KB) in 8 JSON-lines shards,
            grouped by topic, located through an offsets table read at start; 4 threads
            answer 3,000 queries, each fetching 6 documents of a Zipf(0.9)-popular topic
            (its best documents more often) and 2 anywhere, one pread each
  mixh7     lsmkv, ragdocs and jsonlog at once, each its own process group

Ninth round (recorded 2026-12-03 evening, after two dropped policy experiments, before any
policy work on it):
  tileserve a tiled-image (whole-slide) viewer server: one 6-level pyramid file of JPEG-like
            tiles (6-40 KB) behind a tile offset table read at start; 4 threads serve 400
            viewing sessions, each zooming from the lowest resolution into a Zipf(1.0)-
            popular region of interest (a 4x3-tile viewport per level, one pread a tile),
            panning a few steps at full resolution, then zooming out
  restore   a restic-style backup restore: 70 pack files (4 MB) of content-defined chunks
            (32-512 KB) and an index read at start; three snapshots share most chunks (each
            newer one rewrites a fifth of the files); restore the newest snapshot, then
            the oldest, 2 workers taking files in turn, each chunk one pread from its pack,
            then a check reading a fifth of the packs whole
  mixh8     tileserve, restore and sqljoin at once, each its own process group

Tenth round (recorded 2026-12-03 night, after this session's two dropped guard and main
experiments, before any policy work on it):
  ftsearch  SQLite FTS5 full-text search (Python's sqlite3, 4 KiB pages, the default 2 MB
            page cache): 30,000 documents of 60-400 words over a Zipf(1.1) vocabulary;
            one connection answers 900 queries of 1-3 terms (queries Zipf(0.9)-popular
            from a set of 400), each the 10 best matches by rank, then the full text of
            the first 3
  headscan  an image-dataset indexer then trainer: 5,000 PNG files (log-normal, ~50 KB) in
            50 class directories; the header of every file parsed in listing order (the
            signature and IHDR through a buffered read), then 2 shuffled epochs by
            multiprocessing.Pool(4) over the files whose header passes a size filter (about
            40%), each read whole
  mixh9     ftsearch, headscan and embed at once, each its own process group

Eleventh round (recorded 2026-12-03 night, after this session's readahead-bound experiment
was dropped, before any policy work on it):
  mboxsearch  Python `mailbox.mbox`: a 93 MB mbox of 20,000 messages (1-6 KB bodies, 4% with
            an 8-32 KB attachment); opening it scans the whole file for its table of contents,
            then 3,000 reads of messages Zipf(1.0)-popular by thread (the newest threads the
            most), and every 600 reads a search of the last 2,000 messages' bodies
  bisectlog a sorted access log (1.6 M lines, 90 MB) searched the way `look` does: 2,500
            lookups of timestamps (Zipf(0.9) over the last day's minutes), each a binary
            search of seek + readline probes (4 KiB buffered), then the matching lines read
            forward
  mixh10    mboxsearch, bisectlog and tileserve at once, each its own process group

Twelfth round (recorded 2026-12-04, after this session's window and guard changes, before
any policy work on it):
  dbmlookup Python's `dbm.dumb`: 150,000 keys with 200-1,200-byte values (a 143 MB .dat
            file of 512-byte-aligned values and its .dir index, read whole at open); 40,000 lookups of Zipf(0.9)-
            popular keys (each a seek + read of the .dat file, opened per lookup as
            dbm.dumb does), and every 8,000 lookups a report reading the values of one
            key prefix in insertion order (1/16 of the keys)
  csvloop   a dashboard refresh run 3 times: Python's csv module over 3 CSV files (4 MB
            customers, 17 MB orders, 30 MB events); per refresh an aggregate over orders,
            a hash join of customers (build) with orders (probe) and a filtered count
            over events, each a full sequential pass
  mixh11    dbmlookup, csvloop and sqlrange at once, each its own process group

Thirteenth round (recorded 2026-12-04, before any policy work on it; real command-line
tools, driven from Python):
  tarlist   GNU tar with --seek over an uncompressed 148 MB archive of 4,000 members
            (log-normal sizes): 6 rounds of a verbose listing (each member's header read,
            its data skipped by lseek) and an extraction to stdout of 30 members named
            Zipf(1.0)-skewed (tar scans the headers up to each, reads the named ones)
  cmpjoin   coreutils over sorted CSV snapshots: 3 rounds of `join` of an 18 MB customer
            file with a 42 MB order file (two streams read in lockstep), `cmp` of
            yesterday's and today's 42 MB order snapshots (differing near the end) and
            `tail -c` of the newest 4 MB of today's
  mixh12    tarlist, cmpjoin and ftsearch at once, each its own process group

Fourteenth round (recorded 2026-12-04, after the tenant-sparing change, before any policy
work on it; real command-line tools again):
  difftree  GNU diff -rq of a source tree against its copy (3,000 files, log-normal sizes,
            one in 20 changed), 3 times, then `diff -u` of the changed files (both trees
            read file by file in lockstep)
  verify    `sha256sum -c` of a manifest over 2,000 files (110 MB), split 4 ways with
            `xargs -P 4`, twice (a dataset integrity check: every file read whole, 4
            readers at once)
  mixh13    difftree, verify and dbmlookup at once, each its own process group

Fifteenth to seventeenth rounds (2026-12-04, each before any policy work on it):
  httpstatic `python3 -m http.server` serving 4,000 files to 4 clients, Zipf popularity
            that shifts halfway
  sortmerge GNU sort -m merging 48 sorted runs (48 streams read in turns)
  mixh14    httpstatic, sortmerge and bisectlog at once
  logtail   GNU tail over Zipf-popular service logs (seek to the end, read back)
  grepshards GNU grep -c over 2-6 Zipf-popular text shards per query
  mixh15    logtail, grepshards and tarlist at once
  zipimport 24 Python interpreters importing modules from one zipped bundle
  arlink    GNU ld linking 30 programs against a 600-object static archive
  mixh16    zipimport, arlink and httpstatic at once

Eighteenth round (recorded 2026-12-04 on main at c04f447, before any policy work on it):
  tacscan   GNU tac (a file read backwards, 8 KiB at a time) piped to grep -m 20 ERROR over
            Zipf-popular service logs, and now and then a whole reversed log
  symbolize addr2line over 10 binaries built with -g (Zipf-popular): each request reads
            the ELF headers and whole debug sections again
  graphwalk GraphSAGE-style 2-hop neighbour sampling over a CSR graph on disk: 16-byte
            offset reads and neighbour lists of a few dozen bytes, 4 threads
  mixh17    tacscan, symbolize and graphwalk at once

Nineteenth round (recorded 2026-12-04 after the backward and cycle readahead, before any
policy work on it):
  parload   a parallel checkpoint loader: 8 threads of one process each read an eighth of a
            48 MB shard in 1 MiB reads, shard after shard, the model loaded twice
  sqldesc   SQLite feed pages: ORDER BY id DESC LIMIT 200 from Zipf-recent points (the
            rowid B-tree read backwards), and counts over the last hour through an index
  mixh18    parload, sqldesc and tacscan at once

Twentieth round (recorded 2026-12-04 on main at a5bd4da, before any policy work on it):
  sweep     a hyperparameter sweep: 3 trials of one training script, 1.5 s apart, each its
            own session with multiprocessing.Pool(2), each reading one image folder (2,400
            files, log-normal ~54 KiB) for 2 epochs shuffled by its own seed
  ckptavg   checkpoint averaging over a sliding window of 4 of 6 safetensors checkpoints
            (~32 MB, bf16): each tensor read from all 4 files with pread, in the model's
            order (layers.2 before layers.10) over a name-sorted layout
  bgzf      region queries over 3 samples' BGZF files (BAM-like deflate blocks <= 64 KiB, an
            index read whole at start): 700 regions of 2-60 kb around Zipf(1.0)-popular
            genes, each read in all 3 samples block by block through a buffered reader
  mixh19    sweep, ckptavg and bgzf at once

Twenty-first round (recorded 2026-12-04 on main at 19d5247, before any policy work on it):
  balanced  a class-balanced sampler with replacement over an imbalanced image folder (8
            classes of 1,200 down to 10 files): 3 epochs of 2,400 draws, a class uniformly,
            then a file of it, read whole by multiprocessing.Pool(4)
  curriculum curriculum training over 3,000 files ranked by a difficulty score read from a
            JSON file: epoch 1 the easiest third, epoch 2 two thirds, epochs 3-4 all,
            shuffled each epoch, read by 4 threads
  dedup     fdupes' algorithm over a 4,000-file tree: sizes by stat, the first 4 KiB of
            every file in a same-size group, whole-file hashes where heads collide, then
            a byte-by-byte comparison of each duplicate pair in 8 KiB steps
  mixh20    balanced, curriculum and dedup at once

Twenty-second round (recorded 2026-12-04 on main at 680fb1a, before any policy work on it):
  mixture   a pretraining data mixture: 3 sources of token shards (2, 8 and 24 shards of
            4 MB) drawn with weights 0.5 / 0.3 / 0.2, each draw a 32 KiB window at a
            random offset of a random shard of the source, by 2 processes
  traineval webdataset-style training: 2 worker processes stream their own tar shards in
            64 KiB reads, and every 150 training samples the main process evaluates on a
            40-file validation set read whole in name order
  mixh21    mixture, traineval and curriculum at once

Twenty-third round (recorded 2026-12-04 on main at e819d02, before any policy work on it):
  casstore  a content-addressed blob store (a build cache, a model hub's blobs): 4,000
            blobs under objects/ab/cdef..., named by their sha256, looked up by 4
            threads with Zipf(1.0) popularity unrelated to the names, each read whole
  resampled webdataset's ResampledShards: 2 worker processes each draw 20 of 16 tar
            shards uniformly with replacement and stream every draw front to back in
            64 KiB reads
  mixh22    casstore, resampled and lsmkv at once

Twenty-fourth round (recorded 2026-12-04 on main at 92beee1, before any policy work on it):
  hfhub     a model server with 2 model slots over a hub cache of 6 models (blobs named by
            sha256, snapshots naming them): 80 requests, Zipf(1.2) over the models; a
            request for a model not in a slot evicts the least recently used one and
            loads the new one's config and safetensors shards whole (header, then 16 MiB
            reads)
  unziplookups  Info-ZIP `unzip -p`, one process per lookup: 300 members of a 3,000-member
            archive, Zipf(1.1) over the members; each run reads the archive's end, its
            central directory and the member
  mixh23    hfhub, unziplookups and resampled at once

Twenty-fifth round (recorded 2026-12-04 on main at 4f82c91, before any policy work on it):
  driftserve  a Node.js static file server (fs.createReadStream) under 4 keep-alive clients:
            6,000 requests over 3,000 posts published during the run, three quarters
            Zipf(1.0) back from the newest, a quarter to evergreen posts
  jqwindow  100 `jq` processes over hourly JSONL logs, each reading the last 6 hours
            whole (every 12th the last 24) as the window slides
  mixh24    driftserve, jqwindow and sqljoin at once

Twenty-sixth round (recorded 2026-12-04, policy of 92beee1, before any work on it):
  nodestart  a Node.js CLI started 30 times over a 60-package node_modules, each start
            loading a core and one Zipf(1.0)-drawn subcommand's modules
  zstdepochs  2 epochs of `xargs -P 2 zstd -dc` over 120 shuffled compressed shards
  mixh25    nodestart, zstdepochs and hfhub at once

Twenty-seventh round (recorded 2026-12-04, policy of 92beee1, before any work on it):
  nmsyms    GNU `nm -D` over 240 of the machine's shared libraries (xargs -P 2), then
            300 single-library lookups, Zipf(1.0)
  mixh26    nmsyms, driftserve and zstdepochs at once

Twenty-eighth round (recorded 2026-12-05, policy of a3127d0, before any work on it):
  tenantdb  a database-per-tenant web app (Python's sqlite3, a connection per request as
            Django opens them): 240 tenant SQLite files, 4 threads, 800 requests over a
            simulated day whose hot tenants follow their time zones' business hours
  kafkalag  a Kafka broker's fetch path over 3 partitions of segments and sparse offset
            indexes as the producer appends: consumer groups at the head, 4 MB and 14 MB
            behind, and one replaying from the earliest offset in 1 MiB fetches
  ecobjects a MinIO-style EC 4+2 bucket on 6 drives: 1,500 Zipf(1.0) GETs by 4 threads,
            each reading xl.meta on every drive (small objects inline) and a large
            object's 256 KiB shards from 4 drives block by block; a drive offline for a
            third of the run
  mixh27    tenantdb, kafkalag and ecobjects at once
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import main as workloads_main, open_shuffled, zipf_ranks  # noqa: E402  (the corpus's own)

SEED = 71  # not the corpus's 13


def _noise(rng, n):
    """`n` random bytes (incompressible file content), drawn from `rng`."""
    return bytes(rng.randrange(256) for _ in range(n))


def _noise_slice(rng, noise, n):
    """`n` bytes of `noise` from a random offset, wrapping around (distinct contents of
    any length without drawing every byte)."""
    start = rng.randrange(len(noise))
    return (noise[start:] + noise)[:n]


def _clamped_lognormal(rng, mu, sigma, lo, hi):
    """A log-normal draw (a file or record size) clamped to `[lo, hi]`, as an int."""
    return int(min(hi, max(lo, rng.lognormvariate(mu, sigma))))


def _write_tar(path, members):
    """A tar archive at `path` of `members`, (name, bytes) pairs in order (a webdataset
    shard)."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def files_under(root):
    """Every file below `root`, sorted by path (a program's listing order, the same on
    every run)."""
    return sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs)


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
    rng = random.Random(SEED + 1)
    perm, con = open_shuffled(os.path.join(d, "events.db"), SQLR_ROWS, 1000, rng)
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

    files = files_under(os.path.join(d, "data"))
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
    rng = random.Random(SEED + 21)
    perm, con = open_shuffled(os.path.join(d, "shop.db"), SQLJ_CUSTOMERS, 2000, rng)
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
    rng = random.Random(SEED + 40)
    os.makedirs(os.path.join(d, "tars"), exist_ok=True)
    for s in range(8):
        _write_tar(
            os.path.join(d, "tars", f"part-{s:03d}.tar"),
            (
                (f"{s:03d}/{i:05d}.bin",
                 rng.randbytes(min(int(rng.lognormvariate(10.2, 0.6)), 400_000)))
                for i in range(250)
            ),
        )


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


# --- third round --------------------------------------------------------------------

EMB_DIM = 128
EMB_USERS = 100_000
EMB_ITEMS = 300_000


def gen_embed(d):
    import numpy as np

    rng = np.random.default_rng(SEED + 60)
    for name, n in (("user", EMB_USERS), ("item", EMB_ITEMS)):
        np.save(os.path.join(d, f"{name}_emb.npy"), rng.standard_normal((n, EMB_DIM), dtype=np.float32))


def run_embed(d):
    import numpy as np

    rng = random.Random(SEED + 61)
    tables = {}
    for name, n, s in (("user", EMB_USERS, 0.9), ("item", EMB_ITEMS, 1.1)):
        f = open(os.path.join(d, f"{name}_emb.npy"), "rb")
        np.lib.format.read_magic(f)
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        perm = list(range(n))
        rng.shuffle(perm)
        tables[name] = (f, f.tell(), dtype, perm, n, s)
    total = 0.0
    for step in range(250):
        for name, per_batch in (("user", 32), ("item", 256)):
            f, base, dtype, perm, n, s = tables[name]
            ids = sorted({perm[k] for k in zipf_ranks(n, s, per_batch, rng)})
            for i in ids:
                f.seek(base + i * EMB_DIM * dtype.itemsize)
                total += float(np.fromfile(f, dtype=dtype, count=EMB_DIM)[0])
    print(f"embed: {total:.3f}")


FEATHER_COLS = ["ts", "user", "value", "latency", "bytes", "status", "region", "score"] + [f"x{j}" for j in range(8)]


def gen_feather(d):
    import numpy as np
    import pyarrow as pa
    import pyarrow.feather as feather

    rng = np.random.default_rng(SEED + 70)
    os.makedirs(os.path.join(d, "days"), exist_ok=True)
    for day in range(5):
        n = 450_000
        cols = {}
        for j, c in enumerate(FEATHER_COLS):
            if c in ("ts",):
                cols[c] = np.sort(rng.integers(day * 86_400, (day + 1) * 86_400, n))
            elif c in ("user", "status", "region", "bytes"):
                cols[c] = rng.integers(0, 10_000, n)
            else:
                cols[c] = rng.standard_normal(n)
        feather.write_feather(pa.table(cols), os.path.join(d, "days", f"day-{day}.feather"), compression="uncompressed", chunksize=65_536)


def run_feather(d):
    import pyarrow.compute as pc
    import pyarrow.feather as feather

    rng = random.Random(SEED + 71)
    days = sorted(os.listdir(os.path.join(d, "days")))
    hot = ["ts", "value", "latency", "status"]
    total = 0.0
    for q in range(150):
        day = days[len(days) - 1 - zipf_ranks(len(days), 1.0, 1, rng)[0]]  # the newest most
        cols = sorted({hot[k] for k in zipf_ranks(len(hot), 0.8, 2, rng)} | {FEATHER_COLS[rng.randrange(len(FEATHER_COLS))]})
        t = feather.read_table(os.path.join(d, "days", day), columns=cols, memory_map=False)
        total += float(pc.sum(t.column(cols[-1])).as_py() or 0)
    print(f"feather: {total:.3f}")


TP_LAYERS = 6
TP_DIM = 1024
TP_FFN = 2048
TP_VOCAB = 8000


def gen_tpslice(d):
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(SEED + 80)
    os.makedirs(os.path.join(d, "ckpt"), exist_ok=True)
    shards = 3
    for s in range(shards):
        t = {}
        if s == 0:
            t["tok_embeddings.weight"] = rng.standard_normal((TP_VOCAB, TP_DIM), dtype=np.float32)
        for layer in range(s * TP_LAYERS // shards, (s + 1) * TP_LAYERS // shards):
            p = f"layers.{layer}."
            for w in ("wq", "wk", "wv", "wo"):
                t[p + f"attention.{w}.weight"] = rng.standard_normal((TP_DIM, TP_DIM), dtype=np.float32)
            t[p + "feed_forward.w1.weight"] = rng.standard_normal((TP_FFN, TP_DIM), dtype=np.float32)
            t[p + "feed_forward.w2.weight"] = rng.standard_normal((TP_DIM, TP_FFN), dtype=np.float32)
            t[p + "attention_norm.weight"] = np.ones(TP_DIM, dtype=np.float32)
        save_file(t, os.path.join(d, "ckpt", f"model-{s + 1:05d}-of-{shards:05d}.safetensors"))


def tp_load_rank(d, rank, world):
    """One tensor-parallel rank's part of every tensor, read the way safetensors'
    `safe_open(...).get_slice` touches the file (it maps the file, and page faults are
    invisible to strace, so the same byte ranges are read with pread): the header, then
    for column-parallel weights (dim 0 split) one contiguous range, for row-parallel ones
    (`wo`, `w2`: dim 1 split) one piece per row; norms whole."""
    import json
    import struct

    import numpy as np

    base = os.path.join(d, "ckpt")
    total = 0.0
    for name in sorted(os.listdir(base)):
        fd = os.open(os.path.join(base, name), os.O_RDONLY)
        try:
            (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            meta = json.loads(os.pread(fd, n, 8))
            meta.pop("__metadata__", None)
            for key, m in sorted(meta.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                start = 8 + n + m["data_offsets"][0]
                shape = m["shape"]
                if len(shape) == 1:
                    buf = os.pread(fd, shape[0] * 4, start)
                elif world > 1 and key.endswith(("wo.weight", "w2.weight")):
                    cols = shape[1] // world
                    row = shape[1] * 4
                    buf = b"".join(os.pread(fd, cols * 4, start + r * row + rank * cols * 4) for r in range(shape[0]))
                else:
                    rows = shape[0] // world
                    row = shape[1] * 4
                    buf = os.pread(fd, rows * row, start + rank * rows * row)
                total += float(np.frombuffer(buf, dtype=np.float32)[:4].sum())
        finally:
            os.close(fd)
    return total


def run_tpslice(d):
    from multiprocessing import Pool

    # A tensor-parallel launch of 4 ranks, each loading its slices at once, then an
    # elastic restart on 2 ranks (other slices of the same bytes), then one rank of an
    # evaluation job on a single device (the whole of every tensor).
    for world in (4, 2):
        with Pool(world) as pool:
            parts = pool.starmap(tp_load_rank, [(d, r, world) for r in range(world)])
        print(f"tpslice: tp={world}: {sum(parts):.3f}")
    print(f"tpslice: tp=1: {tp_load_rank(d, 0, 1):.3f}")


def _text_pool(rng, nbytes):
    words = [bytes(rng.randrange(97, 123) for _ in range(rng.randrange(2, 10))) for _ in range(3000)]
    words += [b"TODO", b"alloc_page", b"lock_acquire", b"ERROR", b"WARN", b"return", b"struct", b"static"]
    lines, size = [], 0
    while size < nbytes:
        indent = b"    " * rng.randrange(0, 4)
        line = indent + b" ".join(rng.choice(words) for _ in range(rng.randrange(2, 14))) + b";\n"
        lines.append(line)
        size += len(line)
    return b"".join(lines)


def gen_cligrep(d):
    import gzip

    rng = random.Random(SEED + 90)
    pool = _text_pool(rng, 1 << 20)
    subsystems = ["kernel", "mm", "fs", "net", "drivers", "crypto", "lib", "sound", "block", "ipc"]
    for i in range(3000):
        sub = subsystems[i % len(subsystems)]
        dd = os.path.join(d, "src", sub, f"d{(i // len(subsystems)) % 12:02d}")
        os.makedirs(dd, exist_ok=True)
        n = min(int(rng.lognormvariate(10.3, 0.8)), 600_000)  # median ~30 KB
        at = rng.randrange(0, len(pool) - n) if n < len(pool) else 0
        with open(os.path.join(dd, f"f{i:05d}.c"), "wb") as f:
            f.write(b"/* file %d */\n" % i + pool[at : at + n])
    os.makedirs(os.path.join(d, "logs"), exist_ok=True)
    for k in range(8):
        parts = []
        for _ in range(200):
            at = rng.randrange(0, len(pool) - 100_000)
            parts.append(b"[%d] " % rng.randrange(1 << 30) + pool[at : at + 100_000])
        with open(os.path.join(d, "logs", f"app-{k:02d}.log.gz"), "wb") as f:
            f.write(gzip.compress(b"".join(parts), compresslevel=6))


CLIGREP_SCRIPT = r"""
set -u
g() { grep "$@" > /dev/null || true; }
g -rn TODO src                                  # a whole-tree search
for p in alloc_page lock_acquire 'static struct' alloc_page; do
  g -rl "$p" src/mm src/kernel                   # the subsystem being worked on, again and again
done
gzip -dc logs/app-00.log.gz logs/app-01.log.gz logs/app-02.log.gz logs/app-03.log.gz \
  logs/app-04.log.gz logs/app-05.log.gz logs/app-06.log.gz logs/app-07.log.gz | grep -c ERROR || true
tar -cf - src/mm src/kernel | wc -c             # a backup of what changed
g -rn lock_acquire src/fs src/mm src/kernel
gzip -dc logs/app-06.log.gz logs/app-07.log.gz | grep -c WARN || true   # the newest logs again
g -rwn return src                                # the whole tree again
g -rl TODO src/mm src/kernel
"""


def run_cligrep(d):
    import subprocess

    subprocess.run(["bash", "-c", CLIGREP_SCRIPT], cwd=d, check=True)
    print("cligrep: done")


JSONLOG_SEGMENTS = 24
JSONLOG_LINES = 75_000
JSONLOG_EVERY = 500


def gen_jsonlog(d):
    import json

    rng = random.Random(SEED + 100)
    os.makedirs(os.path.join(d, "logs"), exist_ok=True)
    msgs = [" ".join(f"w{rng.randrange(5000)}" for _ in range(rng.randrange(3, 12))) for _ in range(4000)]
    index = {"segments": []}
    for s in range(JSONLOG_SEGMENTS):
        name = f"seg-{s:04d}.jsonl"
        marks, off = [], 0
        with open(os.path.join(d, "logs", name), "wb") as f:
            for i in range(JSONLOG_LINES):
                ts = s * 3600 + i * 3600 // JSONLOG_LINES
                lvl = "ERROR" if rng.random() < 0.02 else ("WARN" if rng.random() < 0.1 else "INFO")
                line = json.dumps(
                    {"ts": ts, "svc": f"svc-{rng.randrange(40)}", "lvl": lvl, "msg": rng.choice(msgs), "trace": "%016x" % rng.getrandbits(64)}
                ).encode() + b"\n"
                if i % JSONLOG_EVERY == 0:
                    marks.append([ts, off])
                f.write(line)
                off += len(line)
        index["segments"].append({"name": name, "start": s * 3600, "end": (s + 1) * 3600, "marks": marks})
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(index, f)


def run_jsonlog(d):
    import bisect
    import json

    rng = random.Random(SEED + 101)
    hits = 0
    for q in range(60):
        with open(os.path.join(d, "index.json")) as f:  # every query (a CLI run) reads the index
            index = json.load(f)
        segs = index["segments"]
        hours_ago = zipf_ranks(len(segs), 1.1, 1, rng)[0]
        span = 900 if rng.random() < 0.7 else 4 * 3600
        end = segs[-1]["end"] - hours_ago * 3600 - rng.randrange(3600)
        start = max(0, end - span)
        for seg in segs:
            if seg["end"] <= start or seg["start"] >= end:
                continue
            marks = seg["marks"]
            k = max(0, bisect.bisect_right([m[0] for m in marks], start) - 1)
            with open(os.path.join(d, "logs", seg["name"]), "rb") as f:
                f.seek(marks[k][1])
                for line in f:
                    ts = int(line[7 : line.index(b",", 7)])  # {"ts": N, ...
                    if ts >= end:
                        break
                    if ts >= start and b'"ERROR"' in line:
                        hits += json.loads(line)["lvl"] == "ERROR"
    print(f"jsonlog: {hits} errors")


def gen_valloader(d):
    rng = random.Random(SEED + 110)
    for split, n, mu in (("train", 5000, 10.1), ("val", 500, 10.1)):
        for i in range(n):
            cd = os.path.join(d, split, f"class{i % 25:02d}")
            os.makedirs(cd, exist_ok=True)
            size = min(int(rng.lognormvariate(mu, 0.7)), 400_000)  # median ~24 KB
            with open(os.path.join(cd, f"{split}_{i:05d}.bin"), "wb") as f:
                f.write(rng.randbytes(size))


class _Files:
    def __init__(self, root):
        self.files = files_under(root)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import torch

        with open(self.files[i], "rb") as f:
            b = f.read()
        return torch.frombuffer(bytearray(b[:64]), dtype=torch.uint8).float().mean()


def run_valloader(d):
    import torch
    from torch.utils.data import DataLoader

    torch.manual_seed(SEED + 111)
    train = DataLoader(_Files(os.path.join(d, "train")), batch_size=32, shuffle=True, num_workers=4)
    val = DataLoader(_Files(os.path.join(d, "val")), batch_size=64, shuffle=False, num_workers=2)
    for epoch in range(3):
        t = sum(float(b.sum()) for b in train)
        v = sum(float(b.sum()) for b in val)
        print(f"valloader: epoch {epoch}: {t:.1f} {v:.1f}")


# --- tokwin -------------------------------------------------------------------------


def gen_tokwin(d):
    import numpy as np

    rng = np.random.default_rng(SEED + 120)
    for name, mb in (("train", 96), ("val", 6)):
        toks = rng.integers(0, 50257, size=mb * (1 << 20) // 2, dtype=np.uint16)
        toks.tofile(os.path.join(d, f"{name}.bin"))


def run_tokwin(d):
    import numpy as np

    rng = np.random.default_rng(SEED + 121)
    block, batch = 1024, 12
    sizes = {n: os.path.getsize(os.path.join(d, f"{n}.bin")) // 2 for n in ("train", "val")}

    def get_batch(split):
        path = os.path.join(d, f"{split}.bin")
        xs = []
        for i in rng.integers(0, sizes[split] - block - 1, size=batch):
            xs.append(np.fromfile(path, dtype=np.uint16, count=block + 1, offset=2 * int(i)))
        return np.stack(xs)

    acc = 0
    for step in range(600):
        if step % 100 == 0:
            for split in ("train", "val"):
                acc += sum(int(get_batch(split)[:, 0].sum()) for _ in range(20))
        acc += int(get_batch("train")[:, -1].sum())
    print(f"tokwin: {acc}")


# --- lora ---------------------------------------------------------------------------


def gen_lora(d):
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(SEED + 130)
    os.makedirs(os.path.join(d, "adapters"), exist_ok=True)
    for a in range(120):
        rank = int(rng.choice([8, 16, 32]))
        layers = int(rng.integers(4, 9))
        t = {}
        for layer in range(layers):
            for proj in ("q_proj", "v_proj"):
                t[f"layers.{layer}.{proj}.lora_A"] = rng.standard_normal((rank, 1024), dtype=np.float32)
                t[f"layers.{layer}.{proj}.lora_B"] = rng.standard_normal((1024, rank), dtype=np.float32)
        save_file(t, os.path.join(d, "adapters", f"adapter-{a:03d}.safetensors"))


def run_lora(d):
    from collections import OrderedDict

    from safetensors.numpy import load

    rng = random.Random(SEED + 131)
    # A random popularity order, so that the popular adapters are not the first files.
    order = list(range(120))
    rng.shuffle(order)
    loaded, max_loras, acc = OrderedDict(), 6, 0.0
    for rank in zipf_ranks(120, 1.0, 1500, rng):
        a = order[rank]
        if a in loaded:
            loaded.move_to_end(a)
        else:
            # Read, then parsed: `load_file` maps the file, whose page faults strace
            # does not see (through the mount they are reads of the same bytes).
            with open(os.path.join(d, "adapters", f"adapter-{a:03d}.safetensors"), "rb") as f:
                loaded[a] = load(f.read())
            if len(loaded) > max_loras:
                loaded.popitem(last=False)
        acc += float(next(iter(loaded[a].values()))[0, 0])
    print(f"lora: {acc:.3f}")


# --- cheaders -----------------------------------------------------------------------

CHEADERS_HEADERS = 90
CHEADERS_SOURCES = 360


def _c_body(rng, tag, nbytes):
    """Valid C of about `nbytes`: declarations and small functions, padded with comment
    text the preprocessor still has to read."""
    out, size, k = [], 0, 0
    while size < nbytes:
        k += 1
        if rng.random() < 0.5:
            chunk = "/* %s */\n" % " ".join("w%d" % rng.randrange(5000) for _ in range(rng.randrange(20, 120)))
        else:
            chunk = "static inline int %s_f%d(int x) { return x * %d + %d; }\n" % (tag, k, rng.randrange(1, 99), rng.randrange(1000))
        out.append(chunk)
        size += len(chunk)
    return "".join(out)


def gen_cheaders(d):
    rng = random.Random(SEED + 140)
    inc, src = os.path.join(d, "include"), os.path.join(d, "src")
    os.makedirs(inc, exist_ok=True)
    os.makedirs(src, exist_ok=True)
    for h in range(CHEADERS_HEADERS):
        n = min(int(rng.lognormvariate(9.3, 0.9)), 200_000)  # median ~11 KB
        body = "#ifndef H%03d_H\n#define H%03d_H\n" % (h, h)
        if h >= 5:  # most headers pull in one of the base headers, as real ones do
            body += '#include "h%03d.h"\n' % rng.randrange(5)
        body += "struct s%03d { int a; long b; };\n" % h + _c_body(rng, "h%03d" % h, n) + "#endif\n"
        with open(os.path.join(inc, "h%03d.h" % h), "w") as f:
            f.write(body)
    for i in range(CHEADERS_SOURCES):
        sub = os.path.join(src, "m%02d" % (i % 12))
        os.makedirs(sub, exist_ok=True)
        hs = sorted(set(zipf_ranks(CHEADERS_HEADERS, 1.0, rng.randrange(8, 21), rng)))
        n = min(int(rng.lognormvariate(9.8, 0.8)), 300_000)  # median ~18 KB
        body = "".join('#include "h%03d.h"\n' % h for h in hs) + _c_body(rng, "c%04d" % i, n)
        body += "int c%04d_main(void) { return %s; }\n" % (i, " + ".join("(int)sizeof(struct s%03d)" % h for h in hs))
        with open(os.path.join(sub, "c%04d.c" % i), "w") as f:
            f.write(body)


def run_cheaders(d):
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(SEED + 141)
    srcs = files_under(os.path.join(d, "src"))

    def cc(path):
        subprocess.run(["gcc", "-fsyntax-only", "-Iinclude", os.path.relpath(path, d)], cwd=d, check=True)

    for p in srcs:  # a full build, one compiler at a time
        cc(p)
    edited = rng.sample(srcs, 40)  # the files a developer works on
    for _ in range(30):  # the edit-compile loop
        for p in rng.sample(edited, 6):
            cc(p)
    order = srcs[:]
    rng.shuffle(order)
    with ThreadPoolExecutor(4) as pool:  # a rebuild, `make -j4`
        list(pool.map(cc, order))
    print("cheaders: %d compiles" % (len(srcs) * 2 + 180))


# --- audiocrop ----------------------------------------------------------------------

AUDIO_FILES = 240
AUDIO_RATE = 16_000


def gen_audiocrop(d):
    import struct
    import wave

    rng = random.Random(SEED + 150)
    noise = _noise(rng, 1 << 16)
    for i in range(AUDIO_FILES):
        sub = os.path.join(d, "clips", "spk%02d" % (i % 16))
        os.makedirs(sub, exist_ok=True)
        frames = int(rng.uniform(8, 60) * AUDIO_RATE)
        with wave.open(os.path.join(sub, "clip%04d.wav" % i), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(AUDIO_RATE)
            w.writeframes(struct.pack("<I", i) + (noise * (2 * frames // len(noise) + 1))[: 2 * frames - 4])


def _audio_crop(args):
    import wave

    path, seed = args
    rng = random.Random(seed)
    with wave.open(path, "rb") as w:
        n = w.getnframes()
        want = 2 * AUDIO_RATE
        w.setpos(rng.randrange(0, max(1, n - want)))
        return len(w.readframes(want))


def run_audiocrop(d):
    from multiprocessing import Pool

    rng = random.Random(SEED + 151)
    files = files_under(os.path.join(d, "clips"))
    total = 0
    with Pool(4) as pool:
        for epoch in range(3):
            order = files[:]
            rng.shuffle(order)
            total += sum(pool.imap(_audio_crop, [(p, rng.randrange(1 << 30)) for p in order], chunksize=4))
    print("audiocrop: %d bytes" % total)


# --- vodstream ----------------------------------------------------------------------

VOD_FILES = 150


def gen_vodstream(d):
    rng = random.Random(SEED + 160)
    os.makedirs(os.path.join(d, "videos"), exist_ok=True)
    chunk = _noise(rng, 1 << 16)
    for i in range(VOD_FILES):
        n = int(rng.uniform(1, 8) * (1 << 20))
        with open(os.path.join(d, "videos", "v%04d.mp4" % i), "wb") as f:
            f.write((chunk * (n // len(chunk) + 1))[:n])


def run_vodstream(d):
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(SEED + 161)
    order = list(range(VOD_FILES))
    rng.shuffle(order)  # popularity is not name order
    plays = []
    for rank in zipf_ranks(VOD_FILES, 0.9, 900, rng):
        start = 0.0 if rng.random() < 0.7 else rng.random() * 0.8
        share = min(1.0 - start, rng.expovariate(1 / 0.35))  # most viewers stop early
        plays.append((order[rank], start, share))

    def play(p):
        v, start, share = p
        path = os.path.join(d, "videos", "v%04d.mp4" % v)
        size = os.path.getsize(path)
        at, end, got = int(start * size), int((start + share) * size), 0
        with open(path, "rb", buffering=0) as f:
            f.seek(at)
            while at < end:
                b = f.read(256 << 10)
                if not b:
                    break
                at += len(b)
                got += len(b)
        return got

    with ThreadPoolExecutor(6) as pool:
        total = sum(pool.map(play, plays))
    print("vodstream: %d bytes" % total)


# --- pyimport -----------------------------------------------------------------------

PYIMPORT_PACKAGES = 30
PYIMPORT_MODULES = 16


def gen_pyimport(d):
    import compileall

    rng = random.Random(SEED + 170)
    root = os.path.join(d, "site")
    for p in range(PYIMPORT_PACKAGES):
        pkg = os.path.join(root, "pkg%02d" % p)
        os.makedirs(pkg, exist_ok=True)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write("VERSION = %d\n" % p)
        for m in range(PYIMPORT_MODULES):
            # Imports only go to lower-numbered packages (no cycles); the base
            # packages are imported by most others, as a real dependency tree's are.
            deps = set()
            if p > 0:
                for _ in range(rng.randrange(0, 4)):
                    q = zipf_ranks(p, 1.2, 1, rng)[0]
                    deps.add("pkg%02d.mod%02d" % (q, rng.randrange(PYIMPORT_MODULES)))
            lines = ["import %s" % dep for dep in sorted(deps)]
            n = min(int(rng.lognormvariate(8.8, 0.9)), 150_000)  # median ~6.6 KB of source
            k = 0
            while sum(len(x) + 1 for x in lines) < n:
                k += 1
                lines.append("def f%d(x):\n    return x * %d + %d  # %s" % (
                    k, rng.randrange(1, 99), rng.randrange(1000),
                    " ".join("w%d" % rng.randrange(5000) for _ in range(rng.randrange(4, 30)))))
                if rng.random() < 0.2:
                    lines.append("TABLE%d = %r" % (k, [rng.randrange(1 << 20) for _ in range(rng.randrange(8, 64))]))
            with open(os.path.join(pkg, "mod%02d.py" % m), "w") as f:
                f.write("\n".join(lines) + "\n")
    compileall.compile_dir(root, quiet=1)


def run_pyimport(d):
    import subprocess

    rng = random.Random(SEED + 171)
    root = os.path.join(d, "site")
    mods = ["pkg%02d.mod%02d" % (p, m) for p in range(PYIMPORT_PACKAGES) for m in range(PYIMPORT_MODULES)]
    rng.shuffle(mods)  # popularity is not name order
    procs = []
    for w in range(24):
        want = sorted({mods[r] for r in zipf_ranks(len(mods), 0.9, rng.randrange(10, 40), rng)})
        code = "import sys; sys.path.insert(0, %r)\n" % root + "".join("import %s\n" % m for m in want)
        procs.append(subprocess.Popen([sys.executable, "-c", code], start_new_session=True))
        if len(procs) == 4:  # four workers at a time
            for pr in procs:
                if pr.wait() != 0:
                    raise SystemExit("an import failed")
            procs = []
    print("pyimport: 24 processes")


# --- ivfsearch ----------------------------------------------------------------------

IVF_LISTS = 1024
IVF_DIM = 64


def gen_ivfsearch(d):
    import numpy as np

    rng = np.random.default_rng(SEED + 180)
    os.makedirs(os.path.join(d, "index"), exist_ok=True)
    centroids = rng.standard_normal((IVF_LISTS, IVF_DIM)).astype(np.float32)
    sizes = np.minimum(rng.lognormal(6.0, 0.8, IVF_LISTS).astype(np.int64) + 16, 4000)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    np.save(os.path.join(d, "index", "centroids.npy"), centroids)
    np.save(os.path.join(d, "index", "offsets.npy"), offsets)
    with open(os.path.join(d, "index", "lists.bin"), "wb") as f:
        for c in range(IVF_LISTS):
            v = centroids[c] + 0.1 * rng.standard_normal((sizes[c], IVF_DIM)).astype(np.float32)
            f.write(v.astype(np.float32).tobytes())


def run_ivfsearch(d):
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    rng = random.Random(SEED + 181)
    centroids = np.load(os.path.join(d, "index", "centroids.npy"))
    offsets = np.load(os.path.join(d, "index", "offsets.npy"))
    lists = os.path.join(d, "index", "lists.bin")
    order = list(range(IVF_LISTS))
    rng.shuffle(order)  # popular clusters are spread through the file
    nprng = np.random.default_rng(SEED + 182)
    queries = [centroids[order[r]] + 0.5 * nprng.standard_normal(IVF_DIM).astype(np.float32)
               for r in zipf_ranks(IVF_LISTS, 1.0, 1200, rng)]
    row = IVF_DIM * 4

    def search(q):
        near = np.argsort(((centroids - q) ** 2).sum(axis=1))[:8]
        best = np.inf
        with open(lists, "rb") as f:
            for c in sorted(near):
                n = int(offsets[c + 1] - offsets[c])
                v = np.fromfile(f, dtype=np.float32, count=n * IVF_DIM, offset=int(offsets[c]) * row - f.tell())
                best = min(best, float(((v.reshape(n, IVF_DIM) - q) ** 2).sum(axis=1).min()))
        return best

    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(search, queries))
    print("ivfsearch: %d queries, mean best %.3f" % (len(found), sum(found) / len(found)))


# --- diskann ------------------------------------------------------------------------

DISKANN_NODES = 200_000
DISKANN_DIM = 32
DISKANN_DEGREE = 32
DISKANN_CLUSTERS = 400


def gen_diskann(d):
    import numpy as np

    rng = np.random.default_rng(SEED + 190)
    os.makedirs(os.path.join(d, "index"), exist_ok=True)
    centers = rng.standard_normal((DISKANN_CLUSTERS, DISKANN_DIM)).astype(np.float32) * 4
    per = DISKANN_NODES // DISKANN_CLUSTERS
    cluster = np.repeat(np.arange(DISKANN_CLUSTERS), per)  # ids grouped by cluster
    vecs = centers[cluster] + rng.standard_normal((DISKANN_NODES, DISKANN_DIM)).astype(np.float32)
    # Most edges stay in the node's cluster, a few jump anywhere (the long links a
    # search follows toward its target).
    local = (cluster[:, None] * per + rng.integers(0, per, (DISKANN_NODES, 16))).astype(np.int32)
    far = rng.integers(0, DISKANN_NODES, (DISKANN_NODES, DISKANN_DEGREE - 16)).astype(np.int32)
    nbrs = np.concatenate([local, far], axis=1)
    recs = np.concatenate([vecs.view(np.int32), nbrs], axis=1)  # 256 B per node
    recs.astype(np.int32).tofile(os.path.join(d, "index", "graph.bin"))
    vecs[:, :8].astype(np.float16).tofile(os.path.join(d, "index", "pq.bin"))  # the in-memory codes
    np.save(os.path.join(d, "index", "centers.npy"), centers)


def run_diskann(d):
    import heapq
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    rng = random.Random(SEED + 191)
    pq = np.fromfile(os.path.join(d, "index", "pq.bin"), dtype=np.float16).reshape(-1, 8).astype(np.float32)
    centers = np.load(os.path.join(d, "index", "centers.npy"))
    medoid = int(np.argmin(((pq - pq.mean(axis=0)) ** 2).sum(axis=1)))
    order = list(range(DISKANN_CLUSTERS))
    rng.shuffle(order)
    nprng = np.random.default_rng(SEED + 192)
    queries = [centers[order[r]] + nprng.standard_normal(DISKANN_DIM).astype(np.float32)
               for r in zipf_ranks(DISKANN_CLUSTERS, 1.0, 1500, rng)]
    path = os.path.join(d, "index", "graph.bin")
    per_page = 4096 // 256

    def search(q):
        fd = os.open(path, os.O_RDONLY)
        try:
            qc = q[:8]
            seen = {medoid}
            cand = [(float(((pq[medoid] - qc) ** 2).sum()), medoid)]
            best = []
            for _ in range(40):  # nodes expanded per query
                if not cand:
                    break
                _, node = heapq.heappop(cand)
                page = node // per_page
                raw = os.pread(fd, 4096, page * 4096)
                rec = np.frombuffer(raw, dtype=np.int32).reshape(per_page, 64)[node % per_page]
                full = rec[:DISKANN_DIM].view(np.float32)
                heapq.heappush(best, (-float(((full - q) ** 2).sum()), node))
                if len(best) > 10:
                    heapq.heappop(best)
                nb = [int(x) for x in rec[DISKANN_DIM:] if int(x) not in seen]
                seen.update(nb)
                if nb:
                    dist = ((pq[nb] - qc) ** 2).sum(axis=1)
                    for dd, x in zip(dist.tolist(), nb):
                        heapq.heappush(cand, (dd, x))
                cand = heapq.nsmallest(20, cand)  # the beam
                heapq.heapify(cand)
            return -max(best)[0]
        finally:
            os.close(fd)

    with ThreadPoolExecutor(2) as pool:
        found = list(pool.map(search, queries))
    print("diskann: %d queries, mean best %.2f" % (len(found), sum(found) / len(found)))


# --- tfinterleave -------------------------------------------------------------------

TF_SHARDS = 16


def gen_tfinterleave(d):
    import struct

    rng = random.Random(SEED + 200)
    os.makedirs(os.path.join(d, "records"), exist_ok=True)
    blob = _noise(rng, 1 << 17)
    for i in range(TF_SHARDS):
        with open(os.path.join(d, "records", "train-%05d-of-%05d.rec" % (i, TF_SHARDS)), "wb") as f:
            size = 0
            while size < 8 << 20:
                n = rng.randrange(20_000, 80_000)
                f.write(struct.pack("<I", n) + blob[:n])
                size += 4 + n


def run_tfinterleave(d):
    import struct

    rng = random.Random(SEED + 201)
    shards = files_under(os.path.join(d, "records"))
    total = 0
    for _ in range(2):  # epochs
        order = shards[:]
        rng.shuffle(order)
        pending = list(order)
        active = [open(pending.pop(0), "rb") for _ in range(4)]  # cycle length 4
        while active:
            for f in list(active):
                head = f.read(4)
                if len(head) < 4:
                    f.close()
                    active.remove(f)
                    if pending:
                        active.append(open(pending.pop(0), "rb"))
                    continue
                (n,) = struct.unpack("<I", head)
                total += len(f.read(n))
    print("tfinterleave: %d bytes" % total)


# --- lsmkv --------------------------------------------------------------------------

LSM_TABLES = 20
LSM_KEYS_PER_TABLE = 60_000
LSM_BLOCK = 4096


def gen_lsmkv(d):
    import struct

    rng = random.Random(SEED + 210)
    os.makedirs(os.path.join(d, "db"), exist_ok=True)
    key = 0
    for t in range(LSM_TABLES):
        blocks, index, cur = [], [], bytearray()
        first = None
        for _ in range(LSM_KEYS_PER_TABLE):
            key += rng.randrange(1, 4)
            rec = struct.pack("<QH", key, 0) + bytes(rng.randrange(20, 90))
            rec = rec[:8] + struct.pack("<H", len(rec) - 10) + rec[10:]
            if len(cur) + len(rec) > LSM_BLOCK:
                blocks.append(bytes(cur) + bytes(LSM_BLOCK - len(cur)))
                index.append(first)
                cur, first = bytearray(), None
            if first is None:
                first = key
            cur += rec
        blocks.append(bytes(cur) + bytes(LSM_BLOCK - len(cur)))
        index.append(first)
        with open(os.path.join(d, "db", "%06d.sst" % t), "wb") as f:
            for b in blocks:
                f.write(b)
            index_at = f.tell()
            f.write(struct.pack("<%dQ" % len(index), *index))
            f.write(struct.pack("<QQ", index_at, len(index)))
    with open(os.path.join(d, "db", "MANIFEST"), "w") as f:
        f.write("%d %d\n" % (LSM_TABLES, key))


def run_lsmkv(d):
    import bisect
    import struct
    import threading
    from collections import OrderedDict
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(SEED + 211)
    tables = files_under(os.path.join(d, "db"))
    tables = [t for t in tables if t.endswith(".sst")]
    with open(os.path.join(d, "db", "MANIFEST")) as f:
        _, max_key = map(int, f.read().split())
    # Each table's first key (the store's own metadata, kept in memory like a level's
    # file list): read once from each footer and index.
    def open_table(path):
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        index_at, n = struct.unpack("<QQ", os.pread(fd, 16, size - 16))
        index = list(struct.unpack("<%dQ" % n, os.pread(fd, 8 * n, index_at)))
        return fd, index

    firsts = []
    for t in tables:
        fd, index = open_table(t)
        firsts.append(index[0])
        os.close(fd)
    # The table cache (max_open_files 6): a table leaving it is closed once no lookup
    # holds it (LevelDB's handles are reference-counted the same way).
    cache, users, closing, lock = OrderedDict(), {}, set(), threading.Lock()

    def acquire(i):
        with lock:
            if i in cache:
                cache.move_to_end(i)
                fd, index = cache[i]
                users[fd] = users.get(fd, 0) + 1
                return fd, index
        fd, index = open_table(tables[i])
        with lock:
            if i in cache:
                os.close(fd)
                fd, index = cache[i]
            else:
                cache[i] = (fd, index)
                while len(cache) > 6:
                    _, (old, _) = cache.popitem(last=False)
                    if users.get(old, 0) == 0:
                        os.close(old)
                    else:
                        closing.add(old)
            users[fd] = users.get(fd, 0) + 1
            return fd, index

    def release(fd):
        with lock:
            users[fd] -= 1
            if users[fd] == 0 and fd in closing:
                closing.discard(fd)
                os.close(fd)

    hot = list(range(200_000))
    rng.shuffle(hot)
    ranks = zipf_ranks(len(hot), 0.9, 12_000, rng)
    keys = [hot[r] * max_key // len(hot) for r in ranks]
    found = [0]

    def lookup(k):
        i = max(bisect.bisect_right(firsts, k) - 1, 0)
        fd, index = acquire(i)
        try:
            b = max(bisect.bisect_right(index, k) - 1, 0)
            raw = os.pread(fd, LSM_BLOCK, b * LSM_BLOCK)
        finally:
            release(fd)
        at = 0
        while at + 10 <= len(raw):
            rk, n = struct.unpack_from("<QH", raw, at)
            if rk >= k or (rk == 0 and n == 0):
                found[0] += rk == k
                break
            at += 10 + n

    def verify(i):
        with open(tables[i], "rb", buffering=0) as f:
            while f.read(256 << 10):
                pass

    with ThreadPoolExecutor(4) as pool:
        for start in range(0, len(keys), 2000):
            list(pool.map(lookup, keys[start:start + 2000]))
            for i in rng.sample(range(len(tables)), 2):
                verify(i)
    print("lsmkv: %d lookups, %d found" % (len(keys), found[0]))


# --- ragdocs ------------------------------------------------------------------------

RAG_DOCS = 30_000
RAG_SHARDS = 8
RAG_TOPICS = 300


def gen_ragdocs(d):
    import json

    import numpy as np

    rng = random.Random(SEED + 220)
    os.makedirs(os.path.join(d, "docs"), exist_ok=True)
    words = ["w%d" % i for i in range(5000)]
    per_shard = RAG_DOCS // RAG_SHARDS
    table = []
    for s in range(RAG_SHARDS):
        with open(os.path.join(d, "docs", "shard-%02d.jsonl" % s), "wb") as f:
            for j in range(per_shard):
                doc = s * per_shard + j
                n = _clamped_lognormal(rng, 7.4, 0.6, 500, 6000)
                text = " ".join(rng.choice(words) for _ in range(n // 6))[:n]
                line = (json.dumps({"id": doc, "topic": doc * RAG_TOPICS // RAG_DOCS, "text": text}) + "\n").encode()
                table.append((s, f.tell(), len(line)))
                f.write(line)
    np.save(os.path.join(d, "docs", "offsets.npy"), np.array(table, dtype=np.int64))


def run_ragdocs(d):
    import json
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    rng = random.Random(SEED + 221)
    table = np.load(os.path.join(d, "docs", "offsets.npy"))
    shards = [os.path.join(d, "docs", "shard-%02d.jsonl" % s) for s in range(RAG_SHARDS)]
    per_topic = RAG_DOCS // RAG_TOPICS
    order = list(range(RAG_TOPICS))
    rng.shuffle(order)
    queries = []
    for r in zipf_ranks(RAG_TOPICS, 0.9, 3000, rng):
        topic = order[r]
        picks = {topic * per_topic + k for k in zipf_ranks(per_topic, 1.0, 6, rng)}
        picks |= {rng.randrange(RAG_DOCS) for _ in range(2)}
        queries.append(sorted(picks))

    def answer(docs):
        total = 0
        for doc in docs:
            s, off, n = (int(x) for x in table[doc])
            fd = os.open(shards[s], os.O_RDONLY)
            try:
                total += len(json.loads(os.pread(fd, n, off))["text"])
            finally:
                os.close(fd)
        return total

    with ThreadPoolExecutor(4) as pool:
        got = sum(pool.map(answer, queries))
    print("ragdocs: %d queries, %d chars" % (len(queries), got))


# --- tileserve ------------------------------------------------------------------------

TILE_LEVELS = 6  # level 0 is full resolution: 2^(levels-1) times the top level's tiles
TILE_TOP = (2, 2)  # tiles across and down at the lowest resolution
TILE_ROIS = 40


def _tile_grid(level):
    """Tiles across and down at `level` (0 = full resolution)."""
    k = 1 << (TILE_LEVELS - 1 - level)
    return TILE_TOP[0] * k, TILE_TOP[1] * k


def gen_tileserve(d):
    import struct

    rng = random.Random(SEED + 230)
    os.makedirs(d, exist_ok=True)
    noise = _noise(rng, 1 << 16)
    sizes = []
    for level in range(TILE_LEVELS):
        w, h = _tile_grid(level)
        # Tissue compresses worse than background: tile sizes vary with content.
        sizes += [int(rng.uniform(6, 40) * 1024) for _ in range(w * h)]
    table = 8 * 2 * len(sizes)
    with open(os.path.join(d, "slide.tiles"), "wb") as f:
        f.write(struct.pack("<4sI", b"TILE", len(sizes)))
        offsets, at = [], 8 + table
        for n in sizes:
            offsets.append((at, n))
            at += n
        f.write(b"".join(struct.pack("<QQ", o, n) for o, n in offsets))
        for n in sizes:
            f.write(_noise_slice(rng, noise, n))


def run_tileserve(d):
    import struct
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(SEED + 231)
    path = os.path.join(d, "slide.tiles")
    fd = os.open(path, os.O_RDONLY)
    _, count = struct.unpack("<4sI", os.pread(fd, 8, 0))
    raw = os.pread(fd, 16 * count, 8)
    table = [struct.unpack_from("<QQ", raw, 16 * i) for i in range(count)]
    base, first = 0, []
    for level in range(TILE_LEVELS):
        first.append(base)
        w, h = _tile_grid(level)
        base += w * h
    full_w, full_h = _tile_grid(0)
    rois = [(rng.random(), rng.random()) for _ in range(TILE_ROIS)]
    sessions = []
    for r in zipf_ranks(TILE_ROIS, 1.0, 400, rng):
        x, y = rois[r]
        pans = [(rng.choice((-1, 0, 1)), rng.choice((-1, 0, 1))) for _ in range(rng.randrange(2, 8))]
        sessions.append((x, y, pans))

    def viewport(level, x, y):
        """The tiles of a 4x3-tile view centred at (x, y) (fractions of the slide)."""
        w, h = _tile_grid(level)
        cx, cy = int(x * w), int(y * h)
        out = []
        for ty in range(max(0, cy - 1), min(h, cy + 2)):
            for tx in range(max(0, cx - 2), min(w, cx + 2)):
                out.append(first[level] + ty * w + tx)
        return out

    def serve(session):
        x, y, pans = session
        got = 0
        views = [(level, x, y) for level in range(TILE_LEVELS - 1, -1, -1)]
        for dx, dy in pans:
            x = min(max(x + dx * 3.0 / full_w, 0.0), 1.0)
            y = min(max(y + dy * 2.0 / full_h, 0.0), 1.0)
            views.append((0, x, y))
        views += [(level, x, y) for level in range(1, TILE_LEVELS)]
        for level, vx, vy in views:
            for t in viewport(level, vx, vy):
                off, n = table[t]
                got += len(os.pread(fd, n, off))
        return got

    with ThreadPoolExecutor(4) as pool:
        total = sum(pool.map(serve, sessions))
    os.close(fd)
    print("tileserve: %d sessions, %d bytes" % (len(sessions), total))


# --- restore --------------------------------------------------------------------------

RESTORE_FILES = 300
RESTORE_PACK = 4 << 20


def gen_restore(d):
    import json

    rng = random.Random(SEED + 240)
    os.makedirs(os.path.join(d, "data"), exist_ok=True)
    noise = _noise(rng, 1 << 16)
    index, packs = {}, []
    pack, pack_at = None, 0

    def new_chunk():
        nonlocal pack, pack_at
        n = _clamped_lognormal(rng, 11.9, 0.7, 32 << 10, 512 << 10)
        if pack is None or pack_at + n > RESTORE_PACK:
            if pack is not None:
                pack.close()
            name = "%064x" % rng.getrandbits(256)
            packs.append(name)
            pack = open(os.path.join(d, "data", name), "wb")
            pack_at = 0
        cid = "%016x" % rng.getrandbits(64)
        pack.write(_noise_slice(rng, noise, n))
        index[cid] = (len(packs) - 1, pack_at, n)
        pack_at += n
        return cid

    def new_file():
        return [new_chunk() for _ in range(max(1, int(rng.expovariate(1 / 4.0))))]

    snapshots = [[new_file() for _ in range(RESTORE_FILES)]]
    for _ in range(2):
        files = list(snapshots[-1])
        for i in rng.sample(range(RESTORE_FILES), RESTORE_FILES // 5):
            files[i] = new_file()
        snapshots.append(files)
    pack.close()
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump({"packs": packs, "chunks": index, "snapshots": snapshots}, f)


def run_restore(d):
    import json
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(SEED + 241)
    with open(os.path.join(d, "index.json")) as f:
        repo = json.load(f)
    packs = [os.path.join(d, "data", p) for p in repo["packs"]]
    chunks = repo["chunks"]

    def restore_file(file_chunks):
        got = 0
        for cid in file_chunks:
            p, off, n = chunks[cid]
            fd = os.open(packs[p], os.O_RDONLY)
            try:
                got += len(os.pread(fd, n, off))
            finally:
                os.close(fd)
        return got

    total = 0
    for snap in (repo["snapshots"][-1], repo["snapshots"][0]):
        with ThreadPoolExecutor(2) as pool:
            total += sum(pool.map(restore_file, snap))
    for p in rng.sample(packs, len(packs) // 5):
        with open(p, "rb", buffering=0) as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                total += len(b)
    print("restore: %d packs, %d bytes" % (len(packs), total))


# --- ftsearch -------------------------------------------------------------------------

FTS_DOCS = 30_000
FTS_VOCAB = 20_000
FTS_QUERIES = 400


def _fts_words():
    """The vocabulary: pronounceable distinct words (the same on every run)."""
    rng = random.Random(SEED + 250)
    syll = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
    words, seen = [], set()
    while len(words) < FTS_VOCAB:
        w = "".join(rng.choice(syll) for _ in range(rng.randrange(2, 5)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def gen_ftsearch(d):
    import sqlite3

    path = os.path.join(d, "docs.db")
    if os.path.exists(path):
        os.remove(path)
    rng = random.Random(SEED + 251)
    words = _fts_words()
    weights = [1.0 / (k + 1) ** 1.1 for k in range(FTS_VOCAB)]
    con = sqlite3.connect(path)
    con.execute("PRAGMA page_size=4096")
    con.execute("CREATE VIRTUAL TABLE docs USING fts5(title, body)")

    def doc():
        body = rng.choices(words, weights, k=rng.randrange(60, 400))
        return (" ".join(rng.choices(words, k=4)), " ".join(body))

    con.executemany("INSERT INTO docs(title, body) VALUES (?, ?)", (doc() for _ in range(FTS_DOCS)))
    con.execute("INSERT INTO docs(docs) VALUES ('optimize')")
    con.commit()
    con.close()


def run_ftsearch(d):
    import sqlite3

    rng = random.Random(SEED + 252)
    words = _fts_words()
    # Queries mix common and rare terms (a user's words are not the corpus's most
    # frequent ones): terms drawn from ranks 50..8000.
    queries = []
    for _ in range(FTS_QUERIES):
        terms = [words[rng.randrange(50, 8000)] for _ in range(rng.randrange(1, 4))]
        queries.append(" OR ".join(terms) if rng.random() < 0.3 else " ".join(terms))
    con = sqlite3.connect(os.path.join(d, "docs.db"))
    hits = 0
    for q in zipf_ranks(FTS_QUERIES, 0.9, 900, rng):
        top = con.execute(
            "SELECT rowid, title FROM docs WHERE docs MATCH ? ORDER BY rank LIMIT 10", (queries[q],)
        ).fetchall()
        for rowid, _ in top[:3]:
            hits += len(con.execute("SELECT body FROM docs WHERE rowid = ?", (rowid,)).fetchone()[0])
    con.close()
    print("ftsearch: %d queries, %d bytes of text" % (900, hits))


# --- headscan -------------------------------------------------------------------------

HEAD_FILES = 5_000
HEAD_CLASSES = 50


def gen_headscan(d):
    import struct
    import zlib

    rng = random.Random(SEED + 260)
    noise = _noise(rng, 1 << 16)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    for i in range(HEAD_FILES):
        cdir = os.path.join(d, "train", "c%02d" % (i % HEAD_CLASSES))
        os.makedirs(cdir, exist_ok=True)
        w, h = rng.choice((64, 96, 128, 224, 256, 320, 512)), rng.choice((64, 96, 128, 224, 256, 384))
        size = _clamped_lognormal(rng, 10.7, 0.6, 4 << 10, 400 << 10)
        png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        png += chunk(b"tEXt", b"Comment\x00" + b"x" * rng.randrange(20, 2000))
        png += chunk(b"IDAT", _noise_slice(rng, noise, size)) + chunk(b"IEND", b"")
        with open(os.path.join(cdir, "%05d.png" % i), "wb") as f:
            f.write(png)


def _head_size(path):
    """(width, height) from a PNG's IHDR, read the way an image library opens a file."""
    import struct

    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return (0, 0)
    return struct.unpack(">II", head[16:24])


def _head_load(path):
    with open(path, "rb") as f:
        return len(f.read())


def run_headscan(d):
    from multiprocessing import Pool

    rng = random.Random(SEED + 261)
    paths = files_under(os.path.join(d, "train"))
    keep = [p for p in paths if min(_head_size(p)) >= 128]
    total = 0
    with Pool(4) as pool:
        for _ in range(2):
            order = list(keep)
            rng.shuffle(order)
            total += sum(pool.imap(_head_load, order, chunksize=8))
    print("headscan: %d files indexed, %d trained on, %d bytes" % (len(paths), len(keep), total))


# --- mboxsearch -----------------------------------------------------------------------

MBOX_MESSAGES = 20_000
MBOX_THREADS = 2_500


def gen_mboxsearch(d):
    import email.message
    import mailbox

    rng = random.Random(SEED + 270)
    path = os.path.join(d, "archive.mbox")
    if os.path.exists(path):
        os.remove(path)
    words = ["w%d" % i for i in range(3000)]
    box = mailbox.mbox(path)
    box.lock()
    try:
        for i in range(MBOX_MESSAGES):
            m = email.message.EmailMessage()
            thread = min(MBOX_THREADS - 1, i * MBOX_THREADS // MBOX_MESSAGES + rng.randrange(3))
            m["From"] = "user%d@example.org" % rng.randrange(400)
            m["Subject"] = "thread %d: %s" % (thread, " ".join(rng.choices(words, k=5)))
            m["Message-ID"] = "<%d@example.org>" % i
            m.set_content(" ".join(rng.choices(words, k=rng.randrange(150, 1000))))
            if rng.random() < 0.04:
                m.add_attachment(rng.randbytes(rng.randrange(8 << 10, 32 << 10)), maintype="application", subtype="octet-stream")
            box.add(m)
        box.flush()
    finally:
        box.unlock()
        box.close()


def run_mboxsearch(d):
    import mailbox

    rng = random.Random(SEED + 271)
    box = mailbox.mbox(os.path.join(d, "archive.mbox"), create=False)
    keys = box.keys()  # the table of contents: one pass over the whole file
    n = len(keys)
    got = 0
    for i, rank in enumerate(zipf_ranks(n // 8, 1.0, 3000, rng)):
        # Newest threads the most: rank 0 is the newest group of 8 messages.
        key = keys[n - 1 - (rank * 8 + rng.randrange(8))]
        got += len(box.get_bytes(key))
        if i % 600 == 599:
            for k in keys[-2000:]:
                if b"w17 w42" in box.get_bytes(k):
                    got += 1
    box.close()
    print("mboxsearch: %d messages, %d bytes" % (n, got))


# --- bisectlog ------------------------------------------------------------------------

BISECT_LINES = 1_600_000
BISECT_SPAN = 7 * 86400


def gen_bisectlog(d):
    rng = random.Random(SEED + 280)
    os.makedirs(d, exist_ok=True)
    paths = ["/api/v1/items/%d" % i for i in range(500)] + ["/static/app.%d.js" % i for i in range(50)]
    with open(os.path.join(d, "access.log"), "w") as f:
        ts = 1_700_000_000
        step = BISECT_SPAN / BISECT_LINES
        for i in range(BISECT_LINES):
            f.write(
                "%d 10.%d.%d.%d GET %s %d %d\n"
                % (ts + int(i * step), rng.randrange(256), rng.randrange(256), rng.randrange(256),
                   rng.choice(paths), rng.choice((200, 200, 200, 304, 404, 500)), rng.randrange(100, 90000))
            )


def _bisect_first(f, size, key):
    """Offset of the first line whose timestamp is >= `key` (binary search by offset,
    as `look` does: seek, skip the partial line, read one line)."""
    lo, hi = 0, size
    while hi - lo > 4096:
        mid = (lo + hi) // 2
        f.seek(mid)
        f.readline()
        line = f.readline()
        if not line or int(line.split(b" ", 1)[0]) >= key:
            hi = mid
        else:
            lo = mid
    return lo


def run_bisectlog(d):
    rng = random.Random(SEED + 281)
    path = os.path.join(d, "access.log")
    size = os.path.getsize(path)
    start = 1_700_000_000
    minutes = 24 * 60
    found = 0
    with open(path, "rb", buffering=4096) as f:
        for rank in zipf_ranks(minutes, 0.9, 2500, rng):
            key = start + BISECT_SPAN - (rank + 1) * 60
            f.seek(_bisect_first(f, size, key))
            f.readline()
            for line in f:
                t = int(line.split(b" ", 1)[0])
                if t >= key + 60:
                    break
                if t >= key:
                    found += 1
    print("bisectlog: %d lines found" % found)


# --- dbmlookup ------------------------------------------------------------------------

DBM_KEYS = 150_000


def gen_dbmlookup(d):
    import dbm.dumb

    rng = random.Random(SEED + 290)
    os.makedirs(d, exist_ok=True)
    base = os.path.join(d, "kv")
    for ext in (".dat", ".dir", ".bak"):
        if os.path.exists(base + ext):
            os.remove(base + ext)
    db = dbm.dumb.open(base, "n")
    try:
        for i in range(DBM_KEYS):
            db["k%02x:%07d" % (i % 256, i)] = rng.randbytes(rng.randrange(200, 1200))
    finally:
        db.close()


def run_dbmlookup(d):
    import dbm.dumb

    rng = random.Random(SEED + 291)
    db = dbm.dumb.open(os.path.join(d, "kv"), "r")  # reads the whole .dir index
    got = 0
    try:
        for i, rank in enumerate(zipf_ranks(DBM_KEYS, 0.9, 40_000, rng)):
            # Popularity scattered over the keys, not in insertion order.
            k = (rank * 7919) % DBM_KEYS
            got += len(db["k%02x:%07d" % (k % 256, k)])
            if i % 8000 == 7999:
                prefix = "k%x" % rng.randrange(16)
                for key in db.keys():
                    if key.decode().startswith(prefix):
                        got += len(db[key])
    finally:
        db.close()
    print("dbmlookup: %d bytes" % got)


# --- csvloop --------------------------------------------------------------------------

CSV_CUSTOMERS = 80_000
CSV_ORDERS = 400_000
CSV_EVENTS = 700_000


def gen_csvloop(d):
    import csv

    rng = random.Random(SEED + 300)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "customers.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "name", "region", "segment", "since"])
        for i in range(CSV_CUSTOMERS):
            w.writerow([i, "customer-%06d-%s" % (i, rng.randbytes(12).hex()), rng.randrange(20),
                        rng.choice("ABCDE"), 2000 + rng.randrange(25)])
    with open(os.path.join(d, "orders.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "customer", "day", "amount", "status", "note"])
        for i in range(CSV_ORDERS):
            w.writerow([i, rng.randrange(CSV_CUSTOMERS), rng.randrange(365), "%.2f" % (rng.random() * 500),
                        rng.choice(("paid", "paid", "open", "void")), rng.randbytes(6).hex()])
    with open(os.path.join(d, "events.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ts", "user", "kind", "page", "ms"])
        for i in range(CSV_EVENTS):
            w.writerow([1_700_000_000 + i, rng.randrange(CSV_CUSTOMERS), rng.choice(("view", "click", "buy")),
                        "/p/%d/%s" % (rng.randrange(5000), rng.randbytes(4).hex()), rng.randrange(2000)])


def run_csvloop(d):
    import csv

    def rows(name):
        with open(os.path.join(d, name), newline="") as f:
            r = csv.reader(f)
            next(r)
            yield from r

    out = 0
    for _refresh in range(3):
        by_day = {}
        for o in rows("orders.csv"):
            if o[4] == "paid":
                by_day[o[2]] = by_day.get(o[2], 0.0) + float(o[3])
        region = {c[0]: c[2] for c in rows("customers.csv")}
        by_region = {}
        for o in rows("orders.csv"):
            g = region.get(o[1])
            by_region[g] = by_region.get(g, 0) + 1
        buys = sum(1 for e in rows("events.csv") if e[2] == "buy" and int(e[4]) > 1500)
        out += len(by_day) + len(by_region) + buys
    print("csvloop: %d" % out)

# --- tarlist --------------------------------------------------------------------------

TAR_MEMBERS = 4_000


def gen_tarlist(d):
    import tarfile

    rng = random.Random(SEED + 310)
    os.makedirs(d, exist_ok=True)
    noise = _noise(rng, 4 << 20)
    path = os.path.join(d, "backup.tar")
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(TAR_MEMBERS):
            n = min(int(rng.lognormvariate(9.8, 1.2)), 3_000_000)  # median ~18 KB
            info = tarfile.TarInfo("home/user%02d/file%05d.dat" % (i % 40, i))
            info.size = n
            info.mtime = 1_700_000_000 + i
            tar.addfile(info, _BytesReader(_noise_slice(rng, noise, n)))


class _BytesReader:
    """A file-like over bytes, for tarfile.addfile without io's copy."""

    def __init__(self, b):
        self.b, self.at = b, 0

    def read(self, n=-1):
        n = len(self.b) - self.at if n < 0 else n
        out = self.b[self.at : self.at + n]
        self.at += len(out)
        return out


def run_tarlist(d):
    import subprocess

    rng = random.Random(SEED + 311)
    names = ["home/user%02d/file%05d.dat" % (i % 40, i) for i in range(TAR_MEMBERS)]
    order = list(range(len(names)))
    rng.shuffle(order)  # popularity spread over the archive
    ranks = [order[k] for k in zipf_ranks(len(names), 1.0, 6 * 30, rng)]
    got = 0
    for r in range(6):
        out = subprocess.run(["tar", "--seek", "-tvf", "backup.tar"], cwd=d, check=True,
                             capture_output=True).stdout
        got += out.count(b"\n")
        want = sorted({names[k] for k in ranks[r * 30 : (r + 1) * 30]})
        out = subprocess.run(["tar", "--seek", "-xOf", "backup.tar", *want], cwd=d, check=True,
                             capture_output=True).stdout
        got += len(out)
    print("tarlist: %d" % got)


# --- cmpjoin --------------------------------------------------------------------------

JOIN_CUSTOMERS = 400_000
JOIN_ORDERS = 1_000_000


def gen_cmpjoin(d):
    rng = random.Random(SEED + 320)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "customers.csv"), "w") as f:
        for i in range(JOIN_CUSTOMERS):
            f.write("c%07d,%s,%d\n" % (i, rng.randbytes(16).hex(), rng.randrange(20)))
    rows = sorted(
        ("c%07d" % rng.randrange(JOIN_CUSTOMERS), i, rng.randrange(365), rng.random() * 500)
        for i in range(JOIN_ORDERS)
    )
    lines = ["%s,o%08d,%d,%.2f,%s\n" % (c, i, day, amt, rng.randbytes(6).hex())
             for c, i, day, amt in rows]
    with open(os.path.join(d, "orders-yesterday.csv"), "w") as f:
        f.writelines(lines)
    # Today's snapshot: the same orders with a few amounts changed near the end.
    for k in range(len(lines) - 2000, len(lines), 97):
        lines[k] = lines[k][:-2] + "9\n"
    with open(os.path.join(d, "orders-today.csv"), "w") as f:
        f.writelines(lines)


def run_cmpjoin(d):
    import subprocess

    env = dict(os.environ, LC_ALL="C")
    got = 0
    for _ in range(3):
        out = subprocess.run(["join", "-t", ",", "-1", "1", "-2", "1", "customers.csv",
                              "orders-today.csv"], cwd=d, env=env, check=True,
                             capture_output=True).stdout
        got += out.count(b"\n")
        r = subprocess.run(["cmp", "orders-yesterday.csv", "orders-today.csv"], cwd=d, env=env,
                           capture_output=True)
        got += len(r.stdout)
        out = subprocess.run(["tail", "-c", str(4 << 20), "orders-today.csv"], cwd=d, env=env,
                             check=True, capture_output=True).stdout
        got += len(out)
    print("cmpjoin: %d" % got)


# --- difftree -------------------------------------------------------------------------

DIFF_FILES = 3_000


def gen_difftree(d):
    import shutil

    rng = random.Random(SEED + 330)
    pool = _text_pool(rng, 1 << 20)
    a = os.path.join(d, "a")
    if os.path.exists(d):
        shutil.rmtree(d)
    for i in range(DIFF_FILES):
        sub = os.path.join("pkg%02d" % (i % 30), "mod%02d" % ((i // 30) % 10))
        os.makedirs(os.path.join(a, sub), exist_ok=True)
        n = min(int(rng.lognormvariate(9.6, 1.0)), 800_000)  # median ~15 KB
        at = rng.randrange(0, len(pool) - n) if n < len(pool) else 0
        with open(os.path.join(a, sub, "f%05d.py" % i), "wb") as f:
            f.write(b"# file %d\n" % i + pool[at : at + n])
    shutil.copytree(a, os.path.join(d, "b"))
    for i in range(0, DIFF_FILES, 20):
        sub = os.path.join("pkg%02d" % (i % 30), "mod%02d" % ((i // 30) % 10))
        path = os.path.join(d, "b", sub, "f%05d.py" % i)
        with open(path, "ab") as f:
            f.write(b"\n# changed\n")


def run_difftree(d):
    import subprocess

    env = dict(os.environ, LC_ALL="C")
    changed = b""
    for _ in range(3):
        r = subprocess.run(["diff", "-rq", "a", "b"], cwd=d, env=env, capture_output=True)
        changed = r.stdout
    got = 0
    for line in changed.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == b"Files":
            r = subprocess.run(["diff", "-u", parts[1], parts[3]], cwd=d, env=env,
                               capture_output=True)
            got += len(r.stdout)
    print("difftree: %d changed, %d bytes of diff" % (len(changed.splitlines()), got))


# --- verify ---------------------------------------------------------------------------

VERIFY_FILES = 2_000


def gen_verify(d):
    import hashlib

    rng = random.Random(SEED + 340)
    noise = _noise(rng, 4 << 20)
    os.makedirs(os.path.join(d, "data"), exist_ok=True)
    lines = []
    for i in range(VERIFY_FILES):
        n = min(int(rng.lognormvariate(10.4, 0.9)), 2_000_000)  # median ~33 KB
        body = _noise_slice(rng, noise, n)
        name = "data/shard-%02d/sample-%05d.bin" % (i % 16, i)
        os.makedirs(os.path.join(d, os.path.dirname(name)), exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(body)
        lines.append("%s  %s\n" % (hashlib.sha256(body).hexdigest(), name))
    with open(os.path.join(d, "SHA256SUMS"), "w") as f:
        f.writelines(lines)


VERIFY_SCRIPT = r"""
set -eu
for pass in 1 2; do
  split -n l/4 -d SHA256SUMS part.
  ls part.0* | xargs -P 4 -n 1 sha256sum --quiet -c
  rm -f part.0*
done
"""


def run_verify(d):
    import subprocess

    subprocess.run(["bash", "-c", VERIFY_SCRIPT], cwd=d, check=True)
    print("verify: ok")


# --- httpstatic -----------------------------------------------------------------------

HTTP_FILES = 4_000
HTTP_REQUESTS = 6_000
HTTP_CLIENTS = 4


def gen_httpstatic(d):
    rng = random.Random(SEED + 350)
    noise = _noise(rng, 8 << 20)
    for i in range(HTTP_FILES):
        sub = os.path.join(d, "static", "c%02d" % (i % 50))
        os.makedirs(sub, exist_ok=True)
        n = min(int(rng.lognormvariate(10.2, 1.3)), 4_000_000)  # median ~27 KB
        with open(os.path.join(sub, "a%05d.bin" % i), "wb") as f:
            f.write(_noise_slice(rng, noise, n))


def _http_fetch(port, paths):
    import urllib.request

    got = 0
    for p in paths:
        with urllib.request.urlopen("http://127.0.0.1:%d/%s" % (port, p)) as r:
            got += len(r.read())
    return got


def run_httpstatic(d):
    """Python's own static file server (`http.server`, a thread per request, files copied
    to the socket with `shutil.copyfileobj`) under 4 clients: Zipf(0.9) popularity over the
    files, and halfway a fifth of the ranks move to other files (content that trends)."""
    import socket
    import subprocess
    import time
    from concurrent.futures import ThreadPoolExecutor

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                               "--directory", "static", str(port)], cwd=d,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        rng = random.Random(SEED + 351)
        names = ["c%02d/a%05d.bin" % (i % 50, i) for i in range(HTTP_FILES)]
        order = list(range(HTTP_FILES))
        rng.shuffle(order)
        ranks = zipf_ranks(HTTP_FILES, 0.9, HTTP_REQUESTS, rng)
        half = HTTP_REQUESTS // 2
        moved = order[:]
        for k in rng.sample(range(HTTP_FILES), HTTP_FILES // 5):
            j = rng.randrange(HTTP_FILES)
            moved[k], moved[j] = moved[j], moved[k]
        paths = [names[order[r]] for r in ranks[:half]] + [names[moved[r]] for r in ranks[half:]]
        lanes = [paths[c::HTTP_CLIENTS] for c in range(HTTP_CLIENTS)]
        with ThreadPoolExecutor(HTTP_CLIENTS) as pool:
            got = sum(pool.map(lambda ps: _http_fetch(port, ps), lanes))
    finally:
        server.terminate()
        server.wait()
    print("httpstatic: %d bytes" % got)


# --- sortmerge ------------------------------------------------------------------------

SORT_RUNS = 48
SORT_RUN_LINES = 30_000


def gen_sortmerge(d):
    rng = random.Random(SEED + 360)
    os.makedirs(d, exist_ok=True)
    for r in range(SORT_RUNS):
        keys = sorted(rng.randbytes(8).hex() for _ in range(SORT_RUN_LINES))
        with open(os.path.join(d, "run-%03d.txt" % r), "w") as f:
            for k in keys:
                f.write("%s\t%s\n" % (k, rng.randbytes(24).hex()))


SORT_SCRIPT = r"""
set -eu
export LC_ALL=C
runs=$(ls run-*.txt)
newest=$(ls run-*.txt | tail -n 16)
sort -m --batch-size=64 $runs | cksum
sort -m --batch-size=64 $newest | cksum
sort -m --batch-size=16 $runs | cksum
"""


def run_sortmerge(d):
    """An LSM-style compaction with GNU sort: the 48 sorted runs merged at once, then the
    16 newest merged again, then all 48 merged 16 at a time (sort's own temporary merges,
    written outside the traced tree)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TMPDIR=tmp)
        out = subprocess.run(["bash", "-c", SORT_SCRIPT], cwd=d, env=env, check=True,
                             capture_output=True).stdout
    print("sortmerge: %s" % out.decode().split())


# --- logtail --------------------------------------------------------------------------

LOG_FILES = 300
LOG_ROUNDS = 40


def gen_logtail(d):
    rng = random.Random(SEED + 370)
    pool = _text_pool(rng, 1 << 20)
    os.makedirs(os.path.join(d, "logs"), exist_ok=True)
    for i in range(LOG_FILES):
        n = min(int(rng.lognormvariate(13.0, 0.8)), 4_000_000)  # median ~440 KB
        at = rng.randrange(0, len(pool) - n) if n < len(pool) else 0
        with open(os.path.join(d, "logs", "svc-%03d.log" % i), "wb") as f:
            f.write(pool[at : at + n])


def run_logtail(d):
    """A monitoring loop: each round, GNU `tail -n 200` of 30 services' logs chosen by
    Zipf(1.0) popularity (a dashboard's panels), and `tail -c 64K` of the 5 most popular;
    tail seeks to the end and reads back as far as it needs."""
    import subprocess

    rng = random.Random(SEED + 371)
    order = list(range(LOG_FILES))
    rng.shuffle(order)
    got = 0
    for _ in range(LOG_ROUNDS):
        picks = sorted({order[k] for k in zipf_ranks(LOG_FILES, 1.0, 30, rng)})
        paths = ["logs/svc-%03d.log" % i for i in picks]
        out = subprocess.run(["tail", "-q", "-n", "200", *paths], cwd=d, check=True,
                             capture_output=True).stdout
        got += len(out)
        top = ["logs/svc-%03d.log" % order[k] for k in range(5)]
        out = subprocess.run(["tail", "-q", "-c", "65536", *top], cwd=d, check=True,
                             capture_output=True).stdout
        got += len(out)
    print("logtail: %d bytes" % got)


# --- grepshards -----------------------------------------------------------------------

GREP_SHARDS = 40
GREP_QUERIES = 120


def gen_grepshards(d):
    rng = random.Random(SEED + 380)
    pool = _text_pool(rng, 1 << 20)
    os.makedirs(os.path.join(d, "shards"), exist_ok=True)
    for i in range(GREP_SHARDS):
        n = 3_000_000 + rng.randrange(2_000_000)
        with open(os.path.join(d, "shards", "part-%02d.txt" % i), "wb") as f:
            while n > 0:
                at = rng.randrange(0, len(pool) - 65536)
                piece = pool[at : at + min(n, 65536)]
                f.write(piece)
                n -= len(piece)


def run_grepshards(d):
    """Ad-hoc searches over a sharded text corpus: each query greps (GNU grep -c) 2-6
    shards, the shards chosen by Zipf(0.8) popularity (recent partitions are searched
    most); grep reads each shard whole."""
    import subprocess

    rng = random.Random(SEED + 381)
    order = list(range(GREP_SHARDS))
    rng.shuffle(order)
    words = [b"error", b"timeout", b"retry", b"user", b"cache", b"node"]
    got = 0
    for _ in range(GREP_QUERIES):
        picks = sorted({order[k] for k in zipf_ranks(GREP_SHARDS, 0.8, rng.randint(2, 6), rng)})
        paths = ["shards/part-%02d.txt" % i for i in picks]
        r = subprocess.run(["grep", "-c", rng.choice(words).decode(), *paths], cwd=d,
                           capture_output=True)
        got += len(r.stdout)
    print("grepshards: %d" % got)


# --- zipimport ------------------------------------------------------------------------

ZIPIMP_PACKAGES = 40
ZIPIMP_MODULES = 30
ZIPIMP_WORKERS = 24


def gen_zipimport(d):
    import zipfile

    rng = random.Random(SEED + 390)
    pool = _text_pool(rng, 1 << 20).decode("ascii", "replace")
    os.makedirs(d, exist_ok=True)
    with zipfile.ZipFile(os.path.join(d, "bundle.zip"), "w", zipfile.ZIP_STORED) as z:
        for p in range(ZIPIMP_PACKAGES):
            z.writestr("pkg%02d/__init__.py" % p, "")
            for m in range(ZIPIMP_MODULES):
                n = min(int(rng.lognormvariate(10.5, 1.0)), 400_000)  # median ~36 KB
                at = rng.randrange(0, len(pool) - n)
                body = "".join("# " + line + "\n" for line in pool[at : at + n].splitlines())
                z.writestr("pkg%02d/mod%02d.py" % (p, m), "VALUE = %d\n%s" % (m, body))


ZIPIMP_WORKER = r"""
import importlib, random, sys
sys.path.insert(0, "bundle.zip")
rng = random.Random(int(sys.argv[1]))
pkgs = [int(a) for a in sys.argv[2].split(",")]
total = 0
for p in pkgs:
    for m in rng.sample(range(%d), 12):
        total += importlib.import_module("pkg%%02d.mod%%02d" %% (p, m)).VALUE
print(total)
""" % ZIPIMP_MODULES


def run_zipimport(d):
    """Python's zipimport: 24 worker interpreters (4 at a time) start from one zipped
    bundle of 1,200 modules; each imports 12 modules of each of 4 packages picked by
    Zipf(1.0) popularity. zipimport reads the archive's central directory at start, then
    each module's local header and data."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(SEED + 391)
    order = list(range(ZIPIMP_PACKAGES))
    rng.shuffle(order)
    jobs = []
    for w in range(ZIPIMP_WORKERS):
        pkgs = sorted({order[k] for k in zipf_ranks(ZIPIMP_PACKAGES, 1.0, 4, rng)})
        jobs.append((w, ",".join(str(p) for p in pkgs)))

    def one(job):
        w, pkgs = job
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run([sys.executable, "-c", ZIPIMP_WORKER, str(w), pkgs], cwd=d,
                              env=env, check=True, capture_output=True).stdout

    with ThreadPoolExecutor(4) as pool:
        got = sum(len(out) for out in pool.map(one, jobs))
    print("zipimport: %d" % got)


# --- arlink ---------------------------------------------------------------------------

AR_OBJECTS = 600
AR_PROGRAMS = 30


def gen_arlink(d):
    import subprocess

    rng = random.Random(SEED + 400)
    src = os.path.join(d, "src")
    os.makedirs(src, exist_ok=True)
    names = []
    for i in range(AR_OBJECTS):
        # Each object defines one entry point and a table sized log-normally, and calls
        # one or two lower-numbered objects (a library's internal dependencies).
        n = min(int(rng.lognormvariate(10.0, 1.2)), 1_000_000)  # median ~22 KB
        deps = sorted({rng.randrange(i) for _ in range(2)}) if i > 0 else []
        body = ["extern int f%04d(int);" % k for k in deps]
        body.append("static const unsigned char table%04d[%d] = {%s};" % (
            i, max(n, 1), ",".join(str(rng.randrange(256)) for _ in range(min(n, 64)))))
        calls = " + ".join("f%04d(x)" % k for k in deps) or "0"
        body.append("int f%04d(int x) { return table%04d[x %% %d] + %s; }" % (
            i, i, max(n, 1), calls))
        name = "o%04d" % i
        with open(os.path.join(src, name + ".c"), "w") as f:
            f.write("\n".join(body) + "\n")
        names.append(name)
    for start in range(0, len(names), 50):
        part = names[start : start + 50]
        subprocess.run(["gcc", "-O0", "-c", *[n + ".c" for n in part]], cwd=src, check=True)
    subprocess.run(["ar", "rcs", os.path.join(d, "libbig.a"),
                    *[os.path.join(src, n + ".o") for n in names]], check=True)
    progs = os.path.join(d, "progs")
    os.makedirs(progs, exist_ok=True)
    for p in range(AR_PROGRAMS):
        uses = sorted({min(int(rng.paretovariate(1.2)) * 7, AR_OBJECTS - 1) for _ in range(6)})
        decl = "".join("extern int f%04d(int);\n" % u for u in uses)
        call = " + ".join("f%04d(argc)" % u for u in uses)
        with open(os.path.join(progs, "p%02d.c" % p), "w") as f:
            f.write("%sint main(int argc, char **argv) { return (%s) & 1; }\n" % (decl, call))
        subprocess.run(["gcc", "-c", "p%02d.c" % p], cwd=progs, check=True)


def run_arlink(d):
    """GNU ld linking 30 small programs against one static archive of 600 objects
    (`gcc p.o -L. -lbig`, 3 rounds): ld reads the archive's symbol table, then the
    members each program pulls in, programs sharing the popular low-level objects."""
    import subprocess

    with_tmp = dict(os.environ, TMPDIR="/tmp")
    for _ in range(3):
        for p in range(AR_PROGRAMS):
            subprocess.run(["gcc", "-o", "/tmp/arlink-p%02d" % p,
                            os.path.join("progs", "p%02d.o" % p), "-L.", "-lbig"], cwd=d,
                           env=with_tmp, check=True)
    print("arlink: linked %d" % (3 * AR_PROGRAMS))


# --- tacscan --------------------------------------------------------------------------

TAC_LOGS = 120
TAC_QUERIES = 150


def gen_tacscan(d):
    rng = random.Random(SEED + 410)
    words = _text_pool(rng, 1 << 20).split()
    os.makedirs(os.path.join(d, "logs"), exist_ok=True)
    for i in range(TAC_LOGS):
        n = min(int(rng.lognormvariate(13.6, 0.7)), 8_000_000)  # median ~800 KB
        error_every = rng.choice([40, 150, 600, 2500])  # how rare this service's errors are
        lines, size, t = [], 0, 1_700_000_000
        while size < n:
            t += rng.randrange(1, 4)
            level = "ERROR" if rng.randrange(error_every) == 0 else "INFO"
            msg = b" ".join(rng.choice(words) for _ in range(rng.randrange(4, 16))).decode()
            line = "%d svc-%03d %s %s\n" % (t, i, level, msg)
            lines.append(line)
            size += len(line)
        with open(os.path.join(d, "logs", "svc-%03d.log" % i), "w") as f:
            f.write("".join(lines))


def run_tacscan(d):
    """Incident triage over service logs with GNU tac, which reads a file backwards from
    its end (8 KiB reads, each after a seek back): `tac log | grep -m 20 ERROR` for 150
    services picked by Zipf(1.0) popularity (tac stops, on SIGPIPE, once grep has its 20
    newest errors: a rare-error log is read back further), and every 25 queries a whole
    reversed log (`tac log | wc -l`) of a popular one."""
    import subprocess

    rng = random.Random(SEED + 411)
    order = list(range(TAC_LOGS))
    rng.shuffle(order)
    got = 0
    for q, rank in enumerate(zipf_ranks(TAC_LOGS, 1.0, TAC_QUERIES, rng)):
        path = "logs/svc-%03d.log" % order[rank]
        out = subprocess.run(["bash", "-c", "tac %s | grep -m 20 ERROR" % path], cwd=d,
                             capture_output=True).stdout
        got += len(out)
        if q % 25 == 24:
            path = "logs/svc-%03d.log" % order[zipf_ranks(TAC_LOGS, 1.0, 1, rng)[0]]
            out = subprocess.run(["bash", "-c", "tac %s | wc -l" % path], cwd=d,
                                 check=True, capture_output=True).stdout
            got += len(out)
    print("tacscan: %d bytes" % got)


# --- symbolize ------------------------------------------------------------------------

SYM_BINARIES = 10
SYM_REQUESTS = 60


def gen_symbolize(d):
    import json
    import subprocess

    rng = random.Random(SEED + 420)
    os.makedirs(os.path.join(d, "src"), exist_ok=True)
    os.makedirs(os.path.join(d, "bin"), exist_ok=True)
    addrs = {}
    for b in range(SYM_BINARIES):
        funcs = rng.randrange(6_000, 30_000)  # 2-11 MB binaries
        out = ["#include <stdint.h>",
               "struct rec { int64_t a; double b; char name[16]; struct rec *next; };"]
        for f in range(funcs):
            out.append("__attribute__((noinline)) int64_t f%05d(struct rec *r, int64_t x) {\n"
                       "    int64_t acc = x * %d;\n"
                       "    for (int i = 0; i < %d; i++) { acc += r->a ^ (acc >> %d); r = r->next; }\n"
                       "    return acc + (int64_t)r->b;\n}" % (f, rng.randrange(3, 99),
                                                                 rng.randrange(2, 9),
                                                                 rng.randrange(1, 7)))
        calls = " + ".join("f%05d(&r, argc)" % f for f in range(0, funcs, max(funcs // 40, 1)))
        out.append("int main(int argc, char **argv) { struct rec r = {1, 2.0, \"x\", &r};"
                   " (void)argv; return (int)(%s) & 1; }" % calls)
        src = os.path.join(d, "src", "svc%02d.c" % b)
        with open(src, "w") as fh:
            fh.write("\n".join(out) + "\n")
        exe = os.path.join(d, "bin", "svc%02d" % b)
        subprocess.run(["gcc", "-g", "-O0", "-o", exe, src], check=True)
        syms = subprocess.run(["nm", exe], check=True, capture_output=True, text=True).stdout
        addrs[b] = [line.split()[0] for line in syms.splitlines()
                    if line.split()[-1].startswith("f") and len(line.split()) == 3]
    with open(os.path.join(d, "addrs.json"), "w") as fh:
        json.dump(addrs, fh)


def run_symbolize(d):
    """A profile symbolization service: 60 requests, each for one of 10 service binaries
    built with -g (Zipf(1.0): the busiest services are profiled most), each `addr2line
    -f -i` of 40 sampled addresses; addr2line reads the ELF headers, then the whole debug
    sections (info, line, str, abbrev) it needs, every time."""
    import json
    import subprocess

    rng = random.Random(SEED + 421)
    with open(os.path.join(d, "addrs.json")) as fh:
        addrs = json.load(fh)
    order = list(range(SYM_BINARIES))
    rng.shuffle(order)
    got = 0
    for rank in zipf_ranks(SYM_BINARIES, 1.0, SYM_REQUESTS, rng):
        b = order[rank]
        picks = "\n".join(rng.choice(addrs[str(b)]) for _ in range(40)) + "\n"
        out = subprocess.run(["addr2line", "-f", "-i", "-e", "bin/svc%02d" % b], cwd=d,
                             input=picks, text=True, check=True, capture_output=True).stdout
        got += len(out)
    print("symbolize: %d bytes" % got)


# --- graphwalk ------------------------------------------------------------------------

GRAPH_NODES = 1_000_000
GRAPH_BATCHES = 100
GRAPH_SEEDS = 32
GRAPH_FANOUT = 8


def gen_graphwalk(d):
    import array

    rng = random.Random(SEED + 430)
    os.makedirs(d, exist_ok=True)
    offsets = array.array("q", [0])
    with open(os.path.join(d, "edges.bin"), "wb") as f:
        for v in range(GRAPH_NODES):
            deg = min(int(rng.lognormvariate(1.8, 1.1)), 5_000)  # median ~6, heavy tail
            # Neighbours skewed toward low ids (the hubs) and toward v's own id range
            # (a community-ordered graph, as graph stores lay them out).
            nbrs = array.array("i", (
                int(GRAPH_NODES * rng.random() ** 3) if rng.random() < 0.5
                else min(max(v + int(rng.gauss(0, 2_000)), 0), GRAPH_NODES - 1)
                for _ in range(deg)))
            f.write(nbrs.tobytes())
            offsets.append(offsets[-1] + deg)
    with open(os.path.join(d, "offsets.bin"), "wb") as f:
        f.write(offsets.tobytes())


def run_graphwalk(d):
    """GraphSAGE-style neighbour sampling over a CSR graph on disk (1 M nodes, 8-byte
    offsets and 4-byte neighbour ids): 4 threads each draw 25 batches of 32 training
    seeds; per seed a pread of its offsets pair and its neighbour list, 8 sampled
    neighbours, and the same for each of them (2 hops)."""
    import array
    import struct
    from concurrent.futures import ThreadPoolExecutor

    off_fd = os.open(os.path.join(d, "offsets.bin"), os.O_RDONLY)
    edge_fd = os.open(os.path.join(d, "edges.bin"), os.O_RDONLY)

    def neighbours(v):
        lo, hi = struct.unpack("<qq", os.pread(off_fd, 16, 8 * v))
        if hi == lo:
            return []
        nb = array.array("i")
        nb.frombytes(os.pread(edge_fd, 4 * (hi - lo), 4 * lo))
        return list(nb)

    def worker(w):
        rng = random.Random(SEED + 431 + w)
        train = range(0, GRAPH_NODES, 5)  # every fifth node is labelled
        seen = 0
        for _ in range(GRAPH_BATCHES // 4):
            for s in rng.sample(train, GRAPH_SEEDS):
                nb = neighbours(s)
                for u in rng.sample(nb, min(GRAPH_FANOUT, len(nb))):
                    seen += len(neighbours(u))
        return seen

    with ThreadPoolExecutor(4) as pool:
        total = sum(pool.map(worker, range(4)))
    os.close(off_fd)
    os.close(edge_fd)
    print("graphwalk: %d edges seen" % total)


# --- parload --------------------------------------------------------------------------

PARLOAD_SHARDS = 4
PARLOAD_SHARD_BYTES = 48 << 20
PARLOAD_THREADS = 8


def gen_parload(d):
    rng = random.Random(SEED + 440)
    os.makedirs(d, exist_ok=True)
    block = rng.randbytes(1 << 20)
    for i in range(PARLOAD_SHARDS):
        with open(os.path.join(d, "model-%05d-of-%05d.bin" % (i + 1, PARLOAD_SHARDS)), "wb") as f:
            for k in range(PARLOAD_SHARD_BYTES >> 20):
                f.write(block[k % 7 :] + block[: k % 7])


def run_parload(d):
    """A parallel checkpoint loader (as torch.distributed.checkpoint or a safetensors
    loader with a thread pool reads a shard): 8 threads of one process each read a
    contiguous eighth of a shard in 1 MiB reads, all at once, shard after shard; the
    model is loaded, then loaded again (an evaluation restart)."""
    from concurrent.futures import ThreadPoolExecutor

    names = sorted(n for n in os.listdir(d) if n.startswith("model-"))
    got = 0

    def segment(args):
        path, lo, hi = args
        fd = os.open(path, os.O_RDONLY)
        n = 0
        try:
            at = lo
            while at < hi:
                n += len(os.pread(fd, min(1 << 20, hi - at), at))
                at += 1 << 20
        finally:
            os.close(fd)
        return n

    with ThreadPoolExecutor(PARLOAD_THREADS) as pool:
        for _ in range(2):
            for name in names:
                path = os.path.join(d, name)
                size = os.path.getsize(path)
                part = size // PARLOAD_THREADS
                segs = [(path, k * part, size if k == PARLOAD_THREADS - 1 else (k + 1) * part)
                        for k in range(PARLOAD_THREADS)]
                got += sum(pool.map(segment, segs))
    print("parload: %d bytes" % got)


# --- sqldesc --------------------------------------------------------------------------

SQLDESC_ROWS = 400_000
SQLDESC_QUERIES = 1_500


def gen_sqldesc(d):
    import sqlite3

    rng = random.Random(SEED + 450)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "events.db")
    if os.path.exists(path):
        os.remove(path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA page_size = 4096")
    db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, ts INTEGER, user INTEGER, "
               "kind TEXT, body TEXT)")
    t = 1_700_000_000
    rows = []
    for i in range(SQLDESC_ROWS):
        t += rng.randrange(1, 5)
        rows.append((i, t, rng.randrange(50_000), rng.choice(["view", "click", "buy", "error"]),
                     rng.randbytes(rng.randrange(40, 200)).hex()))
    db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", rows)
    db.execute("CREATE INDEX events_ts ON events (ts)")
    db.commit()
    db.close()


def run_sqldesc(d):
    """An activity feed over a SQLite event table (4 KiB pages, rows in time order):
    1,500 queries `ORDER BY id DESC LIMIT 200` from a point Zipf(0.9)-skewed toward now,
    each a page of a feed scrolled back through history (the table read backwards
    through its rowid B-tree), and every 10th a count of one kind over the last hour
    through the ts index."""
    import sqlite3

    rng = random.Random(SEED + 451)
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(d, "events.db"), uri=True)
    db.execute("PRAGMA cache_size = -2048")  # 2 MiB of its own page cache
    hi, = db.execute("SELECT max(ts) FROM events").fetchone()
    lo, = db.execute("SELECT min(ts) FROM events").fetchone()
    span = hi - lo
    got = 0
    for q, rank in enumerate(zipf_ranks(1000, 0.9, SQLDESC_QUERIES, rng)):
        start = hi - rank * span // 1000
        rows = db.execute("SELECT id, ts, kind, body FROM events WHERE id <= "
                          "(SELECT id FROM events WHERE ts <= ? ORDER BY ts DESC LIMIT 1) "
                          "ORDER BY id DESC LIMIT 200", (start,)).fetchall()
        got += len(rows)
        if q % 10 == 9:
            n, = db.execute("SELECT count(*) FROM events WHERE ts > ? AND kind = 'error'",
                            (hi - 3600,)).fetchone()
            got += n
    db.close()
    print("sqldesc: %d rows" % got)


# --- sweep --------------------------------------------------------------------------

SWEEP_FILES = 2_400
SWEEP_JOBS = 3
SWEEP_EPOCHS = 2


def gen_sweep(d):
    rng = random.Random(SEED + 460)
    noise = rng.randbytes(1 << 20)
    for i in range(SWEEP_FILES):
        cdir = os.path.join(d, "train", "c%02d" % (i % 40))
        os.makedirs(cdir, exist_ok=True)
        size = _clamped_lognormal(rng, 10.9, 0.7, 4 << 10, 512 << 10)  # median ~54 KiB
        with open(os.path.join(cdir, "%05d.jpg" % i), "wb") as f:
            f.write(_noise_slice(rng, noise, size))


def _decode_whole(path):
    """A sample read whole, as a loader's decode does (shared by the image loaders)."""
    import zlib

    with open(path, "rb") as f:
        return zlib.crc32(f.read())  # a decode's worth of work per byte


def _sweep_job(d, k):
    """One trial of the sweep: multiprocessing.Pool(2) over the whole image folder, a
    shuffle of its own seed each epoch, chunksize 8."""
    from multiprocessing import Pool

    rng = random.Random(SEED + 461 + k)
    files = files_under(os.path.join(d, "train"))
    with Pool(2) as pool:
        for _ in range(SWEEP_EPOCHS):
            order = files[:]
            rng.shuffle(order)
            for _ in pool.imap_unordered(_decode_whole, order, chunksize=8):
                pass


def run_sweep(d):
    """A hyperparameter sweep: 3 trials of one training script started 1.5 s apart, each
    its own session (as a scheduler launches them), each reading the same image folder
    for 2 shuffled epochs with its own seed: one data set shared by jobs at different
    points of their epochs."""
    import subprocess
    import time

    here = os.path.dirname(os.path.abspath(__file__))
    procs = []
    for k in range(SWEEP_JOBS):
        code = "import sys; sys.path.insert(0, %r)\nimport heldout\nheldout._sweep_job(%r, %d)\n" % (here, d, k)
        procs.append(subprocess.Popen([sys.executable, "-c", code], start_new_session=True))
        time.sleep(1.5)
    for pr in procs:
        if pr.wait() != 0:
            raise SystemExit("a trial failed")
    print("sweep: %d trials" % SWEEP_JOBS)


# --- ckptavg ------------------------------------------------------------------------

CKPT_COUNT = 6
CKPT_WINDOW = 4
CKPT_LAYERS = 16
CKPT_HIDDEN = 256


def _ckpt_shapes():
    """(name, shape) of a small transformer's tensors, in the model's own order."""
    h = CKPT_HIDDEN
    out = [("embed.weight", (8000, h))]
    for i in range(CKPT_LAYERS):
        p = "layers.%d." % i
        out += [(p + "attn_norm.weight", (h,))]
        out += [(p + "attn.%s.weight" % w, (h, h)) for w in ("q", "k", "v", "o")]
        out += [(p + "mlp_norm.weight", (h,)), (p + "mlp.up.weight", (4 * h, h)),
                (p + "mlp.up.bias", (4 * h,)), (p + "mlp.down.weight", (h, 4 * h))]
    out += [("norm.weight", (h,)), ("lm_head.weight", (8000, h))]
    return out


def gen_ckptavg(d):
    import json
    import struct

    rng = random.Random(SEED + 470)
    noise = rng.randbytes(4 << 20)
    shapes = _ckpt_shapes()
    os.makedirs(d, exist_ok=True)
    for c in range(CKPT_COUNT):
        # safetensors' writer lays tensors out in name order (lexicographic: layers.10
        # before layers.2), not in the model's order.
        header, at = {}, 0
        for name, shape in sorted(shapes):
            n = 2
            for s in shape:
                n *= s
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + n]}
            at += n
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(os.path.join(d, "step-%05d.safetensors" % ((c + 1) * 1000)), "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for name, _ in sorted(shapes):
                b, e = header[name]["data_offsets"]
                f.write(_noise_slice(rng, noise, e - b))


def run_ckptavg(d):
    """Checkpoint averaging (a "model soup" / EMA of the last 4 checkpoints), over a
    sliding window: steps 1-4, then 2-5, then 3-6. Each window opens its 4 safetensors
    files, reads each header (8-byte length, then the JSON), then for each tensor in the
    model's order (layers.2 before layers.10) reads it from all 4 files with pread and
    averages them: 4 files read in lockstep, each in an order that jumps about its
    name-sorted layout."""
    import json
    import struct
    import zlib

    names = sorted(n for n in os.listdir(d) if n.endswith(".safetensors"))
    order = [name for name, _ in _ckpt_shapes()]
    got = 0
    for w in range(len(names) - CKPT_WINDOW + 1):
        fds, headers = [], []
        for name in names[w:w + CKPT_WINDOW]:
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            n, = struct.unpack("<Q", os.pread(fd, 8, 0))
            headers.append((8 + n, json.loads(os.pread(fd, n, 8))))
            fds.append(fd)
        for t in order:
            acc = 0
            for fd, (base, hdr) in zip(fds, headers):
                b, e = hdr[t]["data_offsets"]
                data = os.pread(fd, e - b, base + b)
                acc = zlib.crc32(data, acc)
                got += len(data)
        for fd in fds:
            os.close(fd)
    print("ckptavg: %d bytes" % got)


# --- bgzf ---------------------------------------------------------------------------

BGZF_SAMPLES = 3
BGZF_BLOCKS = 900
BGZF_QUERIES = 700
BGZF_GENES = 3_000


def _bgzf_block(data):
    """One BGZF block: a gzip member with the BC extra field giving its size."""
    import struct
    import zlib

    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    cdata = c.compress(data) + c.flush()
    bsize = 18 + len(cdata) + 8
    head = b"\x1f\x8b\x08\x04" + b"\x00" * 4 + b"\x00\xff" + struct.pack("<H", 6) + b"BC" + struct.pack("<HH", 2, bsize - 1)
    return head + cdata + struct.pack("<II", zlib.crc32(data), len(data))


def gen_bgzf(d):
    import struct

    rng = random.Random(SEED + 480)
    bases = bytes(b"ACGT"[i % 4] for i in range(256))
    quals = bytes(33 + (i % 41) for i in range(256))
    os.makedirs(d, exist_ok=True)
    for s in range(BGZF_SAMPLES):
        pos, at, index = 1, 0, []
        with open(os.path.join(d, "sample%d.bgz" % s), "wb") as f:
            for _ in range(BGZF_BLOCKS):
                lines, n = [], 0
                first = pos
                while n < 60_000:
                    pos += rng.randrange(0, 60)
                    line = b"chr1\t%d\tr%08x\t%s\t%s\n" % (pos, rng.getrandbits(32), rng.randbytes(100).translate(bases), rng.randbytes(100).translate(quals))
                    lines.append(line)
                    n += len(line)
                block = _bgzf_block(b"".join(lines))
                index.append((first, at))
                f.write(block)
                at += len(block)
            f.write(_bgzf_block(b""))  # the EOF marker block
        with open(os.path.join(d, "sample%d.bgz.idx" % s), "wb") as f:
            f.write(b"".join(struct.pack("<QQ", p, o) for p, o in index))


def run_bgzf(d):
    """Region queries over 3 samples' BGZF files (BAM-like: sorted records in
    deflate blocks of <= 64 KiB, an index of each block's first position read whole at
    start), the way a joint variant caller or a genome browser asks: 700 regions of
    2-60 kb around Zipf(1.0)-popular genes, each read in all 3 samples: seek to the
    first block that can hold it, then block after block (the header's 18 bytes, then
    the rest, through Python's buffered reader) until past the region's end."""
    import bisect
    import struct
    import zlib

    rng = random.Random(SEED + 481)
    samples = []
    for s in range(BGZF_SAMPLES):
        with open(os.path.join(d, "sample%d.bgz.idx" % s), "rb") as f:
            raw = f.read()
        idx = [struct.unpack_from("<QQ", raw, i) for i in range(0, len(raw), 16)]
        samples.append((open(os.path.join(d, "sample%d.bgz" % s), "rb"), [p for p, _ in idx], [o for _, o in idx]))
    span = min(firsts[-1] for _, firsts, _ in samples)
    genes = [rng.randrange(1, span) for _ in range(BGZF_GENES)]
    hits = 0
    for g in zipf_ranks(BGZF_GENES, 1.0, BGZF_QUERIES, rng):
        lo = genes[g]
        hi = lo + rng.randrange(2_000, 60_000)
        for f, firsts, offs in samples:
            k = max(0, bisect.bisect_right(firsts, lo) - 1)
            f.seek(offs[k])
            while k < len(firsts) and firsts[k] <= hi:
                head = f.read(18)
                bsize = struct.unpack_from("<H", head, 16)[0] + 1
                rest = f.read(bsize - 18)
                text = zlib.decompressobj(-15).decompress(rest[:-8])
                for line in text.split(b"\n"):
                    if line:
                        p = int(line.split(b"\t", 2)[1])
                        if lo <= p <= hi:
                            hits += 1
                k += 1
    for f, _, _ in samples:
        f.close()
    print("bgzf: %d records" % hits)


# --- balanced -----------------------------------------------------------------------

BALANCED_CLASSES = [1_200, 600, 300, 150, 80, 40, 20, 10]
BALANCED_DRAWS = 2_400
BALANCED_EPOCHS = 3


def gen_balanced(d):
    rng = random.Random(SEED + 490)
    noise = rng.randbytes(1 << 20)
    for c, count in enumerate(BALANCED_CLASSES):
        cdir = os.path.join(d, "train", "class%d" % c)
        os.makedirs(cdir, exist_ok=True)
        for i in range(count):
            size = _clamped_lognormal(rng, 10.6, 0.6, 4 << 10, 384 << 10)  # median ~40 KiB
            with open(os.path.join(cdir, "%05d.jpg" % i), "wb") as f:
                f.write(_noise_slice(rng, noise, size))


def run_balanced(d):
    """A class-balanced sampler with replacement (PyTorch's WeightedRandomSampler with
    weights 1/class size) over an imbalanced image folder: each draw picks a class
    uniformly, then one of its files; 3 epochs of 2,400 draws read whole by
    multiprocessing.Pool(4), chunksize 16. A rare class's files come back many times
    an epoch, a common class's once in several epochs."""
    from multiprocessing import Pool

    rng = random.Random(SEED + 491)
    root = os.path.join(d, "train")
    classes = [files_under(os.path.join(root, c)) for c in sorted(os.listdir(root))]
    with Pool(4) as pool:
        for _ in range(BALANCED_EPOCHS):
            order = [rng.choice(rng.choice(classes)) for _ in range(BALANCED_DRAWS)]
            for _ in pool.imap(_decode_whole, order, chunksize=16):
                pass
    print("balanced: %d draws" % (BALANCED_DRAWS * BALANCED_EPOCHS))


# --- curriculum ---------------------------------------------------------------------

CURRICULUM_FILES = 3_000
CURRICULUM_STAGES = [1 / 3, 2 / 3, 1.0, 1.0]


def gen_curriculum(d):
    import json

    rng = random.Random(SEED + 500)
    noise = rng.randbytes(1 << 20)
    scores = {}
    for i in range(CURRICULUM_FILES):
        sdir = os.path.join(d, "data", "shard%02d" % (i % 30))
        os.makedirs(sdir, exist_ok=True)
        name = "shard%02d/%05d.bin" % (i % 30, i)
        size = _clamped_lognormal(rng, 10.9, 0.5, 8 << 10, 256 << 10)  # median ~54 KiB
        with open(os.path.join(d, "data", name), "wb") as f:
            f.write(_noise_slice(rng, noise, size))
        scores[name] = round(rng.random(), 6)
    with open(os.path.join(d, "difficulty.json"), "w") as f:
        json.dump(scores, f)


def run_curriculum(d):
    """Curriculum training: samples ranked by a difficulty score (a JSON file read at
    start), epoch 1 over the easiest third, epoch 2 the easiest two thirds, epochs 3
    and 4 over all, each epoch shuffled, read whole by 4 threads: a working set that
    grows, its oldest part read most."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(SEED + 501)
    with open(os.path.join(d, "difficulty.json")) as f:
        scores = json.load(f)
    ranked = sorted(scores, key=lambda n: scores[n])

    def load(name):
        return _decode_whole(os.path.join(d, "data", name))

    reads = 0
    with ThreadPoolExecutor(4) as pool:
        for share in CURRICULUM_STAGES:
            pool_names = ranked[:int(len(ranked) * share)]
            rng.shuffle(pool_names)
            for _ in pool.map(load, pool_names):
                reads += 1
    print("curriculum: %d reads" % reads)


# --- dedup --------------------------------------------------------------------------

DEDUP_FILES = 4_000


def gen_dedup(d):
    """A tree of photos and documents where about one file in five is a copy of another
    (same size, same bytes) and many distinct files share a size (sizes rounded to
    512 bytes, as camera and office files often are)."""
    rng = random.Random(SEED + 510)
    noise = rng.randbytes(4 << 20)
    made = []
    for i in range(DEDUP_FILES):
        sub = os.path.join(d, "home", "user%d" % (i % 6), "dir%02d" % (i % 37))
        os.makedirs(sub, exist_ok=True)
        path = os.path.join(sub, "f%05d.dat" % i)
        if made and rng.random() < 0.2:
            with open(rng.choice(made), "rb") as src:
                data = src.read()
        else:
            size = _clamped_lognormal(rng, 11.5, 1.3, 1 << 10, 6 << 20) // 512 * 512 + 512
            data = _noise_slice(rng, noise, size)
            if rng.random() < 0.3:
                # a distinct file whose head is another file's (same template, other body)
                data = (noise[:4096] + data[4096:])[:size]
        with open(path, "wb") as f:
            f.write(data)
        made.append(path)


def run_dedup(d):
    """fdupes' algorithm: walk the tree, group by size (stat only), read the first
    4 KiB of every file in a group of two or more, hash whole files whose heads collide
    (64 KiB reads), then compare each duplicate pair byte by byte in 8 KiB steps before
    reporting it."""
    import hashlib

    by_size = {}
    for path in files_under(os.path.join(d, "home")):
        by_size.setdefault(os.stat(path).st_size, []).append(path)
    pairs = 0
    for size in sorted(by_size):
        group = by_size[size]
        if len(group) < 2:
            continue
        by_head = {}
        for path in group:
            with open(path, "rb") as f:
                by_head.setdefault(hashlib.md5(f.read(4096)).digest(), []).append(path)
        for heads in by_head.values():
            if len(heads) < 2:
                continue
            by_full = {}
            for path in heads:
                h = hashlib.md5()
                with open(path, "rb") as f:
                    while True:
                        chunk = f.read(65536)
                        if not chunk:
                            break
                        h.update(chunk)
                by_full.setdefault(h.digest(), []).append(path)
            for same in by_full.values():
                first = same[0]
                for other in same[1:]:
                    with open(first, "rb") as a, open(other, "rb") as b:
                        while True:
                            x, y = a.read(8192), b.read(8192)
                            if x != y:
                                break
                            if not x:
                                pairs += 1
                                break
    print("dedup: %d duplicate pairs" % pairs)


# --- mixture ------------------------------------------------------------------------

MIXTURE_SOURCES = [("books", 2, 0.5), ("code", 8, 0.3), ("web", 24, 0.2)]
MIXTURE_SHARD = 4 << 20
MIXTURE_DRAWS = 3_000
MIXTURE_WINDOW = 32 << 10


def gen_mixture(d):
    rng = random.Random(SEED + 520)
    noise = rng.randbytes(8 << 20)
    for name, shards, _ in MIXTURE_SOURCES:
        os.makedirs(os.path.join(d, name), exist_ok=True)
        for i in range(shards):
            with open(os.path.join(d, name, "shard-%05d.bin" % i), "wb") as f:
                f.write(_noise_slice(rng, noise, MIXTURE_SHARD))


def _mixture_worker(d, k):
    """One data-loader process: draws sources by weight, then a shard of the source and a
    32 KiB window at a random token offset (`np.memmap`-free: `pread`, as a loader over
    `open` files does)."""
    rng = random.Random(SEED + 521 + k)
    sources = [(sorted(os.listdir(os.path.join(d, n))), n, w) for n, _, w in MIXTURE_SOURCES]
    fds = {}
    got = 0
    for _ in range(MIXTURE_DRAWS // 2):
        names, src, _ = rng.choices(sources, weights=[w for _, _, w in sources])[0]
        name = rng.choice(names)
        path = os.path.join(d, src, name)
        fd = fds.get(path)
        if fd is None:
            fd = fds[path] = os.open(path, os.O_RDONLY)
        at = rng.randrange(0, MIXTURE_SHARD - MIXTURE_WINDOW) // 2 * 2
        got += len(os.pread(fd, MIXTURE_WINDOW, at))
    for fd in fds.values():
        os.close(fd)
    return got


def run_mixture(d):
    """A pretraining data mixture: 3 sources of token shards (2, 8 and 24 shards of 4 MB)
    drawn with weights 0.5 / 0.3 / 0.2 regardless of their sizes, so the small source's
    bytes are read 30 times as often as the large one's; each draw is a 32 KiB window at a
    random offset of a random shard of its source, read with `pread` by 2 processes."""
    from multiprocessing import Pool

    with Pool(2) as pool:
        got = sum(pool.starmap(_mixture_worker, [(d, 0), (d, 1)]))
    print("mixture: %d bytes" % got)


# --- traineval ----------------------------------------------------------------------

TRAINEVAL_SHARDS = 12
TRAINEVAL_PER_SHARD = 200
TRAINEVAL_VAL = 40
TRAINEVAL_EVERY = 150


def gen_traineval(d):
    rng = random.Random(SEED + 530)
    noise = rng.randbytes(1 << 20)

    def sample():
        size = _clamped_lognormal(rng, 10.8, 0.5, 8 << 10, 256 << 10)
        return _noise_slice(rng, noise, size)

    os.makedirs(os.path.join(d, "train"), exist_ok=True)
    for s_ in range(TRAINEVAL_SHARDS):
        _write_tar(
            os.path.join(d, "train", "shard-%04d.tar" % s_),
            (("%06d.jpg" % (s_ * TRAINEVAL_PER_SHARD + i), sample())
             for i in range(TRAINEVAL_PER_SHARD)),
        )
    os.makedirs(os.path.join(d, "val"), exist_ok=True)
    for i in range(TRAINEVAL_VAL):
        with open(os.path.join(d, "val", "%04d.jpg" % i), "wb") as f:
            f.write(sample())


def _traineval_stream(path):
    """One worker's shard, streamed as webdataset does: the tar read front to back in 64
    KiB reads, each member's bytes handed on."""
    import tarfile

    n = 0
    with open(path, "rb", buffering=0) as raw:
        import io

        f = io.BufferedReader(raw, buffer_size=64 << 10)
        with tarfile.open(fileobj=f, mode="r|") as tar:
            for m in tar:
                if m.isfile():
                    n += len(tar.extractfile(m).read())
    return n


def run_traineval(d):
    """Webdataset-style training with periodic evaluation: 2 worker processes stream the
    12 training shards (each worker its own shards, 64 KiB reads), and after every 150
    training samples the main process evaluates on a 40-file validation set read whole
    in name order: a stream that never comes back, and a small set that comes back
    every few seconds."""
    from multiprocessing import Pool

    shards = files_under(os.path.join(d, "train"))
    val = files_under(os.path.join(d, "val"))
    evals = 0
    with Pool(2) as pool:
        done = 0
        for _ in pool.imap(_traineval_stream, shards):
            done += TRAINEVAL_PER_SHARD
            while evals * TRAINEVAL_EVERY < done:
                for path in val:
                    with open(path, "rb") as f:
                        f.read()
                evals += 1
    print("traineval: %d evaluations" % evals)


# --- casstore ----------------------------------------------------------------------

CAS_BLOBS = 4_000
CAS_LOOKUPS = 8_000


def _cas_path(d, digest):
    return os.path.join(d, "objects", digest[:2], digest[2:])


def gen_casstore(d):
    import hashlib

    rng = random.Random(SEED + 540)
    noise = rng.randbytes(1 << 20)
    digests = []
    for _ in range(CAS_BLOBS):
        size = _clamped_lognormal(rng, 10.0, 1.0, 1 << 10, 512 << 10)
        data = _noise_slice(rng, noise, size)
        digest = hashlib.sha256(data).hexdigest()
        os.makedirs(os.path.dirname(_cas_path(d, digest)), exist_ok=True)
        with open(_cas_path(d, digest), "wb") as f:
            f.write(data)
        digests.append(digest)
    # The store's index, in insertion order: popularity is drawn over it, so a blob's
    # rank has nothing to do with its name.
    with open(os.path.join(d, "index.txt"), "w") as f:
        f.write("\n".join(digests) + "\n")


def run_casstore(d):
    """Lookups in a content-addressed store: 4 threads resolve 8,000 references drawn
    Zipf(1.0) over the store's 4,000 blobs (log-normal sizes, median ~22 KB) and read
    each blob whole, as a build cache or a model hub's blob directory is read."""
    from concurrent.futures import ThreadPoolExecutor

    with open(os.path.join(d, "index.txt")) as f:
        digests = f.read().split()
    rng = random.Random(SEED + 541)
    refs = [digests[k] for k in zipf_ranks(len(digests), 1.0, CAS_LOOKUPS, rng)]

    def fetch(digest):
        with open(_cas_path(d, digest), "rb") as f:
            return len(f.read())

    with ThreadPoolExecutor(4) as pool:
        got = sum(pool.map(fetch, refs, chunksize=8))
    print("casstore: %d bytes" % got)


# --- resampled ---------------------------------------------------------------------

RESAMPLED_SHARDS = 16
RESAMPLED_PER_SHARD = 150
RESAMPLED_DRAWS = 20


def gen_resampled(d):
    rng = random.Random(SEED + 550)
    noise = rng.randbytes(1 << 20)
    for s_ in range(RESAMPLED_SHARDS):
        _write_tar(
            os.path.join(d, "shard-%04d.tar" % s_),
            (("%06d.cls" % (s_ * RESAMPLED_PER_SHARD + i),
              _noise_slice(rng, noise, _clamped_lognormal(rng, 10.3, 0.6, 4 << 10, 256 << 10)))
             for i in range(RESAMPLED_PER_SHARD)),
        )


def _resampled_worker(d, k):
    """One worker of `wds.ResampledShards`: draws shards uniformly with replacement and
    streams each front to back (64 KiB reads)."""
    rng = random.Random(SEED + 551 + k)
    shards = files_under(d)
    n = 0
    for _ in range(RESAMPLED_DRAWS):
        n += _traineval_stream(rng.choice(shards))
    return n


def run_resampled(d):
    """webdataset's ResampledShards with 2 workers: 40 draws of 16 shards (~5 MB each)
    with replacement, each draw streamed whole."""
    from multiprocessing import Pool

    with Pool(2) as pool:
        got = sum(pool.starmap(_resampled_worker, [(d, 0), (d, 1)]))
    print("resampled: %d bytes" % got)


# --- hfhub -------------------------------------------------------------------------

HFHUB_MODELS = [("llama-mini", 3), ("bert-base", 1), ("vit-small", 1), ("whisper-tiny", 2),
                ("t5-small", 2), ("clip-b32", 2)]
HFHUB_SHARD = 9 << 20
HFHUB_REQUESTS = 80
HFHUB_SLOTS = 2


def gen_hfhub(d):
    import hashlib
    import json
    import struct

    rng = random.Random(SEED + 560)
    noise = rng.randbytes(16 << 20)  # longer than a shard: _noise_slice wraps once at most
    for name, shards in HFHUB_MODELS:
        repo = os.path.join(d, "models--org--" + name)
        rev = hashlib.sha1(name.encode()).hexdigest()
        os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
        os.makedirs(os.path.join(repo, "snapshots", rev), exist_ok=True)

        def put(fname, data):
            digest = hashlib.sha256(data).hexdigest()
            with open(os.path.join(repo, "blobs", digest), "wb") as f:
                f.write(data)
            link = os.path.join(repo, "snapshots", rev, fname)
            if os.path.lexists(link):  # generated again (a mix generates its parts)
                os.remove(link)
            os.symlink(os.path.join("..", "..", "blobs", digest), link)

        put("config.json", json.dumps({"model": name, "shards": shards}).encode())
        for i in range(shards):
            size = HFHUB_SHARD + rng.randrange(-(2 << 20), 2 << 20)
            tensors, at = {}, 0
            for t in range(24):
                n = size // 24 // 4 * 4
                tensors["layer.%d.weight" % t] = {"dtype": "F32", "shape": [n // 4],
                                                  "data_offsets": [at, at + n]}
                at += n
            header = json.dumps(tensors).encode()
            put("model-%05d-of-%05d.safetensors" % (i + 1, shards),
                struct.pack("<Q", len(header)) + header + _noise_slice(rng, noise, at))
        with open(os.path.join(repo, "refs"), "w") as f:
            f.write(rev)


def _hfhub_load(d, name):
    """What a loader without mmap reads: the config, then each shard's 8-byte header
    length, its JSON header, and its tensors in 16 MiB reads."""
    import json
    import struct

    repo = os.path.join(d, "models--org--" + name)
    with open(os.path.join(repo, "refs")) as f:
        snap = os.path.join(repo, "snapshots", f.read().strip())
    with open(os.path.join(snap, "config.json"), "rb") as f:
        config = json.loads(f.read())
    got = 0
    for i in range(config["shards"]):
        path = os.path.join(snap, "model-%05d-of-%05d.safetensors" % (i + 1, config["shards"]))
        with open(path, "rb", buffering=0) as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            left = max(t["data_offsets"][1] for t in header.values())
            while left > 0:
                b = f.read(min(left, 16 << 20))
                if not b:
                    break
                got += len(b)
                left -= len(b)
    return got


def run_hfhub(d):
    """A model server with 2 slots over a hub cache: 80 requests drawn Zipf(1.2) over 6
    models; a model not in a slot replaces the least recently used one and is loaded
    from its snapshot (config, then every shard whole)."""
    rng = random.Random(SEED + 561)
    names = [n for n, _ in HFHUB_MODELS]
    slots, loads, got = [], 0, 0
    for k in zipf_ranks(len(names), 1.2, HFHUB_REQUESTS, rng):
        name = names[k]
        if name in slots:
            slots.remove(name)
        else:
            if len(slots) == HFHUB_SLOTS:
                slots.pop(0)
            got += _hfhub_load(d, name)
            loads += 1
        slots.append(name)
    print("hfhub: %d loads, %d bytes" % (loads, got))


# --- unziplookups ------------------------------------------------------------------

UNZIP_MEMBERS = 3_000
UNZIP_LOOKUPS = 300


def gen_unziplookups(d):
    import zipfile

    rng = random.Random(SEED + 570)
    noise = rng.randbytes(1 << 20)
    os.makedirs(d, exist_ok=True)
    with zipfile.ZipFile(os.path.join(d, "corpus.zip"), "w", zipfile.ZIP_STORED) as z:
        for i in range(UNZIP_MEMBERS):
            size = _clamped_lognormal(rng, 9.7, 0.8, 1 << 10, 256 << 10)
            z.writestr("docs/%05d.txt" % i, _noise_slice(rng, noise, size))


def run_unziplookups(d):
    """Info-ZIP `unzip -p ARCHIVE MEMBER`, one process per lookup, 300 lookups Zipf(1.1)
    over the archive's 3,000 members (a notebook pulling documents out of a zip)."""
    import subprocess

    rng = random.Random(SEED + 571)
    archive = os.path.join(d, "corpus.zip")
    got = 0
    for k in zipf_ranks(UNZIP_MEMBERS, 1.1, UNZIP_LOOKUPS, rng):
        # Popularity unrelated to the members' order in the archive.
        member = "docs/%05d.txt" % ((k * 2654435761) % UNZIP_MEMBERS)
        out = subprocess.run(["unzip", "-p", archive, member], check=True,
                             stdout=subprocess.PIPE).stdout
        got += len(out)
    print("unziplookups: %d bytes" % got)



# --- driftserve --------------------------------------------------------------------

DRIFT_POSTS = 3_000
DRIFT_REQUESTS = 6_000
DRIFT_CLIENTS = 4
DRIFT_FIRST_HEAD = 600  # posts already published when the trace starts

# Node's own static server: `fs.createReadStream` (64 KiB reads from the libuv pool's
# threads) piped to the response.
DRIFT_SERVER_JS = r"""
const http = require('http'), fs = require('fs'), path = require('path');
const root = process.argv[1];
const srv = http.createServer((req, res) => {
  const p = path.join(root, decodeURIComponent(req.url));
  fs.stat(p, (err, st) => {
    if (err) { res.writeHead(404); res.end(); return; }
    res.writeHead(200, {'Content-Length': st.size});
    fs.createReadStream(p).pipe(res);
  });
});
srv.listen(0, '127.0.0.1', () => console.log(srv.address().port));
"""


def gen_driftserve(d):
    rng = random.Random(SEED + 580)
    noise = rng.randbytes(1 << 20)
    for i in range(DRIFT_POSTS):
        sub = os.path.join(d, "posts", "%02d" % (i // 100))
        os.makedirs(sub, exist_ok=True)
        size = _clamped_lognormal(rng, 10.3, 0.7, 4 << 10, 512 << 10)
        with open(os.path.join(sub, "post-%05d.html" % i), "wb") as f:
            f.write(_noise_slice(rng, noise, size))


def _drift_paths(rng):
    """The request stream: three quarters go to recent posts (Zipf(1.0) over the posts
    before the moving head: the newest is the most read), a quarter to evergreen posts
    (Zipf(0.8) over every published post, ranks fixed by a shuffle)."""
    evergreen = list(range(DRIFT_POSTS))
    rng.shuffle(evergreen)
    paths = []
    for i in range(DRIFT_REQUESTS):
        head = DRIFT_FIRST_HEAD + (DRIFT_POSTS - DRIFT_FIRST_HEAD) * i // DRIFT_REQUESTS
        if rng.random() < 0.75:
            post = head - 1 - zipf_ranks(head, 1.0, 1, rng)[0]
        else:
            drawn = (evergreen[k] for k in zipf_ranks(DRIFT_POSTS, 0.8, 8, rng))
            post = next((p for p in drawn if p < head), head - 1)
        paths.append("posts/%02d/post-%05d.html" % (post // 100, post))
    return paths


def run_driftserve(d):
    """A Node.js static file server under 4 keep-alive clients whose popularity drifts:
    posts are published in order during the run and readers go mostly to the newest
    (a blog or news site), some to evergreen posts."""
    import http.client
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    server = subprocess.Popen(["node", "-e", DRIFT_SERVER_JS, d], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(server.stdout.readline())
        paths = _drift_paths(random.Random(SEED + 581))

        def fetch(lane):
            conn = http.client.HTTPConnection("127.0.0.1", port)
            got = 0
            for p in lane:
                conn.request("GET", "/" + p)
                got += len(conn.getresponse().read())
            conn.close()
            return got

        # Request i goes to client i % 4: the clients move with the head together.
        with ThreadPoolExecutor(DRIFT_CLIENTS) as pool:
            got = sum(pool.map(fetch, [paths[c::DRIFT_CLIENTS] for c in range(DRIFT_CLIENTS)]))
    finally:
        server.terminate()
        server.wait()
    print("driftserve: %d bytes" % got)


# --- jqwindow ----------------------------------------------------------------------

JQ_HOURS = 96
JQ_QUERIES = 100
JQ_WINDOW = 6  # hours a dashboard query covers
JQ_DAILY_EVERY = 12  # every 12th query is a daily report over the last 24 hours


def gen_jqwindow(d):
    import json

    rng = random.Random(SEED + 590)
    os.makedirs(os.path.join(d, "logs"), exist_ok=True)
    users = ["u%03d" % i for i in range(300)]
    for h in range(JQ_HOURS):
        lines = []
        for _ in range(_clamped_lognormal(rng, 8.7, 0.3, 2_000, 12_000)):
            lines.append(json.dumps({"ts": h * 3600 + rng.randrange(3600),
                                     "user": rng.choice(users),
                                     "status": rng.choice([200, 200, 200, 404, 500]),
                                     "ms": rng.randrange(1, 900),
                                     "path": "/api/%d/%s" % (rng.randrange(40), rng.randbytes(24).hex())}))
        with open(os.path.join(d, "logs", "hour-%04d.jsonl" % h), "w") as f:
            f.write("\n".join(lines) + "\n")


def run_jqwindow(d):
    """`jq` dashboard queries over hourly JSONL logs as the hours go by: each query (a
    `jq` process) reads the last 6 hours' files whole; every 12th is a daily report over
    the last 24. From the first day's end to the last hour, the window slides about
    three quarters of an hour per query."""
    import subprocess

    got = 0
    for q in range(JQ_QUERIES):
        now = 24 + q * (JQ_HOURS - 24) // (JQ_QUERIES - 1)
        span = 24 if q % JQ_DAILY_EVERY == JQ_DAILY_EVERY - 1 else JQ_WINDOW
        files = [os.path.join(d, "logs", "hour-%04d.jsonl" % h) for h in range(now - span, now)]
        out = subprocess.run(["jq", "-c", "select(.status >= 500) | .ms"] + files,
                             check=True, stdout=subprocess.PIPE).stdout
        got += len(out)
    print("jqwindow: %d bytes of output" % got)


# --- nodestart ---------------------------------------------------------------------

NODE_PACKAGES = 60
NODE_COMMANDS = 12
NODE_RUNS = 30


def gen_nodestart(d):
    """A Node.js CLI's install tree: `node_modules` with 60 packages (a package.json, an
    index.js and 3-10 lib files of 1-40 KB each, some requiring other packages), and
    `app/` with a core and 12 subcommand modules, each requiring a few packages."""
    import json

    rng = random.Random(SEED + 600)
    filler = "// " + "x" * 70 + "\n"
    mods = os.path.join(d, "node_modules")
    for p in range(NODE_PACKAGES):
        name = "pkg%02d" % p
        root = os.path.join(mods, name)
        os.makedirs(os.path.join(root, "lib"), exist_ok=True)
        with open(os.path.join(root, "package.json"), "w") as f:
            json.dump({"name": name, "version": "1.%d.0" % p, "main": "index.js"}, f)
        libs = rng.randrange(3, 11)
        # Dependencies point forward only (no cycles); the last 20 packages are leaves.
        deps = rng.sample(range(p + 1, NODE_PACKAGES), 2) if p < 40 else []
        lines = ["'use strict';"]
        lines += ["require('./lib/part%d.js');" % i for i in range(libs)]
        lines += ["require('pkg%02d');" % q for q in deps]
        lines.append("module.exports = { name: '%s' };" % name)
        with open(os.path.join(root, "index.js"), "w") as f:
            f.write("\n".join(lines) + "\n")
        for i in range(libs):
            size = _clamped_lognormal(rng, 8.5, 0.9, 1 << 10, 40 << 10)
            with open(os.path.join(root, "lib", "part%d.js" % i), "w") as f:
                f.write("module.exports = %d;\n" % i + filler * (size // len(filler)))
    app = os.path.join(d, "app")
    os.makedirs(os.path.join(app, "commands"), exist_ok=True)
    core = rng.sample(range(NODE_PACKAGES), 8)
    with open(os.path.join(app, "main.js"), "w") as f:
        f.write("".join("require('pkg%02d');\n" % q for q in core))
        f.write("require('./commands/' + process.argv[2] + '.js');\n")
    for c in range(NODE_COMMANDS):
        with open(os.path.join(app, "commands", "cmd%02d.js" % c), "w") as f:
            f.write("".join("require('pkg%02d');\n" % q
                            for q in rng.sample(range(NODE_PACKAGES), rng.randrange(2, 7))))


def run_nodestart(d):
    """A Node.js CLI started 30 times (a serverless function's cold starts, a CI step):
    each run loads the core's packages and one subcommand's, subcommands drawn
    Zipf(1.0); every start resolves and reads its modules from disk again."""
    import subprocess

    rng = random.Random(SEED + 601)
    for k in zipf_ranks(NODE_COMMANDS, 1.0, NODE_RUNS, rng):
        subprocess.run(["node", os.path.join(d, "app", "main.js"), "cmd%02d" % k],
                       check=True, cwd=d, env={**os.environ, "NODE_PATH": os.path.join(d, "node_modules")})
    print("nodestart: %d runs" % NODE_RUNS)


# --- zstdepochs --------------------------------------------------------------------

ZSTD_SHARDS = 120
ZSTD_EPOCHS = 2


def gen_zstdepochs(d):
    """120 zstd-compressed shards of ~0.4-1 MB (hex records, about 2:1)."""
    import subprocess

    rng = random.Random(SEED + 610)
    os.makedirs(os.path.join(d, "shards"), exist_ok=True)
    for i in range(ZSTD_SHARDS):
        data = rng.randbytes(rng.randrange(400_000, 1_000_000)).hex()
        raw = os.path.join(d, "shards", "shard-%04d.txt" % i)
        with open(raw, "w") as f:
            f.write("\n".join(data[k:k + 128] for k in range(0, len(data), 128)) + "\n")
        subprocess.run(["zstd", "-q", "-f", "-3", "--rm", raw, "-o", raw + ".zst"], check=True)


def run_zstdepochs(d):
    """A preprocessing job's epochs over compressed shards: each epoch shuffles the
    shard list and `xargs -P 2` runs `zstd -dc` on each (two decompressors at once,
    output discarded), 2 epochs."""
    import subprocess

    rng = random.Random(SEED + 611)
    names = [os.path.join(d, "shards", "shard-%04d.txt.zst" % i) for i in range(ZSTD_SHARDS)]
    for _ in range(ZSTD_EPOCHS):
        rng.shuffle(names)
        subprocess.run(["xargs", "-P", "2", "-n", "1", "sh", "-c", "zstd -q -dc \"$0\" > /dev/null"],
                       input="\n".join(names).encode(), check=True)
    print("zstdepochs: %d epochs" % ZSTD_EPOCHS)


# --- nmsyms ------------------------------------------------------------------------

NM_LIBS = 240
NM_MAX_BYTES = 6 << 20
NM_LOOKUPS = 300


def gen_nmsyms(d):
    """A symbol server's store: up to 240 of this machine's shared libraries (each at
    most 6 MB, the smallest names first), copied under `libs/` (real ELF files)."""
    import glob
    import shutil

    os.makedirs(os.path.join(d, "libs"), exist_ok=True)
    found = sorted(p for p in glob.glob("/usr/lib/x86_64-linux-gnu/*.so.*")
                   if os.path.isfile(p) and not os.path.islink(p)
                   and os.path.getsize(p) <= NM_MAX_BYTES)
    for p in found[:NM_LIBS]:
        shutil.copyfile(p, os.path.join(d, "libs", os.path.basename(p)))


def run_nmsyms(d):
    """GNU nm as a symbol indexer and lookup service: first `nm -D --defined-only` over
    every library (`xargs -P 2`), then 300 lookups, each one `nm -D` of a library drawn
    Zipf(1.0) (a crash symbolizer asking about the libraries most processes load)."""
    import subprocess

    rng = random.Random(SEED + 620)
    libs = sorted(os.listdir(os.path.join(d, "libs")))
    paths = [os.path.join(d, "libs", n) for n in libs]
    subprocess.run(["xargs", "-P", "2", "-n", "8", "nm", "-D", "--defined-only"],
                   input="\n".join(paths).encode(), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    order = paths[:]
    rng.shuffle(order)
    for k in zipf_ranks(len(order), 1.0, NM_LOOKUPS, rng):
        subprocess.run(["nm", "-D", "--defined-only", order[k]], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print("nmsyms: %d libraries, %d lookups" % (len(paths), NM_LOOKUPS))


# --- tenantdb ----------------------------------------------------------------------

TENANTS = 240
TENANT_REGIONS = 8  # time zones 3 hours apart: a region is in business hours for 9 of 24
TENANT_REQUESTS = 800
TENANT_THREADS = 4
TENANT_GAP_S = 0.008  # requests arrive on a schedule: the day in 6.4 s


def _tenant_rows(rng):
    """Orders per tenant: log-normal (a few big customers, many small ones)."""
    return [_clamped_lognormal(rng, 7.3, 1.0, 300, 16_000) for _ in range(TENANTS)]


def gen_tenantdb(d):
    """A SaaS's database-per-tenant layout: 240 SQLite files (4 KiB pages) of 300-16,000
    orders each (log-normal), an index on customer and one on time, rows in time order."""
    import sqlite3

    rng = random.Random(SEED + 630)
    os.makedirs(os.path.join(d, "tenants"), exist_ok=True)
    for t, rows in enumerate(_tenant_rows(rng)):
        path = os.path.join(d, "tenants", "t%03d.db" % t)
        if os.path.exists(path):
            os.remove(path)
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER, ts INTEGER,"
                    " status INTEGER, amount REAL, note TEXT)")
        customers = max(10, rows // 12)
        day = 86_400
        con.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)",
                        ((i, rng.randrange(customers), i * 90 * day // rows, rng.randrange(5),
                          rng.randrange(100, 100_000) / 100, rng.randbytes(rng.randrange(20, 80)).hex())
                         for i in range(rows)))
        con.execute("CREATE INDEX orders_customer ON orders(customer)")
        con.execute("CREATE INDEX orders_ts ON orders(ts)")
        con.commit()
        con.close()


def _tenant_requests(rng):
    """The request stream over one simulated day: tenant t's weight is its base activity
    (its size to the 0.7, times a log-normal factor) while its region (t % 8, time zones
    3 hours apart) is in business hours (08:00-17:00 local) and a twentieth of that
    otherwise; the hot set follows the sun."""
    rows = _tenant_rows(random.Random(SEED + 630))
    base = [r ** 0.7 * rng.lognormvariate(0, 0.5) for r in rows]
    out = []
    for i in range(TENANT_REQUESTS):
        hour = 24 * i / TENANT_REQUESTS
        weights = []
        for t in range(TENANTS):
            local = (hour + 3 * (t % TENANT_REGIONS)) % 24
            weights.append(base[t] * (1.0 if 8 <= local < 17 else 0.05))
        t = rng.choices(range(TENANTS), weights)[0]
        kind = rng.random()
        out.append((t, rng.randrange(max(10, rows[t] // 12)),
                    "page" if kind < 0.6 else "dashboard" if kind < 0.95 else "export"))
    return out


def _paced(items, threads, gap_s, serve):
    """Serves `items` with `threads` worker threads, item i arriving `gap_s` seconds after
    item i-1 (a free worker takes the next once it is due); the sum of what `serve`
    returns for each: a server's requests on a fixed arrival schedule."""
    import threading
    import time

    lock = threading.Lock()
    queue = list(enumerate(items))
    queue.reverse()
    total = [0]
    start = time.monotonic()

    def worker():
        n = 0
        while True:
            with lock:
                if not queue:
                    break
                i, item = queue.pop()
            time.sleep(max(0.0, start + i * gap_s - time.monotonic()))
            n += serve(item)
        with lock:
            total[0] += n

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return total[0]


def run_tenantdb(d):
    """A multi-tenant web app with a database per tenant (Python's sqlite3), connections
    opened and closed per request as Django does by default (CONN_MAX_AGE=0), so every
    request reads the header, the schema and its pages again: 4 worker threads answer 800
    requests over a simulated day (a customer's last 10 orders through the customer index,
    a dashboard of the last day through the time index, now and then a CSV export of the
    last 30 days), the tenants' activity following their time zones' business hours.
    Requests arrive every 8 ms (the day in 6.4 s); a free worker takes the next."""
    import sqlite3

    rng = random.Random(SEED + 631)
    reqs = _tenant_requests(rng)

    def answer(req):
        t, cust, kind = req
        con = sqlite3.connect(os.path.join(d, "tenants", "t%03d.db" % t), check_same_thread=False)
        now = 90 * 86_400
        if kind == "page":
            res = con.execute("SELECT * FROM orders WHERE customer = ? ORDER BY ts DESC LIMIT 10", (cust,)).fetchall()
        elif kind == "dashboard":
            res = con.execute("SELECT status, count(*), sum(amount) FROM orders WHERE ts >= ? GROUP BY status",
                              (now - 86_400,)).fetchall()
        else:
            res = con.execute("SELECT * FROM orders WHERE ts >= ? ORDER BY ts", (now - 30 * 86_400,)).fetchall()
        con.close()
        return len(res)

    rows = _paced(reqs, TENANT_THREADS, TENANT_GAP_S, answer)
    print("tenantdb: %d requests, %d rows" % (len(reqs), rows))


# --- kafkalag ----------------------------------------------------------------------

KAFKA_PARTITIONS = 3
KAFKA_PARTITION_BYTES = 48 << 20
KAFKA_SEGMENT_BYTES = 8 << 20  # log.segment.bytes, small for a small topic
KAFKA_INDEX_INTERVAL = 4096  # log.index.interval.bytes
KAFKA_TICKS = 600
KAFKA_TICK_S = 0.012
KAFKA_START_HEAD = 24 << 20  # bytes per partition already produced when the trace starts
KAFKA_HEAD_PER_TICK = 40 << 10  # produced per partition per tick


def _kafka_batch(base_offset, records, ts, payload):
    """A Kafka record batch (magic 2): the 61-byte batch header, then the records (their
    varint framing reduced to a 4-byte length each; the CRC is left 0)."""
    import struct

    body = b"".join(struct.pack(">i", len(p)) + p for p in payload)
    length = 49 + len(body)  # the batch length counts from the leader epoch on
    head = struct.pack(">qiibIhiqqqhii", base_offset, length, 0, 2, 0, 0, records - 1, ts, ts,
                       -1, -1, -1, records)
    return head + body


def gen_kafkalag(d):
    """A Kafka topic's log directory: 3 partitions of 48 MB (`events-N/`), 8 MB segments
    named by their base offset (`%020d.log`), each with its sparse offset index (`.index`:
    8-byte entries of relative offset and position, one per 4 KiB of log) of record batches
    of 8-24 records of 0.3-2 KB (a producer's 16 KiB batches)."""
    import struct

    rng = random.Random(SEED + 640)
    noise = rng.randbytes(1 << 20)
    for p in range(KAFKA_PARTITIONS):
        pdir = os.path.join(d, "events-%d" % p)
        os.makedirs(pdir, exist_ok=True)
        offset, written, ts = 0, 0, 1_700_000_000_000
        while written < KAFKA_PARTITION_BYTES:
            base = offset
            log = open(os.path.join(pdir, "%020d.log" % base), "wb")
            index = bytearray()
            pos, last_indexed = 0, -KAFKA_INDEX_INTERVAL
            while pos < KAFKA_SEGMENT_BYTES and written + pos < KAFKA_PARTITION_BYTES:
                n = rng.randrange(8, 25)
                payload = [_noise_slice(rng, noise, rng.randrange(300, 2_000)) for _ in range(n)]
                batch = _kafka_batch(offset, n, ts, payload)
                if pos - last_indexed >= KAFKA_INDEX_INTERVAL:
                    index += struct.pack(">ii", offset - base, pos)
                    last_indexed = pos
                log.write(batch)
                pos += len(batch)
                offset += n
                ts += rng.randrange(1, 50)
            log.close()
            with open(os.path.join(pdir, "%020d.index" % base), "wb") as f:
                f.write(index)
            written += pos


class _KafkaPartition:
    """A broker's view of one partition: its segments (base offsets from the file names,
    as Kafka lists them at start) and the high watermark, a byte position in the log the
    producer has reached (advanced by the run)."""

    def __init__(self, pdir):
        self.dir = pdir
        self.bases = sorted(int(n[:-4]) for n in os.listdir(pdir) if n.endswith(".log"))
        self.sizes = [os.path.getsize(self._path(b, ".log")) for b in self.bases]
        self.starts = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.fds = {}

    def _path(self, base, ext):
        return os.path.join(self.dir, "%020d%s" % (base, ext))

    def _fd(self, base, ext):
        key = (base, ext)
        if key not in self.fds:
            self.fds[key] = os.open(self._path(base, ext), os.O_RDONLY)
        return self.fds[key]

    def lookup(self, seg, target):
        """OffsetIndex.lookup: a binary search of the segment's index for the last entry
        at or below `target`, the index read a 4 KiB page at a time as the probes land
        (Kafka maps it; a page per probe is what that costs a cold cache)."""
        import struct

        base = self.bases[seg]
        fd = self._fd(base, ".index")
        n = os.fstat(fd).st_size // 8
        pages = {}

        def entry(i):
            page = i * 8 // 4096
            if page not in pages:
                pages[page] = os.pread(fd, 4096, page * 4096)
            return struct.unpack_from(">ii", pages[page], i * 8 - page * 4096)

        lo, hi = 0, n - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if base + entry(mid)[0] <= target:
                lo = mid
            else:
                hi = mid - 1
        return entry(lo)[1] if n else 0

    def fetch(self, target, max_bytes, hw):
        """A fetch from offset `target`: the segment by base offset, the index lookup,
        then the batch headers read forward from the indexed position to the batch holding
        `target` (LogSegment.translateOffset), then up to `max_bytes` of whole batches
        below the high watermark `hw` (a byte position) in one read. Returns the next
        offset to fetch."""
        import bisect
        import struct

        seg = bisect.bisect_right(self.bases, target) - 1
        base = self.bases[seg]
        fd = self._fd(base, ".log")
        pos = self.lookup(seg, target)
        end = min(self.sizes[seg], hw - self.starts[seg])
        while pos < end:
            header = os.pread(fd, 61, pos)  # the batch header, as loadBatchHeader reads it
            first, length = struct.unpack_from(">qi", header)
            last = first + struct.unpack_from(">i", header, 23)[0]
            if last >= target:
                break
            pos += 12 + length
        if pos >= end:
            if end == self.sizes[seg] and seg + 1 < len(self.bases):
                return self.bases[seg + 1]  # rolled: the next fetch goes to the next segment
            return target
        data = os.pread(fd, min(max_bytes, end - pos), pos)
        nxt, off = target, 0
        while off + 61 <= len(data):
            first, length = struct.unpack_from(">qi", data, off)
            if off + 12 + length > len(data):
                break
            nxt = first + struct.unpack_from(">i", data, off + 23)[0] + 1
            off += 12 + length
        if off == 0:
            return target  # max_bytes below one batch: Kafka would still return it
        if pos + off >= self.sizes[seg] and seg + 1 < len(self.bases):
            return self.bases[seg + 1]
        return nxt

    def offset_at(self, byte_pos):
        """About the offset at log byte position `byte_pos` (a consumer group's committed
        offset, that many bytes from the start), from the offsets per byte of the log's
        closed segments; the fetch's index lookup finds the batch."""
        return int(byte_pos * self.bases[-1] / max(1, self.starts[-1]))


def run_kafkalag(d):
    """A Kafka broker's fetch path over a 3-partition topic as the producer appends (the
    high watermark moving 40 KiB per partition every 12 ms tick, from half the log to
    nearly all of it), serving 4 consumer groups at different lags: a real-time group at
    the head (a fetch every tick, the batch or two produced since), an ETL group 4 MB
    behind (160 KiB every 4 ticks), a search indexer 14 MB behind (320 KiB every 8 ticks) and, from a third of
    the run, a new group replaying from the earliest offset in 1 MiB fetches
    (max.partition.fetch.bytes) every 4 ticks until it catches up. Each fetch looks the
    offset up in the segment's index, reads batch headers to it, then the data."""
    import time

    parts = [_KafkaPartition(os.path.join(d, "events-%d" % p)) for p in range(KAFKA_PARTITIONS)]
    # (name, lag in bytes at start or None for earliest, every N ticks, max bytes, start tick)
    # The lagging groups fetch what their processing keeps up with (the producer's rate),
    # so their lag stays; the replay group takes whole 1 MiB fetches and catches up.
    groups = [("realtime", 0, 1, 1 << 20, 0), ("etl", 4 << 20, 4, 4 * KAFKA_HEAD_PER_TICK, 0),
              ("indexer", 14 << 20, 8, 8 * KAFKA_HEAD_PER_TICK, 0), ("replay", None, 4, 1 << 20, KAFKA_TICKS // 3)]
    pos = {}
    fetches = 0
    read_bytes = 0
    for tick in range(KAFKA_TICKS):
        hw = KAFKA_START_HEAD + tick * KAFKA_HEAD_PER_TICK
        for name, lag, every, max_bytes, start in groups:
            if tick < start or (tick - start) % every:
                continue
            for p, part in enumerate(parts):
                key = (name, p)
                if key not in pos:
                    pos[key] = 0 if lag is None else part.offset_at(max(0, hw - lag))
                nxt = part.fetch(pos[key], max_bytes, hw)
                fetches += 1
                pos[key] = nxt
        time.sleep(KAFKA_TICK_S)
    print("kafkalag: %d fetches; replay at %s" % (fetches, [pos.get(("replay", p)) for p in range(KAFKA_PARTITIONS)]))


# --- ecobjects ---------------------------------------------------------------------

EC_DRIVES = 6
EC_DATA = 4  # EC 4+2
EC_BLOCK = 1 << 20  # MinIO's erasure block: each block split into 4 shards of 256 KiB
EC_INLINE = 128 << 10  # objects below this live inline in xl.meta
EC_SMALL = 1_200
EC_LARGE = 50
EC_GETS = 1_500
EC_THREADS = 4
EC_GAP_S = 0.004  # GETs arrive on a schedule, 250 a second
EC_BITROT = 32  # a HighwayHash-256 before every shard block (MinIO's streaming bitrot)


def _ec_objects():
    rng = random.Random(SEED + 650)
    objs = [("small/%04d.json" % i, _clamped_lognormal(rng, 9.3, 1.0, 1 << 10, EC_INLINE - 1)) for i in range(EC_SMALL)]
    objs += [("media/%03d.bin" % i, _clamped_lognormal(rng, 13.7, 0.6, 300 << 10, 6 << 20)) for i in range(EC_LARGE)]
    return objs


def gen_ecobjects(d):
    """A MinIO-style erasure-coded bucket on 6 drives (EC 4+2): every object a directory on
    every drive with an `xl.meta` (a JSON header of the erasure layout and, for objects
    under 128 KiB, the drive's shard inline) and, for larger objects, a `part.1` holding
    the drive's 256 KiB shard of every 1 MiB block, each behind a 32-byte bitrot hash.
    1,200 small objects (1-127 KB, log-normal) and 50 large (0.3-6 MB). Shard contents are
    noise (no real Reed-Solomon parity)."""
    import json

    rng = random.Random(SEED + 651)
    noise = rng.randbytes(1 << 20)
    for name, size in _ec_objects():
        shard = -(-min(size, EC_BLOCK) // EC_DATA)
        blocks = -(-size // EC_BLOCK)
        for drv in range(EC_DRIVES):
            odir = os.path.join(d, "disk%d" % (drv + 1), "bucket", name)
            os.makedirs(odir, exist_ok=True)
            meta = json.dumps({"version": 1, "size": size, "erasure": {"data": EC_DATA, "parity": EC_DRIVES - EC_DATA,
                               "blockSize": EC_BLOCK, "index": drv + 1, "distribution": list(range(1, EC_DRIVES + 1))},
                               "parts": [{"number": 1, "size": size}], "inline": size < EC_INLINE}).encode()
            with open(os.path.join(odir, "xl.meta"), "wb") as f:
                f.write(b"XL2 " + len(meta).to_bytes(4, "little") + meta)
                if size < EC_INLINE:
                    f.write(_noise_slice(rng, noise, EC_BITROT + shard))
            if size >= EC_INLINE:
                with open(os.path.join(odir, "part.1"), "wb") as f:
                    left = size
                    for _ in range(blocks):
                        s = -(-min(left, EC_BLOCK) // EC_DATA)
                        f.write(_noise_slice(rng, noise, EC_BITROT + s))
                        left -= EC_BLOCK


def run_ecobjects(d):
    """MinIO's GET path over the EC 4+2 bucket: 4 threads serve 1,500 GETs, Zipf(1.0) over
    the objects in a shuffled order. Every GET reads `xl.meta` whole on all 6 drives (the read
    quorum, inline shards with it), and for a large object each 1 MiB block's shard (hash +
    256 KiB) from the 4 data drives in turn; for the middle third of the run drive 2 is
    offline, so its shards come from the first parity drive instead. GETs arrive every 4 ms
    (250 a second); a free thread takes the next."""
    rng = random.Random(SEED + 652)
    objs = _ec_objects()
    order = list(range(len(objs)))
    rng.shuffle(order)
    gets = [order[k] for k in zipf_ranks(len(objs), 1.0, EC_GETS, rng)]

    def get(item):
        i, o = item
        name, size = objs[o]
        offline = 1 if EC_GETS // 3 <= i < 2 * EC_GETS // 3 else None
        n = 0
        for drv in range(EC_DRIVES):
            if drv == offline:
                continue
            # xl.meta read whole on every drive (with the inline shard, if any), as
            # readAllFileInfo does for a GET: one stat, one read.
            fd = os.open(os.path.join(d, "disk%d" % (drv + 1), "bucket", name, "xl.meta"), os.O_RDONLY)
            n += len(os.pread(fd, os.fstat(fd).st_size, 0))
            os.close(fd)
        if size >= EC_INLINE:
            drives = [drv if drv != offline else EC_DATA for drv in range(EC_DATA)]
            fds = [os.open(os.path.join(d, "disk%d" % (drv + 1), "bucket", name, "part.1"), os.O_RDONLY) for drv in drives]
            off, left = 0, size
            while left > 0:
                s = -(-min(left, EC_BLOCK) // EC_DATA)
                for fd in fds:
                    n += len(os.pread(fd, EC_BITROT + s, off))
                off += EC_BITROT + s
                left -= EC_BLOCK
            for fd in fds:
                os.close(fd)
        return n

    shard_bytes = _paced(list(enumerate(gets)), EC_THREADS, EC_GAP_S, get)
    print("ecobjects: %d GETs, %d shard bytes" % (EC_GETS, shard_bytes))


if __name__ == "__main__":
    workloads_main(globals(), __doc__)
