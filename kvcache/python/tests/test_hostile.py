"""Hostile clients against the real `strata serve` binary (the `server` fixture): each
ends in a clear error for that client, while a well-behaved client keeps working
(issue 12: stalled streams, huge declared sizes, tiny blocks, junk namespaces)."""

import json
import threading
import time
import urllib.request

import grpc
import pytest

from strata_kv import KvClient
from strata_kv._gen import kv_pb2, kv_pb2_grpc
from strata_kv.client import KvError

NS = "hostile-test/tenant"


def _stalled_put(channel, key: bytes, release: threading.Event):
    """A Put that declares 64 MiB, sends one byte and then stalls until `release`."""

    def messages():
        yield kv_pb2.PutRequest(namespace=NS, hash=key, size=64 << 20, data=b"x")
        release.wait(30)

    stub = kv_pb2_grpc.KvCacheStub(channel)
    return stub.Put.future(messages(), timeout=30)


def test_stalled_puts_do_not_block_a_well_behaved_client(server):
    release = threading.Event()
    channels = [grpc.insecure_channel(server["tcp"]) for _ in range(4)]
    stalled = [_stalled_put(channels[i % 4], b"stall-%d" % i, release) for i in range(20)]
    try:
        time.sleep(0.5)  # the stalled streams are open and holding what they sent
        with KvClient(server["tcp"], namespace=NS, timeout=10) as c:
            block = bytes(range(256)) * 4096  # 1 MiB
            t0 = time.monotonic()
            assert c.put(b"good", block) is False
            took = time.monotonic() - t0
            assert took < 5, f"a 1 MiB put took {took:.1f} s next to 20 stalled puts"
            assert c.get(b"good") == block
    finally:
        release.set()
        for f in stalled:
            f.cancel()
        for ch in channels:
            ch.close()
    # None of the stalled blocks was stored.
    with KvClient(server["tcp"], namespace=NS) as c:
        assert not any(c.exists(b"stall-%d" % i) for i in range(20))


def test_a_declared_size_beyond_the_limit_is_refused_at_once(server):
    stub = kv_pb2_grpc.KvCacheStub(grpc.insecure_channel(server["tcp"]))
    req = iter([kv_pb2.PutRequest(namespace=NS, hash=b"huge", size=1 << 40, data=b"x")])
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        stub.Put(req, timeout=10)
    assert e.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert time.monotonic() - t0 < 5


def test_tiny_blocks_are_refused_with_the_limit_in_the_message(server):
    with KvClient(server["tcp"], namespace=NS) as c:
        with pytest.raises(KvError) as e:
            c.put(b"tiny", b"0123456789")
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "minimum" in str(e.value), str(e.value)
        assert not c.exists(b"tiny")
        # A well-formed block right after is fine.
        assert c.put(b"ok", bytes(4096)) is False


def test_junk_namespaces_cannot_grow_the_stats(server):
    with KvClient(server["tcp"]) as c:
        for i in range(2000):
            assert c.get(b"k", namespace=f"junk-{i}") is None
    with urllib.request.urlopen(f"http://{server['admin']}/stats", timeout=10) as r:
        stats = json.load(r)
    names = [n["namespace"] for n in stats["kv"]["namespaces"]]
    assert not any(n.startswith("junk-") for n in names), names[:10]
    assert len(names) < 300
