"""``strata_kv.sglang.StrataHiCacheStorage`` against the installed SGLang (issue 15).

Real objects, CPU only: the backend is created by SGLang's own ``StorageBackendFactory``
("dynamic" backend, as ``--hicache-storage-backend dynamic`` does), over SGLang's real
``MHATokenToKVPoolHost`` built on CPU tensors, with page keys from SGLang's own chained
page hash (``get_hash_str``, the LoRA/extra-key seed from ``storage_namespace_seed``).

A missing sglang is an import error here: the test fails, it is never skipped.
"""

import os
import signal
import threading
import time
import uuid

import pytest
import torch
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str, storage_namespace_seed

from strata_kv.sglang import StrataHiCacheStorage, pool_geometry

from conftest import freeze

PAGE, LAYERS, HEADS, DIM, TOKENS = 4, 2, 2, 8, 64
PROMPT = list(range(500, 500 + 5 * PAGE))


def host_pool(layout="page_first", dtype=torch.float32, heads=HEADS, layers=LAYERS):
    """SGLang's MHA host pool over CPU 'device' buffers."""
    k = tuple(torch.zeros(TOKENS + PAGE, heads, DIM, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(TOKENS + PAGE, heads, DIM, dtype=dtype) for _ in range(layers))

    def ptrs(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
                         page_size=PAGE, head_num=heads, head_dim=DIM, v_head_dim=DIM, dtype=dtype,
                         device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, host_to_device_ratio=2.0, host_size=0, page_size=PAGE, layout=layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=TOKENS,
                                start_layer=0, end_layer=layers)


def backend(server, namespace, pool, tp_rank=0, tp_size=1, mla=False, pp_rank=0, pp_size=1, addr="unix",
            **extra):
    cfg = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=pool.layout == "page_first",
        model_name="tiny-llama",
        extra_config={"backend_name": "strata", "module_path": "strata_kv.sglang",
                      "class_name": "StrataHiCacheStorage", "interface_v1": 1,
                      "strata_addr": server[addr], "namespace": namespace, **extra},
    )
    st = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    assert isinstance(st, StrataHiCacheStorage) and isinstance(st, HiCacheStorage)
    st.register_mem_pool_host(pool)
    return st


def fill(pool, pages, seed):
    """Random page contents written through the pool's own page API."""
    g = torch.Generator().manual_seed(seed)
    for off in pages:
        shape = pool.get_dummy_flat_data_page().shape
        pool.set_from_flat_data_page(off, torch.randn(shape, generator=g, dtype=torch.float32).to(pool.dtype))


def page_bytes(pool, off):
    return pool.get_data_page(off, flat=True).contiguous().view(torch.uint8).numpy().tobytes()


def indices(offsets):
    return torch.cat([torch.arange(o, o + PAGE) for o in offsets])


def page_keys(tokens=PROMPT, lora=None):
    return get_hash_str(tokens, storage_namespace_seed(lora, None), page_size=PAGE)


def ns():
    return f"sglang-test-{uuid.uuid4().hex[:8]}"


def write_pages(server, namespace, seed=1, offsets=(0, 4, 8, 12, 16), **extra):
    pool = host_pool()
    fill(pool, offsets, seed)
    st = backend(server, namespace, pool, **extra)
    keys = page_keys()
    assert st.batch_set_v1(keys, indices(offsets)) == [True] * len(keys)
    return [page_bytes(pool, o) for o in offsets], keys


def test_pages_set_by_one_instance_load_byte_exact_in_another(server):
    namespace = ns()
    written, keys = write_pages(server, namespace)
    pool = host_pool()
    st = backend(server, namespace, pool)
    assert st.batch_exists(keys) == len(keys)
    dst = [20, 28, 36, 44, 52]
    assert st.batch_get_v1(keys, indices(dst)) == [True] * len(keys)
    assert [page_bytes(pool, o) for o in dst] == written
    assert st.get_stats()["pages_read"] == len(keys)
    assert st._shm, "on the daemon's host the pages came through the shared-memory arena"
    # The same through the socket (shm off): the same bytes.
    pool2 = host_pool()
    st2 = backend(server, namespace, pool2, shm=False)
    assert st2.batch_get_v1(keys, indices(dst)) == [True] * len(keys)
    assert [page_bytes(pool2, o) for o in dst] == written and not st2._shm


