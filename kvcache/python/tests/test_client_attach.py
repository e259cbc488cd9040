"""Attaching to the daemon's shared-memory arena (black-box findings): the side socket is
found wherever the daemon put it, a failed attach says which socket and why, and
attaching again after a restart keeps within the calling Get's deadline."""

import os
import signal
import socket
import tempfile
import threading
import time
import warnings

import grpc
import pytest

from strata_kv import KvClient, KvError
from strata_kv.client import _ShmArena
from conftest import freeze, start_serve


def timed(fn):
    """Runs ``fn`` in a daemon thread: a dict that gets "r" (its result or error) and
    "s" (seconds taken) once it is done."""
    out = {}

    def run():
        t0 = time.monotonic()
        try:
            out["r"] = fn()
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["r"] = e
        out["s"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    out["thread"] = t
    return out


def test_attaching_again_after_a_restart_keeps_within_the_calls_deadline():
    """Black-box finding: after a restart, a get_views(timeout=2) against the new daemon,
    frozen before its hello, waited the client's whole timeout (15 s; 60 s by default)
    to attach again, and every other thread's Gets waited behind it. Both now end by
    their own deadline, and the client attaches again once the daemon answers."""
    with tempfile.TemporaryDirectory(prefix="strata-pytest-") as d:
        cache = os.path.join(d, "cache")
        proc, ep = start_serve(cache, memory="16MiB")
        try:
            with KvClient(ep["unix"], namespace="attach/restart", shm=True, timeout=10) as c:
                c.put(b"k", b"\x11" * 4096)
                c.get_view(b"k").release()
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=15)
                proc, ep = start_serve(cache, memory="16MiB")
                freeze(ep["pid"])
                first = timed(lambda: c.get_views([b"k"], timeout=2))
                time.sleep(0.3)  # the first call is attaching (holding the attach lock)
                second = timed(lambda: c.get_views([b"k"], timeout=1))
                first["thread"].join(5)
                second["thread"].join(5)
                assert "s" in first and first["s"] < 3.5, f"timeout=2 call: {first}"
                assert "s" in second and second["s"] < 2.5, f"timeout=1 call behind it: {second}"
                for out in (first, second):
                    assert isinstance(out["r"], KvError), out
                    assert out["r"].code == grpc.StatusCode.DEADLINE_EXCEEDED, out
                os.kill(ep["pid"], signal.SIGCONT)
                # (The new daemon has no disk tier: "k" is gone.)
                c.put(b"k2", b"\x22" * 4096)
                # The failed attach is tried again 5 s later; then in place once more.
                deadline = time.monotonic() + 10
                while True:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        with c.get_view(b"k2", timeout=5) as view:
                            assert bytes(view.data) == b"\x22" * 4096
                            shared = view.shared
                    if shared:
                        break
                    assert time.monotonic() < deadline, "attached again once the daemon answered"
                    time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()


def test_a_failed_attach_names_the_side_socket_and_why(tenant_server, monkeypatch):
    """Black-box finding: KvClient(shm=True) with no daemon, or a tenant daemon (no arena),
    or a socket it may not open raised a bare "[Errno 2] No such file or directory" /
    "[Errno 13] Permission denied". The error (the same OSError type: the connectors
    fall back to bytes on OSError) now names the side socket and the likely cause."""
    with tempfile.TemporaryDirectory(prefix="strata-pytest-") as d:
        side = os.path.join(d, "kv-shm.sock")
        # No daemon at all.
        with pytest.raises(FileNotFoundError) as e:
            KvClient(f"unix://{d}/kv.sock", "ns", shm=True, timeout=2)
        assert side in str(e.value) and "no daemon" in str(e.value) and "[kv] shm" in str(e.value)
        assert e.value.errno == 2
        # A daemon with tenants: no arena, so no side socket.
        tenant_dir = os.path.dirname(tenant_server["unix"][len("unix://"):])
        with pytest.raises(FileNotFoundError) as e:
            KvClient(tenant_server["unix"], "ns", shm=True, timeout=2)
        assert os.path.join(tenant_dir, "kv-shm.sock") in str(e.value) and "tenants" in str(e.value)
        # A stale socket (its daemon gone): a warning naming it, blocks as bytes.
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(side)
        stale.close()
        with pytest.raises(ConnectionRefusedError) as e:
            _ShmArena(side, 2)
        assert side in str(e.value) and "stale" in str(e.value)
        os.unlink(side)
        # Accepted but never a hello (a stopped daemon).
        mute = socket.socket(socket.AF_UNIX)
        mute.bind(side)
        mute.listen()
        try:
            t0 = time.monotonic()
            with pytest.raises(TimeoutError) as e:
                _ShmArena(side, 0.3)
            assert time.monotonic() - t0 < 2
            assert side in str(e.value) and "no hello" in str(e.value)
        finally:
            mute.close()
        # Not this user's socket (root opens any: the refusal is simulated).
        def refused(self, path):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(socket.socket, "connect", refused)
        with pytest.raises(PermissionError) as e:
            KvClient(f"unix://{d}/kv.sock", "ns", shm=True, timeout=2)
        assert side in str(e.value) and "permission denied" in str(e.value) and "shm=False" in str(e.value)
        assert e.value.errno == 13


@pytest.mark.parametrize("name", ["pct%41x", "hash#x", "query?x", "sp ace"])
def test_a_unix_socket_path_is_reached_whatever_its_characters(name, monkeypatch):
    """Black-box finding: KvClient("unix://" + path), the README's form, connected to
    another path when the path held '%' (gRPC percent-decodes the address: .../pct%41x
    became .../pctAx), '#' or '?' (cut as a URI fragment or query), while shm=True found
    kv-shm.sock at the path as given: the two sockets of one client pointed at
    different places. Both now reach the path as given, absolute or relative."""
    with tempfile.TemporaryDirectory(prefix="strata-pytest-") as d:
        cache = os.path.join(d, name, "cache")
        proc, ep = start_serve(cache, memory="16MiB")
        try:
            assert ep["unix"] == "unix://" + os.path.join(cache, "kv.sock")
            with KvClient(ep["unix"], namespace="attach/path", shm=True, timeout=5) as c:
                c.put(b"k", b"\x33" * 4096)
                with c.get_view(b"k") as view:
                    assert view.shared and bytes(view.data) == b"\x33" * 4096
            # unix:RELATIVE is relative to the working directory (gRPC's form).
            monkeypatch.chdir(d)
            with KvClient("unix:" + os.path.join(name, "cache", "kv.sock"), namespace="attach/path",
                          shm=True, timeout=5) as c:
                with c.get_view(b"k") as view:
                    assert view.shared and bytes(view.data) == b"\x33" * 4096
        finally:
            proc.kill()
            proc.wait()


def test_a_unix_socket_path_with_a_comma_is_refused_not_misrouted():
    """Black-box finding (round 14b): with the socket at .../models,v2/kv.sock the
    shared-memory session attached there while every gRPC call went to 'v2/kv.sock'
    (gRPC takes a comma as a list of addresses, escaped or not). Refused up front."""
    with pytest.raises(ValueError, match="comma"):
        KvClient("unix:///tmp/models,v2/kv.sock", shm=True, timeout=1)
