"""The Python client against a running `strata serve` (see conftest.py)."""

import json
import os
import signal
import tempfile
import time
import urllib.request

import grpc
import pytest

from strata_kv import BatchPutError, KvClient, KvError, chain_hashes_v1
from conftest import start_serve


def blob(n, seed):
    return bytes((i * 31 + seed) % 251 for i in range(n)) if n < 4096 else os.urandom(n)


@pytest.fixture
def client(server):
    with KvClient(server["tcp"], namespace="py/tenant-a") as c:
        yield c


def test_ping(client):
    p = client.ping()
    assert p["api"] == "v1"
    assert p["max_block_bytes"] == 64 << 20


@pytest.mark.parametrize("size", [1024, 64 << 10, (1 << 20) + 3, 8 << 20])
def test_put_get_round_trip(client, size):
    key = f"rt-{size}".encode()
    data = blob(size, size % 7)
    assert client.put(key, data) is False
    assert client.put(key, data) is True, "a repeated put is idempotent"
    assert client.get(key) == data
    assert client.exists(key)
    assert client.locate(key) == "memory"


def test_a_malformed_batched_put_stores_nothing_and_a_refused_one_names_its_index(client):
    """Black-box finding: a batch with a bad entry was half-applied (the entries before
    it stored, the ones after never sent) under one error naming neither."""
    good = [b"bp-1", b"bp-2", b"bp-3"]
    for bad_key, bad_value in [(b"", blob(2048, 1)), (b"k" * 65, blob(2048, 1)), (b"bp-x", b"")]:
        with pytest.raises(ValueError, match="nothing was sent"):
            client.batched_put([good[0], bad_key, good[2]], [blob(2048, 1), bad_value, blob(2048, 3)])
    assert client.batch_exists(good) == [False] * 3, "a malformed batch stores nothing"
    # A value under the service's smallest block: refused there, at index 1.
    with pytest.raises(BatchPutError) as e:
        client.batched_put(good, [blob(2048, 1), b"tiny", blob(2048, 3)])
    assert e.value.index == 1 and e.value.stored == [False]
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "put 1 of the batch failed" in str(e.value)
    assert client.batch_exists(good) == [True, False, False]


def test_connector_shape_prefix_and_batches(client):
    tokens = list(range(256 * 6))
    keys = chain_hashes_v1(tokens, 256)
    values = [blob(4096 + i, i) for i in range(6)]
    assert client.batched_contains(keys) == 0
    assert client.batched_put(keys[:4], values[:4]) == [False] * 4
    client.put(keys[5], values[5])
    assert client.batched_contains(keys) == 4, "stops at the first miss"
    assert client.batch_exists(keys) == [True] * 4 + [False, True]
    got = client.batched_get(keys)
    assert got[:4] == values[:4] and got[4] is None and got[5] == values[5]
    est = client.estimate_load(keys)
    assert est["matched"] == 4 and est["blocks"][4] == (None, 0.0) and est["total_us"] > 0
    assert client.prefetch(keys[:1]) == {"staged": 0, "already_fast": 1, "missing": 0}
    assert client.remove(keys[:2]) == 2
    assert client.batched_contains(keys) == 0
    assert client.get(keys[0]) is None


def test_namespaces_are_separate(server):
    with KvClient(server["tcp"], namespace="py/a") as a, KvClient(server["tcp"], namespace="py/b") as b:
        a.put(b"shared-name", b"x" * 2048)
        assert a.exists(b"shared-name")
        assert not b.exists(b"shared-name")
        assert b.get(b"shared-name") is None


def test_unix_socket(server):
    with KvClient(server["unix"], namespace="py/unix") as c:
        c.put(b"k", b"u" * 5000)
        assert c.get(b"k") == b"u" * 5000


def test_bad_input_is_a_clear_error(client):
    for call in (lambda: client.put(b"", b"x" * 1024),
                 lambda: client.put(b"k" * 65, b"x" * 1024),
                 lambda: client.exists(b"", namespace="py/x"),
                 lambda: client.get(b"k", namespace="")):
        with pytest.raises(KvError) as e:
            call()
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(KvError) as e:
        client.put(b"too-big", b"\0" * ((64 << 20) + 1))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "exceeds" in e.value.message
    assert client.ping()["api"] == "v1", "server unharmed"


