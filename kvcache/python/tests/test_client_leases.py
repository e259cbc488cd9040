"""Lifetimes of the client's zero-copy leases (black-box findings): a view's bytes stay its
block's while anything in this process can read them, whatever else happens (a fork, a
stopped daemon, the client closed, arrays made from the view), and never block the caller.

Each test wraps the daemon's arena (16 MiB here) with another client's traffic, so a
range given back too early shows another block's bytes."""

import gc
import json
import os
import select
import signal
import threading
import time
import urllib.request
import warnings

import grpc
import pytest

from strata_kv import KvClient, KvError
from conftest import freeze, strata_serve

SMALL_ARENA = '[kv]\nshm = "16MiB"\n'
MIB = 1 << 20


@pytest.fixture(scope="module")
def small_arena():
    with strata_serve([], config_text=SMALL_ARENA) as endpoints:
        yield endpoints


def shm_stats(endpoints):
    with urllib.request.urlopen(f"http://{endpoints['admin']}/stats", timeout=10) as r:
        return json.load(r)["kv"]["shm"]


def wrap_arena(endpoints, tag):
    """Another client's puts and reads, enough to reuse every free range of the arena."""
    with KvClient(endpoints["unix"], namespace="leases/other", shm=True, timeout=10) as c:
        for i in range(40):
            key = b"%s-wrap-%d" % (tag, i)
            c.put(key, bytes([i % 250 + 1]) * MIB)
            c.get_view(key).release()


def changed(data, byte):
    return sum(1 for x in bytes(data) if x != byte)


