#!/usr/bin/env python3
"""Strata against a peer (mountpoint-s3) on the data-path cases of issue 14.

Starts a local S3 server, uploads a large file and a set of small files, and runs each case through a real FUSE mount of
Strata (and of mountpoint-s3 when --peer names a `mount-s3` binary; and of a second
Strata build when --before names one, for before/after figures in the same run),
dropping the page cache before every run (root only), medians of --runs. Prints JSON:

  {"results": [{"case", "strata_s", "peer_s", "ratio", ...}], "cache_bytes_ratio": ...}

The S3 server (--server): s3rver (npm, file-backed, serves a ranged GET by reading
just that range; installed on first use into --tools-dir with npm) is the default when
node and npm are on PATH; moto_server (PyPI, installed by scripts/install-deps.sh)
otherwise. moto reads and copies the WHOLE object for every ranged GET, so its timings
of the large file measure moto, not the clients (a cold 1 GiB read takes minutes).

ratio = peer_s / strata_s (Strata's speed relative to the peer; null without a peer).
With --before, each result also has "before_s" and "speedup_vs_before"
(= before_s / strata_s). cache_bytes_ratio = bytes Strata keeps under its cache
directory / bytes read, after the small-file set was read once cold (and
"cache_bytes_ratio_large" for the large file).

Usage (as root):
  bench/peer.py --strata target/release/strata [--before /path/strata-old]
                [--peer /path/mount-s3] [--large-mib 1024] [--small-count 2000]
                [--small-kib 100] [--runs 3] [--server auto|s3rver|moto]
"""

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BUCKET = "bench"
# s3rver checks signatures against its one built-in key pair; moto accepts any.
CREDS = {
    "AWS_ACCESS_KEY_ID": "S3RVER",
    "AWS_SECRET_ACCESS_KEY": "S3RVER",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        log(f"cannot drop the page cache ({e}); run as root for cold figures")


def wait_listening(endpoint, proc, what, limit_s=30):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(endpoint, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answers (s3rver says 403 to an unsigned request)
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{what} did not start within {limit_s} s")


def s3_client(endpoint):
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDS["AWS_REGION"],
        # The uploads run from 8 threads.
        config=Config(max_pool_connections=16, s3={"addressing_style": "path"}),
    )


S3RVER_VERSION = "3.7.1"

# Runs s3rver as a library so that every request is logged with its method, Range and
# response length (its own log drops the method), one line each:
#   METHOD PATH RANGE STATUS BYTES START_MS END_MS (END: the response's last byte sent)
S3RVER_LAUNCHER = r"""
const fs = require('fs');
const S3rver = require(process.argv[2]);
const [dir, port, logPath, bucket] = process.argv.slice(3);
const out = fs.createWriteStream(logPath, { flags: 'a' });
const server = new S3rver({
  address: '127.0.0.1', port: Number(port), directory: dir, silent: true,
  configureBuckets: [{ name: bucket, configs: [] }],
});
server.middleware.unshift(async (ctx, next) => {
  const t0 = Date.now();
  await next();
  // Start and end in ms since the epoch (the end: the response closed, its body sent
  // or the request aborted), for a timeline of sizes and concurrency (get_timeline.py).
  ctx.res.once('close', () => out.write(
    `${ctx.method} ${ctx.path} ${ctx.get('range') || '-'} ${ctx.status} ` +
    `${ctx.response.length || 0} ${t0} ${Date.now()}
`));
});
server.run().then(a => console.log(`s3rver ${a.address}:${a.port}`),
                  e => { console.error(e); process.exit(1); });
"""


def have_node():
    return shutil.which("node") is not None and shutil.which("npm") is not None


def install_s3rver(tools_dir):
    """s3rver's module directory, installed with npm into tools_dir on first use."""
    prefix = os.path.join(tools_dir, f"s3rver-{S3RVER_VERSION}")
    module = os.path.join(prefix, "node_modules", "s3rver")
    if not os.path.exists(os.path.join(module, "package.json")):
        log(f"installing s3rver@{S3RVER_VERSION} into {prefix} (npm) ...")
        os.makedirs(prefix, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", prefix,
             f"s3rver@{S3RVER_VERSION}"],
            check=True, stdout=subprocess.DEVNULL,
        )
    return module


