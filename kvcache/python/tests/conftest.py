"""Starts a real `strata serve` for the tests and stops it with SIGTERM afterwards.

`server`: the single-tenant loopback demo (KV service on 127.0.0.1:0 and a Unix socket,
memory tier only). `tenant_server`: the same with `[[kv.tenants]]` and an admin token
from a `strata.toml` (`TENANTS` below).

The binary is $STRATA_BIN, default <repo>/target/debug/strata (`cargo build -p
strata-tools` first). A missing binary fails the tests: it is never a skip.
"""

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

#: Tenants of `tenant_server`: name -> (token, namespace patterns, quota).
TENANTS = {
    "team-a": ("tok-a", ["llama3-*"], "8MiB"),
    # b may use the same namespace names as a: it gets its own key space.
    "team-b": ("tok-b", ["llama3-*", "mistral-*"], "64MiB"),
    "team-c": ("tok-c", ["qwen-*"], "64MiB"),
}
ADMIN_TOKEN = "tok-admin"


def freeze(pid, timeout_s=10.0):
    """SIGSTOP ``pid`` and wait until every one of its threads is stopped: kill() returns
    before a busy thread has stopped, and a request answered in that window made a
    frozen-daemon test see one lookup succeed (CI under load: 2 skipped where 3 were)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                # The state follows the parenthesised command name.
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                continue
        if states and all(s in ("T", "t") for s in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"daemon {pid} did not stop within {timeout_s} s")


def strata_binary():
    """$STRATA_BIN, default <repo>/target/debug/strata; a missing one fails the test."""
    binary = os.environ.get("STRATA_BIN", str(REPO / "target" / "debug" / "strata"))
    if not os.path.exists(binary):
        pytest.fail(f"{binary} not found: run `cargo build -p strata-tools` or set STRATA_BIN")
    return binary


#: What `strata serve` announces before "ready", one "NAME VALUE" line each.
ENDPOINT_NAMES = ("kv tcp", "kv unix", "kv shm", "admin")


def start_serve(cache_dir, extra_args=(), config_path=None, memory="256MiB", disk="0"):
    """Starts `strata serve` on ``cache_dir``; (process, endpoints) once it is ready."""
    cmd = [strata_binary(), "serve", "--cache-dir", cache_dir, "--listen", "127.0.0.1:0",
           "--admin", "127.0.0.1:0", "--memory", memory, "--disk", disk, *extra_args]
    if config_path is not None:
        cmd += ["--config", config_path]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    endpoints = {}
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"strata serve exited with {proc.wait()}")
            if line.split() == ["ready"]:
                break
            # "NAME VALUE", where a path VALUE may hold spaces: a known name is matched
            # whole, not cut at the last space.
            name = next((n for n in ENDPOINT_NAMES if line.startswith(n + " ")), None)
            if name is not None:
                endpoints[name] = line[len(name) + 1:].rstrip("\n")
            else:
                parts = line.split()
                endpoints[" ".join(parts[:-1])] = parts[-1]
        else:
            raise RuntimeError("strata serve not ready within 30 s")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, {"tcp": endpoints["kv tcp"], "unix": "unix://" + endpoints["kv unix"],
                  "admin": endpoints["admin"], "pid": proc.pid}


@contextlib.contextmanager
def strata_serve(extra_args, config_text=None):
    """Runs `strata serve` with a fresh cache dir; yields its endpoints."""
    with tempfile.TemporaryDirectory(prefix="strata-pytest-") as d:
        config_path = None
        if config_text is not None:
            config_path = os.path.join(d, "strata.toml")
            with open(config_path, "w") as f:
                f.write(config_text)
        proc, endpoints = start_serve(os.path.join(d, "cache"), extra_args, config_path)
        try:
            yield endpoints
        finally:
            proc.send_signal(signal.SIGCONT)  # a test may have frozen it
            proc.send_signal(signal.SIGTERM)
            try:
                assert proc.wait(timeout=15) == 0, "strata serve exits cleanly on SIGTERM"
            finally:
                if proc.poll() is None:
                    proc.kill()


@pytest.fixture(scope="session")
def server():
    with strata_serve([]) as endpoints:
        yield endpoints


#: An emulated GPU tier above memory: blocks land in (emulated) device memory, so Gets
#: asked with ``device=True`` are answered by device handle (gds/src/ipc.rs).
GPU_TOML = '[cache]\ngpu = "64MiB"\ngpu_device = "emulated"\n'


@pytest.fixture(scope="session")
def gpu_server():
    with strata_serve([], config_text=GPU_TOML) as endpoints:
        yield endpoints


def _tenants_toml():
    out = [f'[admin]\ntoken = "{ADMIN_TOKEN}"\n']
    for name, (token, patterns, quota) in TENANTS.items():
        pats = ", ".join(f'"{p}"' for p in patterns)
        out.append(f'[[kv.tenants]]\nname = "{name}"\ntoken = "{token}"\nnamespaces = [{pats}]\nquota = "{quota}"\n')
    return "\n".join(out)


@pytest.fixture(scope="session")
def tenant_server():
    with strata_serve([], _tenants_toml()) as endpoints:
        yield endpoints
