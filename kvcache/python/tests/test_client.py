"""The Python client against a running `strata serve` (see conftest.py)."""

import json
import os
import urllib.request

import grpc
import pytest

from strata_kv import KvClient, KvError, chain_hashes_v1


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
    # Without shm the same blocks come inline.
    with KvClient(server["unix"], namespace="shm-test/ns") as c:
        view = c.get_view(b"shm-0")
        assert not view.shared and view.data == blocks[b"shm-0"]
