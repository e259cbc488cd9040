"""Starts a real `strata serve` (KV service on 127.0.0.1:0 and a Unix socket, memory
tier only) for the tests, and stops it with SIGTERM afterwards.

The binary is $STRATA_BIN, default <repo>/target/debug/strata (`cargo build -p
strata-tools` first). A missing binary fails the tests: it is never a skip.
"""

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def server():
    binary = os.environ.get("STRATA_BIN", str(REPO / "target" / "debug" / "strata"))
    if not os.path.exists(binary):
        pytest.fail(f"{binary} not found: run `cargo build -p strata-tools` or set STRATA_BIN")
    with tempfile.TemporaryDirectory(prefix="strata-pytest-") as d:
        cmd = [binary, "serve", "--cache-dir", d, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
               "--memory", "256MiB", "--disk", "0"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        endpoints = {}
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"strata serve exited with {proc.wait()}")
                parts = line.split()
                if parts == ["ready"]:
                    break
                endpoints[" ".join(parts[:-1])] = parts[-1]
            else:
                raise RuntimeError("strata serve not ready within 30 s")
            yield {"tcp": endpoints["kv tcp"], "unix": "unix://" + endpoints["kv unix"], "admin": endpoints["admin"]}
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                assert proc.wait(timeout=15) == 0, "strata serve exits cleanly on SIGTERM"
            finally:
                if proc.poll() is None:
                    proc.kill()