def wait_for(cond, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def in_child(body):
    """Forks; the child runs ``body()`` and reports its str (or its error) on a pipe, then
    waits to be killed (os._exit: never pytest's own exit). Returns (pid, answer)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                msg = str(body())
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                msg = f"error {type(e).__name__}: {e}"
            os.write(w, msg.encode()[:4000])
            os.close(w)
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 20)
        answer = os.read(r, 4000).decode() if ready else "no answer in 20 s"
    finally:
        os.close(r)
    return pid, answer


def reap(pid, sig=signal.SIGKILL):
    os.kill(pid, sig)
    os.waitpid(pid, 0)


@pytest.mark.parametrize("how", ["release", "with", "collect"])
def test_a_forked_child_does_not_release_the_parents_views(small_arena, how):
    """Black-box finding: a forked child that merely exited released the parent's lease
    (its copy of the view sent the id on the inherited side socket); the parent's open
    view then showed another block's bytes."""
    with KvClient(small_arena["unix"], namespace="leases/fork", shm=True, timeout=10) as c:
        key = b"fork-%s" % how.encode()
        c.put(key, b"\xaa" * MIB)
        view = c.get_view(key)
        assert view.shared

        def child():
            if how == "release":
                view.release()
            elif how == "with":
                with view:
                    pass
            else:
                view.__del__()  # what the child's exit runs (the finding's case)
                gc.collect()
            return "done"

        pid, answer = in_child(child)
        reap(pid)
        assert answer == "done"
        wrap_arena(small_arena, key)
        assert changed(view.data, 0xAA) == 0, "the parent's view is still its block"
        view.release()


def test_a_forked_childs_client_has_a_session_of_its_own(small_arena):
    """Black-box finding: a forked child's calls on the inherited client failed ("Closed
    on fork") or leased into the parent's session, and a child killed holding them took
    the parent's zero-copy share for good. The child now opens its own channel and
    session; killing it gives its leases back."""
    with KvClient(small_arena["unix"], namespace="leases/fork2", shm=True, timeout=10) as c:
        keys = [b"share-%d" % i for i in range(8)]
        for k in keys:
            c.put(k, b"\x11" * MIB)
        views = c.get_views(keys)
        before = sum(v.shared for v in views)
        for v in views:
            v.release()
        assert before == 4, "a session's share is a quarter of the arena"

        def child():
            vs = c.get_views(keys, timeout=5)
            assert all(bytes(v.data) == b"\x11" * MIB for v in vs)
            return f"{sum(v.shared for v in vs)} {c._arena.session}"

        pid, answer = in_child(child)
        try:
            assert not answer.startswith(("error", "no answer")), answer
            leased, session = answer.split()
            assert int(leased) == 4 and session != c._arena.session, "its own session"
            # The parent's client goes on as before, beside the child's session.
            assert c.get(keys[0]) == b"\x11" * MIB
        finally:
            reap(pid)
        wait_for(lambda: shm_stats(small_arena)["leased_bytes"] == 0, "the killed child's leases ended")
        views = c.get_views(keys)
        assert sum(v.shared for v in views) == before, "the parent's share is whole"
        for v in views:
            v.release()


def test_releases_never_block_on_a_stopped_daemon():
    """Black-box finding: with the daemon stopped, the 279th release of a 600-page batch
    blocked (a blocking send on a full socket) until it resumed, and a get_views with
    timeout=2 behind it never returned. Releases are queued and sent when the daemon
    reads again."""
    with strata_serve([], config_text=SMALL_ARENA) as ep:
        with KvClient(ep["unix"], namespace="leases/stop", shm=True, timeout=10) as c:
            keys = [b"page-%d" % i for i in range(600)]
            c.batched_put(keys, [bytes([i % 251]) * 1024 for i in range(600)])
            views = c.get_views(keys)
            assert all(v.shared for v in views)
            freeze(ep["pid"])
            try:
                released = []
                t = threading.Thread(target=lambda: released.extend(v.release() for v in views), daemon=True)
                t.start()
                t.join(10)
                assert not t.is_alive() and len(released) == 600, "releases did not block"
                outcome = {}

                def bounded():
                    t0 = time.monotonic()
                    try:
                        c.get_views(keys[:1], timeout=2)
                        outcome["r"] = "answered"
                    except KvError as e:
                        outcome["r"] = e.code
                    outcome["s"] = time.monotonic() - t0

                g = threading.Thread(target=bounded, daemon=True)
                g.start()
                g.join(8)
                assert not g.is_alive(), "a call with timeout=2 returned"
                assert outcome["r"] == grpc.StatusCode.DEADLINE_EXCEEDED and outcome["s"] < 4, outcome
            finally:
                os.kill(ep["pid"], signal.SIGCONT)
            # Resumed: the queued ids go with the next call, and the batch is leased again.
            c.ping()
            views = c.get_views(keys)
            try:
                assert [bytes(v.data) for v in views] == [bytes([i % 251]) * 1024 for i in range(600)]
            finally:
                for v in views:
                    v.release()
            c.get_views(keys[:1])[0].release()  # sends what the socket still held back
            wait_for(lambda: shm_stats(ep)["leased_bytes"] == 0, "every lease was given back")


def test_buffers_made_from_a_view_keep_its_block(small_arena):
    """Black-box finding: np.frombuffer(view.data) or a slice of it taken inside `with
    view:` stayed readable after the release and, once the arena wrapped, showed another
    block's bytes. Now the lease lasts as long as any buffer over the view's bytes; only
    view.data itself reads as released."""
    np = pytest.importorskip("numpy")
    with KvClient(small_arena["unix"], namespace="leases/derived", shm=True, timeout=10) as c:
        c.put(b"derived", b"\xaa" * MIB)
        # Earlier tests' releases and sessions end asynchronously in the daemon.
        wait_for(lambda: shm_stats(small_arena)["leased_bytes"] == 0, "no lease held before")
        with c.get_view(b"derived") as view:
            arr = np.frombuffer(view.data, dtype=np.uint8)
            part = view.data[:4096]
            kept = view.data
            tensor = None
            try:
                import torch

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # read-only buffer
                    tensor = torch.frombuffer(view.data, dtype=torch.uint8)
            except ImportError:
                pass
        with pytest.raises(ValueError):
            view.data[0]
        assert shm_stats(small_arena)["leased_bytes"] == MIB, "the lease is still held"
        wrap_arena(small_arena, b"derived")
        assert int((arr != 0xAA).sum()) == 0
        assert changed(part, 0xAA) == 0 and changed(kept, 0xAA) == 0
        if tensor is not None:  # torch keeps the memoryview object, not a buffer of it
            assert int((tensor != 0xAA).sum()) == 0
        del arr, part, tensor
        # (The other client's last lease ends asynchronously.)
        wait_for(lambda: shm_stats(small_arena)["leased_bytes"] == MIB, "`kept` still holds the lease")
        time.sleep(0.2)
        assert shm_stats(small_arena)["leased_bytes"] == MIB, "`kept` still holds the lease"
        del kept
        wait_for(lambda: shm_stats(small_arena)["leased_bytes"] == 0, "the last buffer let the lease go")


def test_an_open_view_keeps_its_session_after_the_client_closes(small_arena):
    """Black-box finding: a view never released, read after its client's close(), showed
    another block's bytes (close ended the session, so the daemon reused its ranges).
    The session now ends when the last view into it is released."""
    wait_for(lambda: shm_stats(small_arena)["sessions"] == 0, "earlier tests' sessions ended")
    with KvClient(small_arena["unix"], namespace="leases/close", shm=True, timeout=10) as c:
        c.put(b"closed", b"\xaa" * MIB)
        view = c.get_view(b"closed")
    assert shm_stats(small_arena)["sessions"] == 1, "the session stays open"
    wrap_arena(small_arena, b"closed")
    assert changed(view.data, 0xAA) == 0
    view.release()
    wait_for(lambda: shm_stats(small_arena)["sessions"] == 0, "the session ended with its last view")


class _Timeout(grpc.RpcError):
    """What a Get whose deadline passed raises."""

    def code(self):
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self):
        return "Deadline Exceeded"