def test_pages_in_the_gpu_tier_load_by_device_handle(gpu_server):
    """The daemon's (emulated) GPU tier holds the pages: the host pool, in host memory
    like the emulated device, reads them in place by handle, byte-exact."""
    namespace = ns()
    written, keys = write_pages(gpu_server, namespace)
    pool = host_pool()
    st = backend(gpu_server, namespace, pool)
    dst = [20, 28, 36, 44, 52]
    assert st.batch_get_v1(keys, indices(dst)) == [True] * len(keys)
    assert [page_bytes(pool, o) for o in dst] == written
    assert st.get_stats()["device_reads"] == len(keys)


def test_layer_first_pool_and_generic_get_set(server):
    namespace = ns()
    pool = host_pool("layer_first")
    fill(pool, [0], 7)
    st = backend(server, namespace, pool)
    page = pool.get_data_page(0, flat=True)
    [key] = page_keys(PROMPT[:PAGE])
    assert st.set(key, page)
    assert st.exists(key)
    target = pool.get_dummy_flat_data_page()
    got = st.get(key, target)
    assert got is target and torch.equal(got, page)
    assert st.batch_get([key, "f" * 64], [pool.get_dummy_flat_data_page(), pool.get_dummy_flat_data_page()])[1] is None
    # A target of another size is never filled.
    assert st.get(key, torch.zeros(3)) is None


def test_batch_exists_is_the_longest_leading_run(server):
    namespace = ns()
    pool = host_pool()
    fill(pool, [0, 4, 8, 12, 16], 3)
    st = backend(server, namespace, pool)
    keys = page_keys()
    assert st.batch_set_v1([keys[0], keys[1], keys[3]], indices([0, 4, 12])) == [True] * 3
    assert st.batch_exists(keys) == 2
    assert st.batch_exists(keys[3:4]) == 1
    assert st.batch_exists([]) == 0