def test_admin_stats_count_python_traffic(server, client):
    client.put(b"stats-key", b"s" * 4096)
    client.get(b"stats-key")
    with urllib.request.urlopen(f"http://{server['admin']}/stats", timeout=10) as r:
        stats = json.load(r)
    ns = {n["namespace"]: n for n in stats["kv"]["namespaces"]}
    assert ns["py/tenant-a"]["hits"] >= 1
    with urllib.request.urlopen(f"http://{server['admin']}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'strata_kv_hits_total{namespace="py/tenant-a"}' in text


def test_same_host_gets_read_the_shared_memory_arena_in_place(server):
    """Attached to the daemon's arena (memfd over kv-shm.sock), a Get is a leased range
    read in place: the right bytes, no copy through the socket; leases released."""
    import os as _os

    blocks = {b"shm-%d" % i: _os.urandom((1 << 20) + i * 4097) for i in range(6)}
    with KvClient(server["unix"], namespace="shm-test/ns", shm=True) as c:
        for k, v in blocks.items():
            c.put(k, v)
        for _ in range(3):
            for k, v in blocks.items():
                with c.get_view(k) as view:
                    assert view.shared, "served from the arena"
                    assert view.data.readonly
                    assert view.data == v
                assert c.get(k) == v
        assert c.get_view(b"absent") is None
        # Several at once (sent together, one round trip): in order, misses as None.
        keys = [b"shm-1", b"absent", b"shm-4", b"shm-1"]
        views = c.get_views(keys)
        try:
            assert [v is None for v in views] == [False, True, False, False]
            for k, v in zip(keys, views):
                if v is not None:
                    assert v.shared and v.data == blocks[k]
        finally:
            for v in views:
                if v is not None:
                    v.release()
        # A batch past the session's share (a quarter of the 256 MiB arena): the first
        # 64 MiB leased in one call, the rest as bytes; all byte-exact, and the leases
        # go back on release (the same batch is leased again).
        big = {b"big-%d" % i: _os.urandom(2 << 20) for i in range(40)}
        for k, v in big.items():
            c.put(k, v)
        for _ in range(2):
            # Releases travel on the side socket, the leasing call on gRPC: the share is
            # exact once the daemon has read the releases sent before (under load one was
            # still on its way: 31 leased, fresh CI of 45a43b1).
            _wait_until_leases_back(server)
            views = c.get_views(list(big))
            try:
                assert [v.shared for v in views] == [True] * 32 + [False] * 8
                assert all(v.data == big[k] for k, v in zip(big, views))
            finally:
                for v in views:
                    v.release()
    # Without shm the same blocks come inline.
    with KvClient(server["unix"], namespace="shm-test/ns") as c:
        view = c.get_view(b"shm-0")
        assert not view.shared and view.data == blocks[b"shm-0"]


def test_gpu_tier_blocks_are_read_by_device_handle_in_place(gpu_server):
    """A daemon whose GPU tier is the emulated device sends its device memory (a memfd)
    over kv-shm.sock beside the arena; a Get asked with device=True of a GPU-resident
    block is a handle + lease: read in place there, byte-exact, and still intact after
    the key is evicted and new blocks are stored, until released."""
    import os as _os

    blocks = {b"dev-%d" % i: _os.urandom(300_000 + i * 4099) for i in range(4)}
    with KvClient(gpu_server["unix"], namespace="dev-test/ns", shm=True) as c:
        assert c.device_memory == "emulated"
        for k, v in blocks.items():
            c.put(k, v)
            assert c.locate(k) == "gpu"
        with c.get_view(b"dev-0") as plain:
            assert plain.shared and plain.device is None, "not asked: the arena"
        held = c.get_view(b"dev-0", device=True)
        assert held.device == "emulated" and held.handle.length == len(blocks[b"dev-0"])
        assert held.data.readonly and held.data == blocks[b"dev-0"]
        for k, v in blocks.items():
            with c.get_view(k, device=True) as view:
                assert view.device == "emulated" and view.data == v
        # Evicted while leased: a miss for everyone, the reader's bytes stay.
        assert c.remove([b"dev-0"]) == 1
        assert c.get(b"dev-0") is None
        for i in range(8):
            c.put(b"new-%d" % i, _os.urandom(300_000))
        assert held.data == blocks[b"dev-0"], "intact until released"
        held.release()
        assert c.get_view(b"absent", device=True) is None
    # Without the side socket, device=True has nothing to ask with: bytes inline.
    with KvClient(gpu_server["unix"], namespace="dev-test/ns") as c:
        assert c.device_memory is None
        view = c.get_view(b"dev-1", device=True)
        assert view.device is None and not view.shared and view.data == blocks[b"dev-1"]


def test_a_daemon_without_a_gpu_tier_sends_no_device_memory(server):
    with KvClient(server["unix"], namespace="dev-test/none", shm=True) as c:
        assert c.device_memory is None
        c.put(b"k", b"x" * 5000)
        with c.get_view(b"k", device=True) as view:
            assert view.device is None and view.shared and view.data == b"x" * 5000


def test_device_handle_wire_form_is_parsed_strictly():
    import struct

    from strata_kv.ipc import KIND_CUDA, parse_handle

    token = bytes(range(64))
    v2 = b"SGIP" + bytes([2, KIND_CUDA]) + struct.pack(">QII", 1 << 20, 0xDEADBEEF, 64) + token + struct.pack(">Q", 4096)
    h = parse_handle(v2)
    assert (h.kind_name, h.length, h.crc, h.offset, h.token) == ("cuda", 1 << 20, 0xDEADBEEF, 4096, token)
    v1 = b"SGIP" + bytes([1, 0]) + struct.pack(">QII", 7, 9, 2) + b"ab"
    assert parse_handle(v1).offset == 0 and parse_handle(v1).kind_name == "emulated"
    for bad in (v2[:-1], v2 + b"x", b"XGIP" + v2[4:], v2[:4] + bytes([3]) + v2[5:], v2[:5] + bytes([9]) + v2[6:]):
        with pytest.raises(ValueError):
            parse_handle(bad)


def _shm_stats(endpoints):
    with urllib.request.urlopen(f"http://{endpoints['admin']}/stats", timeout=10) as r:
        return json.load(r)["kv"]["shm"]


def _wait_until_leases_back(endpoints, within=10.0):
    """Waits (bounded) until the daemon holds no shared-memory lease."""
    import time as _time
    deadline = _time.monotonic() + within
    while _shm_stats(endpoints)["leased_bytes"] and _time.monotonic() < deadline:
        _time.sleep(0.01)


def test_a_killed_clients_device_leases_end_with_its_session(gpu_server):
    """A client holding a device lease is killed (SIGKILL: no release sent): its side
    socket closes, the daemon ends its session and drops the lease, so the block's
    device memory is not pinned by a dead reader."""
    import os as _os
    import signal as _signal
    import subprocess as _subprocess
    import sys as _sys
    import time as _time

    block = _os.urandom(777_777)
    with KvClient(gpu_server["unix"], namespace="dev-test/crash") as c:
        c.put(b"crash-key", block)
    before = _shm_stats(gpu_server)
    child = _subprocess.Popen([_sys.executable, "-c", f"""
import sys, time
from strata_kv import KvClient
c = KvClient({gpu_server['unix']!r}, namespace="dev-test/crash", shm=True)
v = c.get_view(b"crash-key", device=True)
assert v.device == "emulated" and len(v.data) == {len(block)}
print("held", flush=True)
time.sleep(120)
"""], stdout=_subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        held = _shm_stats(gpu_server)
        assert held["device_leases"] == before["device_leases"] + 1
        assert held["device_leased_bytes"] == before["device_leased_bytes"] + len(block)
        child.send_signal(_signal.SIGKILL)
        child.wait(timeout=10)
        deadline = _time.monotonic() + 10
        while _shm_stats(gpu_server)["device_leased_bytes"] != before["device_leased_bytes"]:
            assert _time.monotonic() < deadline, "the dead client's lease was not released"
            _time.sleep(0.05)
    finally:
        if child.poll() is None:
            child.kill()


def test_a_closed_client_raises_kv_error(server):
    """Black-box finding: a call after close() raised grpc's bare ValueError ("Channel
    closed!"), not the KvError every other failure is."""
    c = KvClient(server["tcp"], namespace="py/closed")
    c.close()
    for call in (c.ping, lambda: c.get(b"k" * 16), lambda: c.batched_get([b"k" * 16]),
                 lambda: c.put(b"k" * 16, b"v" * 4096)):
        with pytest.raises(KvError) as e:
            call()
        assert e.value.code == grpc.StatusCode.CANCELLED
        assert "closed" in e.value.message


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_shm_client_attaches_again_after_the_daemon_restarts(sig):
    """Black-box finding: after `strata serve` restarted on the same cache dir, a client
    attached to the arena (as the vLLM connector and the SGLang backend are) saw exists()
    true but every get fail with FAILED_PRECONDITION "the shared-memory session has
    ended" for good. It now attaches again and reads in place, the blocks the disk tier
    kept byte-exact."""
    blocks = {b"r-%d" % i: os.urandom((256 << 10) + i) for i in range(4)}
    with tempfile.TemporaryDirectory(prefix="strata-pytest-") as d:
        cache = os.path.join(d, "cache")
        tiers = {"memory": "16MiB", "disk": "64MiB"}
        proc, ep = start_serve(cache, **tiers)
        try:
            with KvClient(ep["unix"], namespace="restart/ns", shm=True) as c:
                for k, v in blocks.items():
                    c.put(k, v)
                view = c.get_view(b"r-0")
                assert view.shared and view.data == blocks[b"r-0"]
                view.release()
                proc.send_signal(sig)
                proc.wait(timeout=15)
                proc, ep2 = start_serve(cache, **tiers)
                assert ep2["unix"] == ep["unix"]
                for k, v in blocks.items():
                    assert c.get(k) == v
                views = c.get_views(list(blocks))
                assert all(v.shared for v in views), "read in place in the new arena"
                assert [bytes(v.data) for v in views] == list(blocks.values())
                for v in views:
                    v.release()
        finally:
            proc.kill()
            proc.wait()


def test_lookups_longer_than_one_call_are_cut_into_calls_the_server_takes(client):
    """Black-box finding: a lookup of more than 65,536 keys (a 32-layer model's layer
    keys of a ~33k-token prompt) or over 4 MiB was refused whole, so such prompts always
    missed. The client cuts it into calls the server takes; answers are as one call's."""
    from strata_kv.client import MAX_KEYS_PER_CALL, key_batches

    keys = [b"long-%059d" % i for i in range(70_000)]  # 64-byte keys: 4.5 MB in all
    runs = list(key_batches(keys))
    assert len(runs) > 1 and sum(len(r) for r in runs) == len(keys)
    assert all(len(r) <= MAX_KEYS_PER_CALL and sum(len(k) + 3 for k in r) <= 3 << 20 for r in runs)
    held = [0, 1, 2, 60_000]
    for i in held:
        client.put(keys[i], (b"v%d" % i) * 1024)
    exists = client.batch_exists(keys)
    assert len(exists) == len(keys) and [i for i, e in enumerate(exists) if e] == held
    assert client.match_prefix(keys) == 3
    est = client.estimate_load(keys)
    assert est["matched"] == 3 and len(est["blocks"]) == len(keys)
    got = client.batched_get(keys[59_990:60_010] + keys[:1])
    assert got[10] == b"v60000" * 1024 and got[-1] == b"v0" * 1024 and got.count(None) == 19
    assert client.remove(keys) == len(held)
    assert client.match_prefix(keys) == 0


def test_a_namespace_the_server_refuses_is_refused_at_construction(server):
    from strata_kv.client import namespace_from_name

    with pytest.raises(ValueError, match="1..=128 bytes"):
        KvClient(server["tcp"], namespace="n" * 129)
    with pytest.raises(ValueError, match="control"):
        KvClient(server["tcp"], namespace="a\nb")
    # A long model path (a Hugging Face snapshot is ~136 bytes) becomes one that fits,
    # its own: two paths differing only at the start do not share a namespace.
    snap = "/models--meta-llama--Meta-Llama-3.1-8B-Instruct/snapshots/" + "0" * 40
    a, b = namespace_from_name("/home/alice/.cache/hub" + snap), namespace_from_name("/home/bob/.cache/hub" + snap)
    assert a != b and all(len(n.encode()) <= 128 for n in (a, b))
    assert namespace_from_name("meta-llama/Llama-3-8B") == "meta-llama/Llama-3-8B"
    with KvClient(server["tcp"], namespace=a) as c:
        c.put(b"k", b"v" * 2048)
        assert c.get(b"k") == b"v" * 2048


def test_a_device_handle_reader_attaches_again_after_the_daemon_restarts():
    """Black-box finding: a client reading with device=True (the vLLM worker and the
    SGLang backend over an emulated or CUDA GPU tier) got bytes through the socket for
    good after `strata serve` restarted: per-key Gets naming the ended session are
    answered with bytes, not refused, so it never attached again."""
    blocks = {b"d-%d" % i: os.urandom((128 << 10) + i) for i in range(4)}
    with tempfile.TemporaryDirectory(prefix="strata-pytest-") as d:
        cache, toml = os.path.join(d, "cache"), os.path.join(d, "strata.toml")
        with open(toml, "w") as f:
            f.write('[cache]\ngpu = "64MiB"\ngpu_device = "emulated"\n')
        proc, ep = start_serve(cache, config_path=toml, disk="64MiB")
        try:
            with KvClient(ep["unix"], namespace="restart/dev", shm=True) as c:
                for k, v in blocks.items():
                    c.put(k, v)
                views = c.get_views(list(blocks), device=True)
                assert [v.device for v in views] == ["emulated"] * 4
                for v in views:
                    v.release()
                session = c._arena.session
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=15)
                proc, ep2 = start_serve(cache, config_path=toml, disk="64MiB")
                assert ep2["unix"] == ep["unix"]
                for _ in range(2):  # the first batch may promote blocks to the GPU tier
                    views = c.get_views(list(blocks), device=True)
                    got = [(v.device, v.shared, bytes(v.data)) for v in views]
                    for v in views:
                        v.release()
                assert c._arena is not None and c._arena.session != session, "attached again"
                assert all(shared for _, shared, _ in got), [g[:2] for g in got]
                assert [data for _, _, data in got] == list(blocks.values())
        finally:
            proc.kill()
            proc.wait()


def test_engine_flags_read_strings_as_people_write_them():
    """Black-box finding: ``{"shm": "false"}`` turned shared memory on (bool("false"))."""
    from strata_kv.client import config_flag

    for off in (False, 0, "false", "False", "0", "no", "off", ""):
        assert config_flag("shm", off) is False, off
    for on in (True, 1, "true", "TRUE", "1", "yes", "on"):
        assert config_flag("shm", on) is True, on
    for bad in ("maybe", 2, None, 1.5):
        with pytest.raises(ValueError, match="shm"):
            config_flag("shm", bad)


def test_a_pause_is_not_doubled_by_calls_that_were_in_flight_when_it_began():
    """Black-box finding: four threads' calls in flight across a 50 ms daemon restart
    each counted as another failure in a row: the pause grew to 16 s."""
    from strata_kv._pause import Pause

    now = [100.0]
    p = Pause(clock=lambda: now[0])
    down = KvError(grpc.StatusCode.UNAVAILABLE, "gone")
    for _ in range(4):
        p.outcome(down)
    assert p.active() and p._until == 100.0 + Pause.BASE_S
    now[0] += Pause.BASE_S + 0.1  # the pause ended; the next call failed too: doubled
    p.outcome(down)
    assert p._until == now[0] + 2 * Pause.BASE_S
    p.outcome(None)
    assert not p.active()


def test_get_views_cuts_a_batch_as_batched_get_does(server):
    """Black-box finding: get_views sent a whole batch in one BatchLease, so 65,537
    64-byte keys (which batched_get cuts into calls) were refused (4 MiB message bound);
    without the arena it opened one Get stream per key at once (20,000 of them)."""
    keys = [b"%064d" % i for i in range(65_537)]
    with KvClient(server["unix"], namespace="py/views-long", shm=True, timeout=30) as c:
        c.put(keys[-1], b"x" * 1024)
        assert sum(v is not None for v in c.batched_get(keys)) == 1
        views = c.get_views(keys)
        assert len(views) == len(keys) and views[-1] is not None and views[-1].shared
        assert all(v is None for v in views[:-1])
        assert views[-1].data == b"x" * 1024
        views[-1].release()
    with KvClient(server["unix"], namespace="py/views-long", timeout=30) as c:
        stub, open_now, most = c._stub, [0], [0]
        get = stub.Get

        def counting_get(*args, **kwargs):
            open_now[0] += 1
            most[0] = max(most[0], open_now[0])
            return get(*args, **kwargs)

        def collect(*args, _view_of=c._view_of):
            open_now[0] -= 1
            return _view_of(*args)

        stub.Get, c._view_of = counting_get, collect
        views = c.get_views(keys[-3000:])
        assert views[-1] is not None and views[-1].data == b"x" * 1024
        assert all(v is None for v in views[:-1])
        assert most[0] <= 256, f"{most[0]} Gets open at once"


def test_put_stores_the_bytes_of_any_contiguous_buffer(client):
    """Black-box finding: put of a 2-D or typed array (what an engine holds) declared
    len() - rows or elements - as the size, refused with a size the caller never had;
    a str key failed inside the request stream as UNKNOWN."""
    np = pytest.importorskip("numpy")
    values = {
        b"typed-u8-2d": np.arange(64 * 64, dtype=np.uint8).reshape(64, 64),
        b"typed-f16": np.linspace(0, 1, 2 << 20, dtype=np.float16),  # 4 MiB: several chunks
        b"typed-f32": np.arange(1024, dtype=np.float32),
        b"typed-i64-3d": np.arange(2 * 16 * 32, dtype=np.int64).reshape(2, 16, 32),
    }
    for key, arr in values.items():
        assert client.put(key, arr) is False
        assert client.get(key) == arr.tobytes()
    assert client.batched_put([b"typed-b1", b"typed-b2"], list(values.values())[:2]) == [False, False]
    assert client.get(b"typed-b1") == values[b"typed-u8-2d"].tobytes()
    strided = np.arange(64 * 64, dtype=np.uint8).reshape(64, 64)[:, ::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        client.put(b"typed-strided", strided)
    with pytest.raises(ValueError, match="nothing was sent"):
        client.batched_put([b"typed-b3", b"typed-b4"], [b"x" * 2048, strided])
    with pytest.raises(TypeError, match="key is bytes"):
        client.put("typed-str-key", b"x" * 2048)
    with pytest.raises(TypeError, match="nothing was sent"):
        client.batched_put([b"typed-b5", "typed-str"], [b"x" * 2048, b"y" * 2048])
    with pytest.raises(TypeError, match="bytes-like"):
        client.put(b"typed-list", [1, 2, 3])
    assert client.batch_exists([b"typed-strided", b"typed-b3", b"typed-b5"]) == [False] * 3


def test_a_client_reaches_a_restarted_daemon_within_seconds():
    """Black-box finding (round 25c): a client that kept calling through a 45 s outage
    failed UNAVAILABLE for 19-26 s after the daemon listened again (gRPC's reconnect
    backoff, up to 120 s by default). Its backoff is capped at a second."""
    with tempfile.TemporaryDirectory(prefix="strata-pytest-") as d:
        cache = os.path.join(d, "cache")
        proc, ep = start_serve(cache)
        try:
            # The Unix socket is at the same path after the restart (the cache dir's).
            c = KvClient(ep["unix"], namespace="py/restart", timeout=2)
            c.put(b"k" * 16, b"v" * 4096)
            proc.kill()
            proc.wait()
            # Calls through the outage grow gRPC's backoff.
            outage_end = time.monotonic() + 20
            while time.monotonic() < outage_end:
                with pytest.raises(KvError):
                    c.ping()
                time.sleep(0.5)
            proc, ep2 = start_serve(cache)
            assert ep2["unix"] == ep["unix"]
            back = time.monotonic()
            while True:
                try:
                    c.ping()
                    break
                except KvError:
                    assert time.monotonic() - back < 5, "still refused 5 s after the daemon was back"
                    time.sleep(0.1)
            c.close()
        finally:
            proc.kill()
            proc.wait()


def test_namespaces_keys_and_timeouts_of_any_kind_are_clear(server, client):
    """Black-box findings (round 25c): a per-call namespace that is no str, or holds a
    lone surrogate, failed as UNKNOWN "Exception iterating requests!" or a bare
    UnicodeEncodeError; a bytearray key was taken by put and refused by every lookup;
    timeout=inf, NaN or 1e12 failed every call DEADLINE_EXCEEDED at once."""
    for bad, kind in ((7, TypeError), ("\udcff-model", ValueError)):
        for call in (lambda: client.put(b"k" * 16, b"v" * 1024, namespace=bad),
                     lambda: client.get(b"k" * 16, namespace=bad),
                     lambda: client.batched_put([b"k" * 16], [b"v" * 1024], namespace=bad)):
            with pytest.raises(kind) as e:
                call()
            assert "namespace" in str(e.value)
    key = bytearray(b"b" * 16)
    client.put(key, b"w" * 2048)
    assert client.get(key) == b"w" * 2048
    assert client.exists(key) and client.batch_exists([key]) == [True]
    assert client.match_prefix([key]) == 1
    assert client.batched_get([key]) == [b"w" * 2048]
    assert client.remove([key]) == 1
    for t in (float("inf"), 1e12):
        c = KvClient(server["tcp"], namespace="py/timeouts", timeout=t)
        c.put(b"t" * 16, b"x" * 1024, timeout=t)
        assert c.get(b"t" * 16) == b"x" * 1024
        c.close()
    for t in (float("nan"), 0, -1):
        with pytest.raises(ValueError):
            KvClient(server["tcp"], timeout=t)