def test_a_timed_out_get_of_a_batch_gives_its_lease_back(small_arena):
    """Black-box finding: get_views calls with short deadlines left the session with no
    zero-copy share at all. A block BatchLease answered unleased (the share was full
    then) is fetched by Get, which may lease it by then; that Get carried no call number,
    so when it timed out after the daemon leased it, the lease could never be given
    back. Here such a Get's answer is lost as a timeout loses it: its lease comes back."""
    with KvClient(small_arena["unix"], namespace="leases/timeout", shm=True, timeout=10) as c:
        keys = [b"full-%d" % i for i in range(4)]
        for k in keys + [b"late"]:
            c.put(k, b"\x44" * MIB)
        wait_for(lambda: shm_stats(small_arena)["leased_bytes"] == 0, "no lease held before")
        held = c.get_views(keys)
        assert all(v.shared for v in held), "the session's share (a quarter of the arena) is full"
        real = c._grpc_stub
        lost = []

        class Stub:
            def __getattr__(self, name):
                return getattr(real, name)

            def Get(self, *args, **kwargs):
                # The share frees between the BatchLease and this Get: the Get leases.
                for v in held:
                    v.release()
                c._arena.flush()
                wait_for(lambda: shm_stats(small_arena)["leased_bytes"] == 0, "the share is free")
                stream = real.Get(*args, **kwargs)

                class Lost:
                    def __iter__(self):
                        # The daemon answered (with a lease), but the caller's deadline
                        # passed before it read the answer.
                        lost.extend(stream)
                        raise _Timeout()

                    def cancel(self):
                        stream.cancel()

                return Lost()

        c._grpc_stub = Stub()
        with pytest.raises(KvError) as e:
            c.get_views([b"late"], timeout=5)
        c._grpc_stub = real
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert lost and lost[0].shm_lease, "the lost answer held a lease"
        wait_for(lambda: shm_stats(small_arena)["leased_bytes"] == 0, "the lost answer's lease came back", 5)
        views = c.get_views(keys)
        try:
            assert all(v.shared for v in views), "the session's share is whole"
        finally:
            for v in views:
                v.release()