@pytest.mark.parametrize("change", ["revision", "rope_scaling", "kv_dtype", "lora"])
def test_changed_model_identity_is_a_miss_never_a_load(server, change):
    namespace = ns()
    _, keys = write_pages(server, namespace, revision="rev-1", rope_scaling=None)
    extra = {"revision": "rev-1", "rope_scaling": None}
    if change == "revision":
        extra["revision"] = "rev-2"
    elif change == "rope_scaling":
        extra["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    elif change == "kv_dtype":
        extra["kv_dtype"] = "fp8_e4m3"
    elif change == "lora":
        keys = page_keys(lora="adapter-a")  # SGLang seeds the page chain with the LoRA id
    pool = host_pool()
    st = backend(server, namespace, pool, **extra)
    assert st.batch_exists(keys) == 0
    assert st.batch_get_v1(keys, indices([0, 4, 8, 12, 16])) == [False] * len(keys)
    assert not pool.kv_buffer.any(), "nothing was copied into the host pool"


def test_every_tp_rank_gets_the_same_answer_and_its_own_share(server):
    namespace = ns()
    keys = page_keys()
    offsets = [0, 4, 8, 12, 16]
    pools = [host_pool(), host_pool()]
    ranks = [backend(server, namespace, pools[r], tp_rank=r, tp_size=2) for r in range(2)]
    fill(pools[0], offsets, 10)
    fill(pools[1], offsets, 11)
    assert ranks[0].batch_set_v1(keys, indices(offsets)) == [True] * len(keys)
    # Rank 1 has stored nothing yet: no page is usable by the TP group, on either rank.
    assert [r.batch_exists(keys) for r in ranks] == [0, 0]
    assert ranks[1].batch_set_v1(keys[:3], indices(offsets[:3])) == [True] * 3
    assert [r.batch_exists(keys) for r in ranks] == [3, 3]
    for r in range(2):
        fresh = host_pool()
        reader = backend(server, namespace, fresh, tp_rank=r, tp_size=2)
        assert reader.batch_get_v1(keys[:3], indices([20, 24, 28])) == [True] * 3
        assert [page_bytes(fresh, o) for o in [20, 24, 28]] == [page_bytes(pools[r], o) for o in offsets[:3]]


def test_mla_pages_are_written_once_and_shared_by_tp_ranks(server):
    namespace = ns()
    keys = page_keys()
    offsets = [0, 4, 8, 12, 16]
    p0, p1 = host_pool(), host_pool()
    fill(p0, offsets, 20)
    fill(p1, offsets, 21)  # a non-writer's data must never reach the store
    r1 = backend(server, namespace, p1, tp_rank=1, tp_size=2, mla=True)
    assert r1.batch_set_v1(keys, indices(offsets)) == [True] * len(keys)
    assert r1.batch_exists(keys) == 0 and r1.get_stats()["pages_written"] == 0
    r0 = backend(server, namespace, p0, tp_rank=0, tp_size=2, mla=True)
    assert r0.batch_set_v1(keys, indices(offsets)) == [True] * len(keys)
    assert r1.batch_exists(keys) == len(keys)
    fresh = host_pool()
    reader = backend(server, namespace, fresh, tp_rank=1, tp_size=2, mla=True)
    assert reader.batch_get_v1(keys, indices(offsets)) == [True] * len(keys)
    assert [page_bytes(fresh, o) for o in offsets] == [page_bytes(p0, o) for o in offsets]


def test_identity_refused_by_the_service_is_a_miss(server):
    namespace = ns()
    _, keys = write_pages(server, namespace)
    pool = host_pool()
    # Another revision in the namespace the writer bound: the real service refuses every
    # call (FAILED_PRECONDITION), through the socket and through the arena alike.
    st = backend(server, namespace, pool, revision="another-revision")
    assert st.batch_exists(keys) == 0
    assert not st.exists(keys[0])
    assert st.batch_get_v1(keys, indices([0, 4, 8, 12, 16])) == [False] * len(keys)
    assert st.batch_set_v1(keys, indices([0, 4, 8, 12, 16])) == [False] * len(keys)
    assert not pool.kv_buffer.any()
    assert st.get_stats()["identity_refusals"] >= 5


@pytest.mark.parametrize("other", [dict(layers=1, heads=4), dict(layers=4, heads=1), dict(layers=1, heads=2)],
                         ids=["same-page-bytes", "same-page-bytes-more-layers", "smaller-pages"])
def test_another_kv_geometry_under_the_same_model_name_is_a_miss_never_a_load(server, other):
    """Two models served under one model name (SGLang's model_name) into one namespace,
    no revision: one with 2 layers x 2 KV heads, the other with another geometry. Pages
    of the same size must not load into the other's pool; pages of another size must
    not be announced by batch_exists (its batch_get_v1 could never load them)."""
    namespace = ns()
    written, keys = write_pages(server, namespace)
    pool = host_pool(**other)
    st = backend(server, namespace, pool)
    assert st.batch_exists(keys) == 0
    assert not st.exists(keys[0])
    dst = [0, 4, 8, 12, 16]
    assert st.batch_get_v1(keys, indices(dst)) == [False] * len(keys)
    assert not pool.kv_buffer.any(), "nothing of the other model was copied into the host pool"
    assert st.identity != backend(server, namespace, host_pool()).identity
    # The same geometry still loads (the miss is the geometry, not the namespace).
    same = host_pool()
    assert backend(server, namespace, same).batch_get_v1(keys, indices(dst)) == [True] * len(keys)
    assert [page_bytes(same, o) for o in dst] == written


def test_geometry_in_the_identity_is_the_same_on_every_rank():
    """TP ranks hold the same geometry; PP stages may hold different layer counts, so
    their per-stage fields stay out (the namespace binds one identity for all ranks)."""
    two, one = host_pool(layers=2), host_pool(layers=1)
    assert pool_geometry(two)["layer_num"] == 2 and pool_geometry(two)["head_num"] == HEADS
    assert pool_geometry(two) != pool_geometry(one)
    assert pool_geometry(two, pp_size=2) == pool_geometry(one, pp_size=2)
    assert pool_geometry(two, pp_size=2) != pool_geometry(host_pool(layers=2, heads=1), pp_size=2)
    fake = {"tcp": "127.0.0.1:1", "unix": "unix:///nonexistent/kv.sock"}  # never called
    stages = [backend(fake, "pp", pool, pp_rank=r, pp_size=2) for r, pool in enumerate([two, one])]
    assert stages[0].identity == stages[1].identity
    for st, pool in zip(stages, [two, one]):
        st.register_mem_host_pool_v2(pool, PoolName.SWA)
    assert stages[0]._component("p", PoolName.SWA) == stages[1]._component("p", PoolName.SWA)


@pytest.mark.parametrize("addr", ["tcp", "unix"])
def test_a_stopped_daemon_costs_one_bounded_call_per_batch(server, addr):
    """With the daemon stopped (SIGSTOP), one batch_set_v1 returns within about
    timeout_s (not a timeout per page), then calls are paused: the next batch, lookups
    and loads return at once; once the daemon answers again the backend resumes. A
    backend whose first call meets the stopped daemon (its shared-memory attach gets no
    hello) is bounded too."""
    timeout_s, n = 1.0, 24
    namespace = ns()
    keys = page_keys(list(range(900, 900 + n * PAGE)))
    offsets = [i * PAGE for i in range(n)]
    pool = host_pool()
    fill(pool, offsets, 9)
    st = backend(server, namespace, pool, addr=addr, timeout_s=timeout_s)
    assert st.batch_set_v1(keys[:1], indices(offsets[:1])) == [True]  # connected (and attached)
    fresh = backend(server, namespace, host_pool(), addr=addr, timeout_s=timeout_s)
    times = {}

    def timed(name, call):
        t0 = time.monotonic()
        times[name] = (call(), time.monotonic() - t0)

    freeze(server["pid"])
    try:
        calls = [("set", lambda: st.batch_set_v1(keys, indices(offsets))),
                 ("set again", lambda: st.batch_set_v1(keys, indices(offsets))),
                 ("exists", lambda: st.batch_exists(keys)),
                 ("get", lambda: st.batch_get_v1(keys, indices(offsets))),
                 ("fresh exists", lambda: fresh.batch_exists(keys)),
                 ("fresh set", lambda: fresh.batch_set_v1(keys, indices(offsets)))]
        for name, call in calls:
            # A thread: a hang fails the test instead of blocking the suite.
            th = threading.Thread(target=timed, args=(name, call), daemon=True)
            th.start()
            th.join(60)
            assert not th.is_alive(), f"{name} still blocked after 60 s (timeout_s={timeout_s})"
    finally:
        os.kill(server["pid"], signal.SIGCONT)
    assert times["set"][0] == [False] * n
    assert times["set"][1] < timeout_s + 2.5, times  # was ~0.6 x timeout_s per page
    assert times["set again"] == ([False] * n, times["set again"][1]) and times["set again"][1] < 0.5, times
    assert times["exists"][0] == 0 and times["exists"][1] < 0.5, times
    assert times["get"][0] == [False] * n and times["get"][1] < 0.5, times
    assert times["fresh exists"][0] == 0 and times["fresh exists"][1] < timeout_s + 2.5, times
    assert times["fresh set"][0] == [False] * n and times["fresh set"][1] < 0.5, times
    stats = st.get_stats()
    assert stats["set_dropped"] >= 2 * n - 1 and stats["paused_skips"] >= 2 * n, stats
    # The daemon answers again: after the pause (2 s) the same backends store and find.
    deadline = time.monotonic() + 30
    while st.batch_set_v1(keys, indices(offsets)) != [True] * n:
        assert time.monotonic() < deadline, st.get_stats()
        time.sleep(0.5)
    while fresh.batch_exists(keys) != n:
        assert time.monotonic() < deadline, fresh.get_stats()
        time.sleep(0.5)


# -- v2: several host pools (SGLang's hybrid-model API) --------------------------------

def hybrid(server, namespace, swa_heads=2, swa_layers=LAYERS, **extra):
    """A backend over a KV pool and an SWA pool (SGLang's real host pool class, another
    page layout), registered as SGLang's hybrid cache controller does."""
    kv, swa = host_pool(), host_pool(heads=swa_heads, layers=swa_layers)
    st = backend(server, namespace, kv, **extra)
    st.register_mem_host_pool_v2(kv, PoolName.KV)
    st.register_mem_host_pool_v2(swa, PoolName.SWA)
    return st, kv, swa


def test_v2_pools_are_stored_and_loaded_byte_exact_and_share_kv_pages_with_v1(server):
    namespace = ns()
    keys = page_keys()
    offsets = [0, 4, 8, 12, 16]
    st, kv, swa = hybrid(server, namespace)
    fill(kv, offsets, 3)
    fill(swa, offsets, 4)
    res = st.batch_set_v2([PoolTransfer(PoolName.KV, host_indices=indices(offsets), keys=keys),
                           PoolTransfer(PoolName.SWA, host_indices=indices(offsets), keys=keys)])
    assert res == {PoolName.KV: [True] * 5, PoolName.SWA: [True] * 5}

    st2, kv2, swa2 = hybrid(server, namespace)
    hit = st2.batch_exists_v2(keys, [PoolTransfer(PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)])
    assert isinstance(hit, PoolTransferResult)
    assert (hit.kv_hit_pages, hit.extra_pool_hit_pages) == (5, {PoolName.KV: 5, PoolName.SWA: 5})
    dst = [20, 28, 36, 44, 52]
    got = st2.batch_get_v2([PoolTransfer(PoolName.KV, host_indices=indices(dst), keys=keys),
                            PoolTransfer(PoolName.SWA, host_indices=indices(dst), keys=keys)])
    assert got == {PoolName.KV: [True] * 5, PoolName.SWA: [True] * 5}
    assert [page_bytes(kv2, o) for o in dst] == [page_bytes(kv, o) for o in offsets]
    assert [page_bytes(swa2, o) for o in dst] == [page_bytes(swa, o) for o in offsets]
    # The KV pool's pages are v1's pages: a v1 reader loads them.
    pool = host_pool()
    st3 = backend(server, namespace, pool)
    assert st3.batch_get_v1(keys, indices(dst)) == [True] * 5
    assert [page_bytes(pool, o) for o in dst] == [page_bytes(kv, o) for o in offsets]
    # Mismatched indices are a per-page failure, not an exception.
    assert st2.batch_get_v2([PoolTransfer(PoolName.SWA, host_indices=indices(dst[:2]), keys=keys)]) == {
        PoolName.SWA: [False] * 5}


def test_v2_hit_policies_cut_the_prefix_per_pool(server):
    namespace = ns()
    keys = page_keys()
    offsets = [0, 4, 8, 12, 16]
    st, kv, swa = hybrid(server, namespace)
    fill(kv, offsets, 5)
    fill(swa, offsets, 6)
    assert st.batch_set_v1(keys, indices(offsets)) == [True] * 5
    # SWA state only for the third page (index 2): a window of one page ending there.
    assert st.batch_set_v2([PoolTransfer(PoolName.SWA, host_indices=indices(offsets[2:3]), keys=keys[2:3])]) == {
        PoolName.SWA: [True]}
    trailing = st.batch_exists_v2(keys, [PoolTransfer(PoolName.SWA, keys=keys[:1],
                                                      hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert (trailing.kv_hit_pages, trailing.restorable_prefix_pages) == (3, [3])
    assert trailing.extra_pool_hit_pages == {PoolName.KV: 5, PoolName.SWA: 3}
    # Every page needed: the first one is missing, so nothing is usable.
    every = st.batch_exists_v2(keys, [PoolTransfer(PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)])
    assert (every.kv_hit_pages, every.restorable_prefix_pages) == (0, [])
    # Without extra pools v2 answers as batch_exists.
    assert st.batch_exists_v2(keys).kv_hit_pages == 5
    with pytest.raises(ValueError, match="Unsupported pool hit policy"):
        st.batch_exists_v2(keys, [PoolTransfer(PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.BLOCK_GROUPS)])


def test_v2_pool_of_another_page_layout_is_a_miss(server):
    namespace = ns()
    keys = page_keys()
    offsets = [0, 4, 8, 12, 16]
    st, kv, swa = hybrid(server, namespace, swa_heads=2)
    fill(swa, offsets, 7)
    assert st.batch_set_v1(keys, indices(offsets)) == [True] * 5
    st.batch_set_v2([PoolTransfer(PoolName.SWA, host_indices=indices(offsets), keys=keys)])
    # Another engine whose SWA pool has another page layout (4 heads, not 2).
    st2, _, swa2 = hybrid(server, namespace, swa_heads=4)
    hit = st2.batch_exists_v2(keys, [PoolTransfer(PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)])
    assert hit.kv_hit_pages == 0 and PoolName.SWA not in hit.extra_pool_hit_pages
    got = st2.batch_get_v2([PoolTransfer(PoolName.SWA, host_indices=indices(offsets), keys=keys)])
    assert got == {PoolName.SWA: [False] * 5}
    assert not swa2.get_data_page(0, flat=True).any(), "nothing loaded"


def test_v2_pool_of_another_geometry_with_the_same_page_bytes_is_a_miss(server):
    """SWA pools of 1 layer x 4 heads and 2 layers x 2 heads (the same page bytes) under
    one model name and namespace: the KV pages are shared, the SWA pages never load."""
    namespace = ns()
    keys = page_keys()
    offsets = [0, 4, 8, 12, 16]
    st, kv, swa = hybrid(server, namespace, swa_heads=4, swa_layers=1)
    fill(kv, offsets, 8)
    fill(swa, offsets, 9)
    assert st.batch_set_v2([PoolTransfer(PoolName.KV, host_indices=indices(offsets), keys=keys),
                            PoolTransfer(PoolName.SWA, host_indices=indices(offsets), keys=keys)]) == {
        PoolName.KV: [True] * 5, PoolName.SWA: [True] * 5}
    st2, kv2, swa2 = hybrid(server, namespace, swa_heads=2, swa_layers=2)
    assert st2.batch_exists(keys) == 5  # the KV pool's geometry is the same
    hit = st2.batch_exists_v2(keys, [PoolTransfer(PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)])
    assert hit.kv_hit_pages == 0 and PoolName.SWA not in hit.extra_pool_hit_pages
    got = st2.batch_get_v2([PoolTransfer(PoolName.SWA, host_indices=indices(offsets), keys=keys)])
    assert got == {PoolName.SWA: [False] * 5}
    assert not swa2.kv_buffer.any(), "nothing loaded"
    # The same SWA geometry loads.
    st3, _, swa3 = hybrid(server, namespace, swa_heads=4, swa_layers=1)
    got = st3.batch_get_v2([PoolTransfer(PoolName.SWA, host_indices=indices(offsets), keys=keys)])
    assert got == {PoolName.SWA: [True] * 5}
    assert [page_bytes(swa3, o) for o in offsets] == [page_bytes(swa, o) for o in offsets]


def test_models_served_under_one_name_are_told_apart_by_their_weights(server, monkeypatch):
    """Black-box finding: SGLang hands a backend ``--served-model-name``; two fine-tunes
    of one base served as "chat" had one identity and loaded each other's pages. The
    identity takes the model path and revision the server was started with."""
    from types import SimpleNamespace

    import sglang.srt.runtime_context as rc

    namespace = ns()
    started = {"args": SimpleNamespace(model_path="/models/finetune-a", revision=None)}
    monkeypatch.setattr(rc, "get_server_args", lambda: started["args"])
    pool = host_pool()
    a = backend(server, namespace, pool)
    assert a.identity.model == "/models/finetune-a"
    started["args"] = SimpleNamespace(model_path="/models/finetune-b", revision="v2")
    b = backend(server, namespace, host_pool())
    assert b.identity.model == "/models/finetune-b" and b.identity.revision == "v2"
    assert a.identity.digest() != b.identity.digest()
    # Clearing is not done, and says so (SGLang then reports the clear as failed).
    with pytest.raises(NotImplementedError, match="revision"):
        a.clear()
