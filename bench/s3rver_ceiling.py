#!/usr/bin/env python3
"""The local S3 server's own ceiling for bench/peer.py's cases, with `curl` (presigned URLs,
no FUSE, no cache), one request at a time and N in parallel:
  small: 2,000 x 100 KiB GETs (the small-file set);
  large: one 1 GiB object in 128 ranged GETs of 8 MiB (mountpoint-s3's part size).
A FUSE client's cold figure cannot beat the best parallel one on the same machine.

Usage: bench/s3rver_ceiling.py [--large] [PARALLELISM ...]   (default: 1 4 16 64)
"""

import concurrent.futures
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("peer", os.path.join(here, "peer.py"))
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)


def main():
    work = tempfile.mkdtemp(prefix="strata-ceiling-")
    srv = peer.S3rverServer(work, os.path.expanduser("~/.cache/strata-bench"))
    try:
        s3 = srv.client()
        cfg = os.path.join(work, "curl.cfg")
        large = "--large" in sys.argv[1:]
        if large:
            what = "128 x 8 MiB ranged GETs of a 1 GiB object"
            s3.put_object(Bucket=peer.BUCKET, Key="large.bin", Body=os.urandom(1 << 30))
            u = s3.generate_presigned_url(
                "get_object", Params={"Bucket": peer.BUCKET, "Key": "large.bin"}, ExpiresIn=3600)
            with open(cfg, "w") as f:
                for i in range(128):
                    lo = i << 23
                    f.write(f'url = "{u}"\nrange = "{lo}-{lo + (1 << 23) - 1}"\n'
                            'output = "/dev/null"\n')
        else:
            what = "2000 GETs"
            body = os.urandom(100 << 10)
            names = [f"small/f{i:05d}.bin" for i in range(2000)]
            with concurrent.futures.ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda n: s3.put_object(Bucket=peer.BUCKET, Key=n, Body=body), names))
            with open(cfg, "w") as f:
                for n in names:
                    u = s3.generate_presigned_url(
                        "get_object", Params={"Bucket": peer.BUCKET, "Key": n}, ExpiresIn=3600)
                    f.write(f'url = "{u}"\noutput = "/dev/null"\n')
        pars = [int(a) for a in sys.argv[1:] if a != "--large"]
        for par in pars or [1, 4, 16, 64]:
            args = ["curl", "-s", "-K", cfg]
            if par > 1:
                args += ["-Z", "--parallel-max", str(par)]
            t = time.perf_counter()
            subprocess.run(args, check=True)
            print(f"curl, {par} in parallel: {time.perf_counter() - t:.2f} s for {what}",
                  flush=True)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
