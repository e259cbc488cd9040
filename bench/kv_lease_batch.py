"""A batch of KV values read in place over the shared-memory arena: one call per value
(what the vLLM connector did) against one BatchLease for the batch (`get_views`).

    python3 bench/kv_lease_batch.py target/release/strata   # needs grpcio and protobuf
"""
import os, shutil, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kvcache", "python"))
from strata_kv import KvClient
d = tempfile.mkdtemp(prefix="kv-lease-batch")
p = subprocess.Popen([sys.argv[1] if len(sys.argv) > 1 else "target/release/strata", "serve", "--listen", "127.0.0.1:0", "--unix-socket", f"{d}/kv.sock",
                      "--admin", "127.0.0.1:0", "--cache-dir", f"{d}/cache", "--memory", "512MiB", "--disk", "0"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(100):
        if os.path.exists(f"{d}/kv-shm.sock"): break
        time.sleep(0.1)
    time.sleep(0.3)
    c = KvClient(f"unix://{d}/kv.sock", namespace="v/p", shm=True)
    keys = [b"k%03d" % i for i in range(64)]
    for k in keys: c.put(k, os.urandom(64 << 10))
    def per_key():
        for k in keys:
            with c.get_view(k) as v: bytes(v.data[:1])
    def batch():
        vs = c.get_views(keys)
        for v in vs:
            with v: bytes(v.data[:1])
    best = {"one call per value": 1e9, "get_views (BatchLease)": 1e9}
    for rep in range(5):
        for name, f in [("one call per value", per_key), ("get_views (BatchLease)", batch)]:
            t = time.perf_counter()
            for _ in range(10): f()
            best[name] = min(best[name], (time.perf_counter() - t) / 10)
    print(", ".join(f"{k} {v*1000:.2f} ms" for k, v in best.items()), "per 64 x 64 KiB")
finally:
    p.terminate(); p.wait()
    shutil.rmtree(d, ignore_errors=True)