class S3rverServer:
    """s3rver (npm), file-backed: a ranged GET reads only its range."""

    name = f"s3rver {S3RVER_VERSION}"

    def __init__(self, work, tools_dir):
        module = install_s3rver(tools_dir)
        self.port = free_port()
        self.log_path = os.path.join(work, "s3rver.log")
        launcher = os.path.join(work, "s3rver-launcher.js")
        with open(launcher, "w") as f:
            f.write(S3RVER_LAUNCHER)
        data = os.path.join(work, "s3rver-data")
        os.makedirs(data, exist_ok=True)
        # Node 20's OpenSSL 3 lacks a digest s3rver uses for listings without it.
        env = dict(os.environ, NODE_OPTIONS="--openssl-legacy-provider")
        self.proc = subprocess.Popen(
            ["node", launcher, module, data, str(self.port), self.log_path, BUCKET],
            env=env, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, "s3rver.err"), "w"),
        )
        self.endpoint = f"http://127.0.0.1:{self.port}"
        wait_listening(self.endpoint, self.proc, "s3rver")

    def create_bucket(self, s3):
        pass  # configured at startup

    def client(self):
        return s3_client(self.endpoint)

    def requests(self):
        """Requests served so far by method (LIST for listings), and the bytes of the
        object GETs' responses ("GET_bytes")."""
        counts = {}
        with open(self.log_path, errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 5:
                    continue
                method = parts[0]
                # A GET of the bucket (or of the service) is a listing, not a read.
                if method == "GET" and parts[1].strip("/") in ("", BUCKET):
                    method = "LIST"
                counts[method] = counts.get(method, 0) + 1
                if method == "GET" and parts[4].isdigit():
                    counts["GET_bytes"] = counts.get("GET_bytes", 0) + int(parts[4])
        return counts

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


class Moto:
    name = "moto"

    def __init__(self, work):
        self.port = free_port()
        # Its access log (one line per request) tells what each system asked for.
        self.log_path = os.path.join(work, "moto.log")
        self.proc = subprocess.Popen(
            ["moto_server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log_path, "w"),
        )
        self.endpoint = f"http://127.0.0.1:{self.port}"
        wait_listening(self.endpoint, self.proc, "moto_server")

    def create_bucket(self, s3):
        s3.create_bucket(Bucket=BUCKET)

    def client(self):
        return s3_client(self.endpoint)

    def requests(self):
        """Requests served so far, by method (from the access log)."""
        counts = {}
        with open(self.log_path, errors="replace") as f:
            for line in f:
                for m in ("GET", "HEAD", "PUT", "POST"):
                    if f'"{m} ' in line:
                        counts[m] = counts.get(m, 0) + 1
        return counts

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


class Mount:
    """One FUSE mount of `kind` ("strata" or "peer") at a fresh mountpoint."""

    def __init__(self, kind, binary, endpoint, work, memory=None, ttl="indefinite",
                 extra=(), stats_to=None):
        self.stats_to = stats_to
        self.admin = None
        self.mnt = tempfile.mkdtemp(dir=work, prefix="mnt-")
        self.cache = tempfile.mkdtemp(dir=work, prefix="cache-")
        env = dict(os.environ, **CREDS)
        if kind == "strata":
            cmd = [
                binary, "mount", f"s3://{BUCKET}", self.mnt,
                "--endpoint", endpoint, "--allow-http", "--region", "us-east-1",
                "--cache-dir", self.cache, "--metadata-ttl", ttl, "--foreground",
            ]
            if memory:
                cmd += ["--memory-cache", memory]
            if stats_to:
                self.admin = f"127.0.0.1:{free_port()}"
                cmd += ["--admin", self.admin]
            cmd += list(extra)
        else:
            cmd = [
                binary, BUCKET, self.mnt, "--endpoint-url", endpoint,
                "--force-path-style", "--region", "us-east-1",
                # As BACKGROUND.md measured it: its disk cache on (4 GiB cap).
                "--cache", self.cache, "--max-cache-size", "4096",
                "--metadata-ttl", "indefinite", "--foreground",
            ]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(
                os.path.join(work, f"{kind}.log"), "a")
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            if subprocess.run(["mountpoint", "-q", self.mnt]).returncode == 0:
                return
            if self.proc.poll() is not None:
                raise SystemExit(f"{kind} mount exited: see {work}/{kind}.log")
            time.sleep(0.1)
        raise SystemExit(f"{kind} did not mount within 30 s")

    def cache_breakdown(self):
        """Bytes on disk per directory two levels under the cache dir."""
        out = {}
        for root, _, files in os.walk(self.cache):
            rel = os.path.relpath(root, self.cache).split(os.sep)[:2]
            key = "/".join(rel)
            for f in files:
                try:
                    b = os.lstat(os.path.join(root, f)).st_blocks * 512
                except OSError:
                    continue
                out[key] = out.get(key, 0) + b
        return out

    def cache_bytes(self):
        total = 0
        for root, _, files in os.walk(self.cache):
            for f in files:
                try:
                    total += os.lstat(os.path.join(root, f)).st_blocks * 512
                except OSError:
                    pass
        return total

    def settled_cache_bytes(self, limit_s=60):
        """Cache bytes once they stop changing (background writes and copies done)."""
        last, same = -1, 0
        deadline = time.time() + limit_s
        while time.time() < deadline:
            now = self.cache_bytes()
            same = same + 1 if now == last else 0
            if same >= 2:
                break
            last = now
            time.sleep(1)
        return last

    def cpu_s(self):
        """CPU seconds (user + system) the daemon has used so far."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def save_stats(self):
        """Appends the daemon's /stats (JSON, one line) to `stats_to`."""
        if not (self.stats_to and self.admin):
            return
        try:
            with urllib.request.urlopen(f"http://{self.admin}/stats", timeout=5) as r:
                body = json.loads(r.read())
        except (OSError, ValueError) as e:
            log(f"no stats from {self.admin}: {e}")
            return
        with open(self.stats_to, "a") as f:
            f.write(json.dumps(body) + "\n")

    def close(self):
        self.save_stats()
        subprocess.run(["fusermount3", "-u", self.mnt], stderr=subprocess.DEVNULL)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.mnt, ignore_errors=True)
        if KEPT_CACHES is None:
            shutil.rmtree(self.cache, ignore_errors=True)
        else:
            KEPT_CACHES.append(self.cache)


# With --keep-caches: the cache dirs of closed mounts, removed when the case ends.
KEPT_CACHES = None


def remove_kept_caches():
    while KEPT_CACHES:
        shutil.rmtree(KEPT_CACHES.pop(), ignore_errors=True)


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def dd(path):
    subprocess.run(
        ["dd", f"if={path}", "of=/dev/null", "bs=1M"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def cat_all(paths):
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 20):
                pass


def readers(paths, n):
    parts = [paths[i::n] for i in range(n)]
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        list(ex.map(cat_all, parts))


def shuffled(paths, seed, threads=4):
    order = list(paths)
    random.Random(seed).shuffle(order)
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda p: cat_all([p]), order))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strata", required=True)
    ap.add_argument("--strata-ttl", default="indefinite",
                    help="--metadata-ttl of the Strata mounts (a number for builds before issue 14)")
    ap.add_argument("--before", help="another Strata build, run side by side")
    ap.add_argument("--strata-args", default="",
                    help="extra `strata mount` arguments for --strata's mounts (space-separated)")
    ap.add_argument("--stats", help="append each --strata mount's /stats (admin API) to this file")
    ap.add_argument("--peer", help="a mount-s3 binary")
    ap.add_argument("--large-mib", type=int, default=1024)
    ap.add_argument("--small-count", type=int, default=2000)
    ap.add_argument("--small-kib", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default="all", help="comma list of case prefixes")
    ap.add_argument("--work", default=None)
    ap.add_argument("--server", choices=("auto", "s3rver", "moto"), default="auto",
                    help="the local S3 server; auto = s3rver when node and npm exist, else moto")
    ap.add_argument("--tools-dir",
                    default=os.path.join(os.path.expanduser("~"), ".cache", "strata-bench"),
                    help="where s3rver is installed (npm) on first use")
    ap.add_argument("--no-bytes", action="store_true",
                    help="skip the bytes-on-disk measurement (cache_bytes_ratio)")
    ap.add_argument("--keep-caches", action="store_true",
                    help="remove each mount's cache dir when the case ends, not right after "
                         "its run: on an ext4 without a journal every inode allocation "
                         "skips inodes freed in the last ~30 s (recently_deleted), so the "
                         "block files a cold run creates just after the previous run's "
                         "cache was removed cost ~18%% of the daemon's CPU (docs/BENCHMARKS.md, "
                         "\"Cold fill: one copy per byte\")")
    args = ap.parse_args()
    if args.keep_caches:
        global KEPT_CACHES
        KEPT_CACHES = []

    work = args.work or tempfile.mkdtemp(prefix="strata-peer-")
    os.makedirs(work, exist_ok=True)
    server_kind = args.server
    if server_kind == "auto":
        server_kind = "s3rver" if have_node() else "moto"
    if server_kind == "moto":
        log("S3 server: moto (reads the whole object per ranged GET: large-file "
            "timings measure moto; use --server s3rver for timing)")
        moto = Moto(work)
    else:
        moto = S3rverServer(work, args.tools_dir)
    try:
        s3 = moto.client()
        moto.create_bucket(s3)
        large = os.urandom(1 << 20) * args.large_mib
        s3.put_object(Bucket=BUCKET, Key="large.bin", Body=large)
        large_bytes = len(large)
        del large
        small_body = os.urandom(args.small_kib << 10)
        names = [f"small/f{i:05d}.bin" for i in range(args.small_count)]
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda n: s3.put_object(Bucket=BUCKET, Key=n, Body=small_body),
                        names))
        small_bytes = len(small_body) * len(names)
        log(f"uploaded {large_bytes >> 20} MiB + {len(names)} x {args.small_kib} KiB to {moto.endpoint}")

        systems = {"strata": ("strata", args.strata, args.strata_ttl, args.strata_args.split())}
        if args.before:
            # An older build may not know "indefinite": a day is the same in one run.
            systems["before"] = ("strata", args.before, "86400", [])
        if args.peer:
            systems["peer"] = ("peer", args.peer, None, [])

        def mount(name, memory=None, writes=False, deletes=False):
            kind, binary, ttl, extra = systems[name]
            stats = args.stats if name == "strata" else None
            if writes and kind == "strata":
                extra = list(extra) + ["--allow-writes"]
            if deletes:  # both take the same flag
                extra = list(extra) + ["--allow-delete"]
            return Mount(kind, binary, moto.endpoint, work, memory=memory, ttl=ttl,
                         extra=extra, stats_to=stats)

        cold_cpu = {}
        cold_reqs = {}

        def cold_round(names_, run):
            """Fresh mounts, each read once cold; the systems take turns run by run (an
            order effect, e.g. the store warming up, then falls on both alike)."""
            times = {n: [] for n in names_}
            cpu = {n: [] for n in names_}
            reqs = {}
            for _ in range(args.runs):
                for name in names_:
                    m = mount(name)
                    try:
                        drop_caches()
                        before = moto.requests()
                        cpu0 = m.cpu_s()
                        times[name].append(timed(lambda: run(m.mnt)))
                        cpu1 = m.cpu_s()
                        if cpu0 is not None and cpu1 is not None:
                            cpu[name].append(cpu1 - cpu0)
                        time.sleep(0.5)  # prefetches still in flight land
                        after = moto.requests()
                        reqs[name] = {k: v - before.get(k, 0) for k, v in after.items()
                                      if k in ("GET", "HEAD", "LIST", "GET_bytes")}
                    finally:
                        m.close()
            for name in names_:
                log(f"  {name}: {[round(t, 3) for t in times[name]]} s, daemon CPU "
                    f"{[round(c, 2) for c in cpu[name]]} s; "
                    f"store requests of the last run: {reqs.get(name)}")
            for n, c in cpu.items():
                if c:
                    cold_cpu[n] = statistics.median(c)
            cold_reqs.update(reqs)
            return {n: statistics.median(t) for n, t in times.items()}

        def warm(name, run, memory=None, warmup=None):
            """Median of reads after one warming read, page cache dropped each time."""
            m = mount(name, memory)
            try:
                (warmup or run)(m.mnt)
                time.sleep(1)  # write-through to the disk tier settles
                times = []
                for _ in range(args.runs):
                    drop_caches()
                    times.append(timed(lambda: run(m.mnt)))
                return statistics.median(times)
            finally:
                m.close()

        def small_paths(mnt):
            return [os.path.join(mnt, n) for n in names]

        def listed(read):
            """`read` after one readdir of the folder, as `ls | xargs cat` or a data
            loader that lists its dataset first. mountpoint-s3 looks up a name it was
            not shown in a listing with its own LIST + HEAD, and forgets the names with
            the kernel's inodes (the page-cache drop before every run), so without the
            readdir it pays ~30 ms of store round trips per file that a real workload
            does not: its figures then measure that, not the data path (docs/BENCHMARKS.md,
            "mountpoint-s3 1.24.0 side by side, merged tree")."""
            def run(p):
                os.listdir(f"{p}/small")
                read(p)
            return run

        def serial(p):
            cat_all(small_paths(p))

        def eight(p):
            readers(small_paths(p), 8)

        # (case, "cold" | "warm", the read, --memory-cache for warm cases, in "all").
        # The small-file rows read after a readdir (see `listed`); the rows without it
        # run only when named in --cases ("small serial cold (no readdir)").
        cases = [
            ("large dd cold", "cold", lambda p: dd(f"{p}/large.bin"), None, True),
            ("large dd warm (memory)", "warm", lambda p: dd(f"{p}/large.bin"), None, True),
            ("large dd warm (disk, memory 64MiB)", "warm",
             lambda p: dd(f"{p}/large.bin"), "64MiB", True),
            ("small serial cold after readdir", "cold", listed(serial), None, True),
            ("small 8 readers cold after readdir", "cold", listed(eight), None, True),
            ("small serial warm after readdir", "warm", listed(serial), None, True),
            ("small 8 readers warm after readdir", "warm", listed(eight), None, True),
            ("small serial cold (no readdir)", "cold", serial, None, False),
            ("small 8 readers cold (no readdir)", "cold", eight, None, False),
        ]

        def loader_epochs(name):
            e1, e2 = [], []
            for r in range(args.runs):
                m = mount(name)
                # Each epoch lists the dataset first, as a loader building its file
                # list does (see `listed`: the peer forgets names with the page cache).
                try:
                    drop_caches()
                    e1.append(timed(lambda: listed(
                        lambda p: shuffled(small_paths(p), 2 * r))(m.mnt)))
                    drop_caches()
                    e2.append(timed(lambda: listed(
                        lambda p: shuffled(small_paths(p), 2 * r + 1))(m.mnt)))
                finally:
                    m.close()
            return statistics.median(e1), statistics.median(e2)

        wanted = None if args.cases == "all" else args.cases.split(",")
        results = []
        for case, kind, run, memory, default in cases:
            if wanted is None and not default:
                continue
            if wanted and not any(case.startswith(w) for w in wanted):
                continue
            row = {"case": case}
            if kind == "cold":
                log(f"{case}: {', '.join(systems)} in turn ...")
                cold_cpu.clear()
                cold_reqs.clear()
                for name, t in cold_round(list(systems), run).items():
                    row[f"{name}_s"] = round(t, 3)
                for name, c in cold_cpu.items():
                    row[f"{name}_cpu_s"] = round(c, 2)
                # The store requests of each system's last cold run (LIST, GET_bytes:
                # s3rver only).
                for name, r in cold_reqs.items():
                    row[f"{name}_requests"] = r
            else:
                for name in systems:
                    if name == "before":
                        continue
                    log(f"{case}: {name} ...")
                    row[f"{name}_s"] = round(warm(name, run, memory=memory), 3)
            results.append(row)
            remove_kept_caches()
        if not wanted or any("loader".startswith(w) or w.startswith("loader") for w in wanted):
            rows = [{"case": "shuffled loader (4 threads) epoch 1"},
                    {"case": "shuffled loader (4 threads) epoch 2"}]
            for name in systems:
                log(f"shuffled loader: {name} ...")
                a, b = loader_epochs(name)
                rows[0][f"{name}_s"] = round(a, 3)
                rows[1][f"{name}_s"] = round(b, 3)
            results += rows

        if not wanted or any(w.startswith("write") for w in wanted):
            # Writes through the mount, close included (the object exists when it
            # returns): a checkpoint of --large-mib MiB written in 1 MiB writes, and
            # --small-count / 4 files of --small-kib KiB. Strata mounts with
            # --allow-writes; mountpoint-s3 writes new files by default. Each run writes
            # new keys. The ceiling (`direct_s`): boto3 uploading the same bytes from
            # memory (8 MiB parts, 8 at once), no file system in the way.
            chunk = os.urandom(1 << 20)
            small_w = os.urandom(args.small_kib << 10)
            n_small_w = max(1, args.small_count // 4)

            def write_large(p, key):
                with open(os.path.join(p, key), "wb") as f:
                    for _ in range(args.large_mib):
                        f.write(chunk)

            def write_small(p, key):
                for i in range(n_small_w):
                    with open(os.path.join(p, f"{key}-{i:05d}"), "wb") as f:
                        f.write(small_w)

            wcases = [(f"write {args.large_mib} MiB file, close included", write_large),
                      (f"write {n_small_w} x {args.small_kib} KiB files, serial", write_small)]
            for case, fn in wcases:
                row = {"case": case}
                for name in systems:
                    if name == "before":
                        continue
                    log(f"{case}: {name} ...")
                    times = []
                    for r in range(args.runs):
                        m = mount(name, writes=True)
                        try:
                            drop_caches()
                            times.append(timed(lambda: fn(m.mnt, f"w-{name}-{r}")))
                        finally:
                            m.close()
                    log(f"  {name}: {[round(t, 3) for t in times]} s")
                    row[f"{name}_s"] = round(statistics.median(times), 3)
                results.append(row)
                remove_kept_caches()
            try:
                import io
                from boto3.s3.transfer import TransferConfig
                cfg = TransferConfig(multipart_chunksize=8 << 20, max_concurrency=8,
                                     multipart_threshold=8 << 20)
                big = chunk * args.large_mib
                t = [timed(lambda: s3.upload_fileobj(io.BytesIO(big), BUCKET,
                                                     f"direct-{r}", Config=cfg))
                     for r in range(args.runs)]
                results[-2]["direct_s"] = round(statistics.median(t), 3)
                del big
                t = [timed(lambda: [s3.put_object(Bucket=BUCKET, Key=f"direct-{r}-{i}",
                                                  Body=small_w) for i in range(n_small_w)])
                     for r in range(args.runs)]
                results[-1]["direct_s"] = round(statistics.median(t), 3)
            except ImportError:
                log("boto3.s3.transfer missing: no direct upload ceiling")
            except Exception as e:  # the server failing the ceiling's run: no figure
                log(f"direct upload ceiling failed: {e}")

            # A checkpoint directory saved under a temporary name and renamed into place
            # (Orbax, TensorFlow): the same small files written into `tmp-...` (not
            # timed), then the rename timed. Strata mounts with --allow-delete; the
            # ceiling is boto3 copying and deleting the same keys, 16 at a time.
            case = f"rename a directory of {n_small_w} x {args.small_kib} KiB files"
            row = {"case": case}
            for name in systems:
                if name == "before":
                    continue
                log(f"{case}: {name} ...")
                times = []
                for r in range(args.runs):
                    m = mount(name, writes=True, deletes=True)
                    try:
                        tmp = os.path.join(m.mnt, f"tmp-{name}-{r}")
                        os.mkdir(tmp)
                        write_small(tmp, "f")
                        try:
                            times.append(timed(lambda: os.rename(tmp, os.path.join(
                                m.mnt, f"renamed-{name}-{r}"))))
                        except OSError as e:
                            row[f"{name}_error"] = f"{e.strerror} (errno {e.errno})"
                            log(f"  {name}: refused: {e}")
                            break
                    finally:
                        m.close()
                if times:
                    log(f"  {name}: {[round(t, 3) for t in times]} s")
                    row[f"{name}_s"] = round(statistics.median(times), 3)
            results.append(row)
            try:
                from concurrent.futures import ThreadPoolExecutor
                t = []
                for r in range(args.runs):
                    keys = [f"dtmp-{r}/f-{i:05d}" for i in range(n_small_w)]
                    for k in keys:
                        s3.put_object(Bucket=BUCKET, Key=k, Body=small_w)

                    def move(k, r=r):
                        s3.copy_object(Bucket=BUCKET, Key=f"drenamed-{r}/{k.split('/')[1]}",
                                       CopySource={"Bucket": BUCKET, "Key": k})
                    def drop(k):
                        s3.delete_object(Bucket=BUCKET, Key=k)
                    with ThreadPoolExecutor(16) as ex:
                        t.append(timed(lambda: (list(ex.map(move, keys)),
                                                list(ex.map(drop, keys)))))
                results[-1]["direct_s"] = round(statistics.median(t), 3)
            except Exception as e:  # the server failing the ceiling's run: no figure
                log(f"direct rename ceiling failed: {e}")

        # Bytes on disk for bytes read: each set read once cold, then the cache settles.
        ratios = {}
        for label, run, nbytes in [] if args.no_bytes else [
            ("cache_bytes_ratio", lambda p: cat_all(small_paths(p)), small_bytes),
            ("cache_bytes_ratio_large", lambda p: dd(f"{p}/large.bin"), large_bytes),
        ]:
            m = mount("strata")
            try:
                drop_caches()
                run(m.mnt)
                ratios[label] = round(m.settled_cache_bytes() / nbytes, 3)
                ratios[label + "_by_dir"] = m.cache_breakdown()
                if args.before:
                    b = mount("before")
                    try:
                        drop_caches()
                        run(b.mnt)
                        ratios[label + "_before"] = round(
                            b.settled_cache_bytes() / nbytes, 3)
                        ratios[label + "_before_by_dir"] = b.cache_breakdown()
                    finally:
                        b.close()
            finally:
                m.close()

        for row in results:
            s = row.get("strata_s")
            p = row.get("peer_s")
            row.setdefault("peer_s", None)
            row["ratio"] = round(p / s, 3) if (p and s) else None
            if row.get("before_s") and s:
                row["speedup_vs_before"] = round(row["before_s"] / s, 3)
        out = {
            "server": moto.name,
            "results": results,
            **ratios,
            "sizes": {
                "large_mib": args.large_mib,
                "small_count": args.small_count,
                "small_kib": args.small_kib,
                "runs": args.runs,
            },
        }
        print(json.dumps(out, indent=1))
    finally:
        remove_kept_caches()
        moto.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
