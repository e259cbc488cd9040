"""``strata_kv.vllm.StrataConnector`` against the installed vLLM (issue 15).

Real objects throughout, CPU only, nothing downloaded: a ``VllmConfig`` built from a
tiny local ``config.json``, vLLM's own v1 ``Scheduler`` (which loads the connector from
``kv_connector_module_path`` exactly as ``vllm serve`` does), real ``Request`` objects,
and a worker-side connector registered on CPU KV-cache tensors in vLLM's per-layer
``[B, H, N, C]`` layout. The model's forward pass is the one stand-in: it writes KV
values derived from the tokens into the scheduled blocks.

A missing vllm is an import error here: the test fails, it is never skipped.
"""

import hashlib
import json
import os
import signal
import time
import uuid

import grpc
import pytest
import torch
from vllm.config import (
    LoRAConfig,
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole, SupportsHMA
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from conftest import freeze, strata_serve
from strata_kv import KvClient, KvError
from strata_kv.vllm import BlockTransfer, StrataConnector, StrataConnectorMetadata

BLOCK = 16
NUM_BLOCKS = 64
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
KV_HEADS, HEAD_DIM = 2, 16
PROMPT = list(range(100, 100 + 3 * BLOCK + 5))  # three full blocks and a partial one
FULL_BLOCKS = len(PROMPT) // BLOCK

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": KV_HEADS,
    "num_hidden_layers": len(LAYERS), "vocab_size": 1000, "max_position_embeddings": 2048,
    "rope_theta": 10000.0, "torch_dtype": "float32", "rms_norm_eps": 1e-5,
}


def model_dir(tmp_path_factory, name, **overrides):
    d = tmp_path_factory.mktemp(name)
    (d / "config.json").write_text(json.dumps({**LLAMA, **overrides}))
    return str(d)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = model_dir(tmp_path_factory, "tiny-llama")
    scaled = model_dir(tmp_path_factory, "tiny-llama-scaled",
                       rope_scaling={"rope_type": "linear", "factor": 2.0})
    return {"base": base, "rope_scaled": scaled}


def engine_config(model, server, namespace, revision=None, failure_policy="recompute", step_tokens=1024, lora=False,
                  layerwise=False, shm=None, **more):
    mc = ModelConfig(model=model, skip_tokenizer_init=True, dtype="float32", max_model_len=1024)
    extra = {"strata_addr": server["unix"], "namespace": namespace, **more}
    if layerwise:
        extra["layerwise"] = True
    if shm is not None:
        extra["shm"] = shm
    if revision is not None:
        extra["revision"] = revision
    kt = KVTransferConfig(kv_connector="StrataConnector", kv_connector_module_path="strata_kv.vllm",
                          kv_role="kv_both", kv_connector_extra_config=extra,
                          kv_load_failure_policy=failure_policy)
    vc = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BLOCK), kv_transfer_config=kt,
                    scheduler_config=SchedulerConfig(max_model_len=1024, is_encoder_decoder=False,
                                                     max_num_batched_tokens=step_tokens, max_num_seqs=8,
                                                     enable_chunked_prefill=True),
                    device_config=DeviceConfig("cpu"))
    vc.cache_config.num_gpu_blocks = NUM_BLOCKS
    if lora:
        vc.lora_config = LoRAConfig(max_loras=2, max_lora_rank=8)
    return vc


class Engine:
    """vLLM's scheduler plus one worker's connector and CPU KV caches."""

    def __init__(self, vc, kv_heads=KV_HEADS):
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=kv_heads, head_size=HEAD_DIM, dtype=torch.float32)
        self.kv_cache_config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                                             kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])
        self.scheduler = Scheduler(vllm_config=vc, kv_cache_config=self.kv_cache_config,
                                   structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK)
        assert isinstance(self.scheduler.connector, StrataConnector), "vLLM loaded our connector"
        self.worker = StrataConnector(vc, KVConnectorRole.WORKER, self.kv_cache_config)
        # vLLM's standardized per-layer view: [blocks, heads, tokens per block, K|V].
        self.caches = {n: torch.zeros(NUM_BLOCKS, kv_heads, BLOCK, 2 * HEAD_DIM) for n in LAYERS}
        self.worker.register_kv_caches(self.caches)

    def step(self, compute=True, on_layer=None):
        """One engine step: schedule, run the connector's worker hooks around a forward
        pass that writes token-derived KV, feed the connector's output back. The forward
        pass drives the connector as vLLM's attention layers do: per layer, wait for its
        KV (``on_layer(name)`` runs then), compute it, hand it over for saving."""
        out, meta = self._forward_pass(compute, on_layer)
        assert isinstance(meta, StrataConnectorMetadata)
        recving = self._finished_loads()
        errors = self.worker.get_block_ids_with_load_errors()
        # As vLLM's model runner: the worker's measurements ride along to the scheduler.
        self._feed_back(out, KVConnectorOutput(finished_recving=recving or None, invalid_block_ids=errors,
                                               kv_connector_stats=self.worker.get_kv_connector_stats()))
        return out, meta, recving, errors

    def _forward_pass(self, compute, on_layer):
        """Schedules, then runs the worker's hooks around a forward pass (see ``step``)
        until every layer is saved. Returns the scheduler output and its metadata."""
        out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        started = [(n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs]
        cached = out.scheduled_cached_reqs
        started += list(zip(cached.req_ids, cached.num_computed_tokens))
        for li, name in enumerate(LAYERS):
            self.worker.wait_for_layer_load(name)
            if on_layer is not None:
                on_layer(name)
            if compute:
                for req_id, computed in started:
                    req = self.scheduler.requests[req_id]
                    n = computed + out.num_scheduled_tokens[req_id]
                    self.forward(req.all_token_ids[:n], self.layer_blocks(req_id, name), start=computed, layers=[li])
            self.worker.save_kv_layer(name, self.caches[name], None)
        self.worker.wait_for_save()
        self.worker.flush(timeout=30)
        return out, meta

    def _feed_back(self, out, kv_output):
        """Ends the step: the model runner's output, with the connector's, to the scheduler."""
        self.worker.clear_connector_metadata()
        # A request whose prompt is done samples one token; a prefill chunk samples none.
        ran = list(out.num_scheduled_tokens)
        sampled = [[7] if self.scheduler.requests[r].num_computed_tokens >= self.scheduler.requests[r].num_prompt_tokens
                   else [] for r in ran]
        mro = ModelRunnerOutput(req_ids=ran, req_id_to_index={r: i for i, r in enumerate(ran)},
                                sampled_token_ids=sampled)
        mro.kv_connector_output = kv_output
        self.scheduler.update_from_output(out, mro)

    def layer_blocks(self, req_id, name):
        """The request's block ids (one group: every layer shares them)."""
        return self.scheduler.kv_cache_manager.get_blocks(req_id).get_block_ids()[0]

    def _finished_loads(self):
        done = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, r = self.worker.get_finished(set())
            done |= r or set()
            if self.worker.idle():
                _, r = self.worker.get_finished(set())
                return done | (r or set())
            time.sleep(0.01)
        raise AssertionError("loads did not finish in 30 s")

    def forward(self, tokens, block_ids, start=0, layers=None):
        for pos in range(start - start % BLOCK, len(tokens), BLOCK):
            chunk = tokens[pos : pos + BLOCK]
            b = block_ids[pos // BLOCK]
            for li, name in enumerate(LAYERS):
                if layers is None or li in layers:
                    self.caches[name][b, :, : len(chunk)] = kv_of(chunk, pos // BLOCK, li, self.caches[name].shape[1])

    def block_bytes(self, block_id, layers=LAYERS):
        return b"".join(self.caches[n][block_id].numpy().tobytes() for n in layers)


def kv_of(tokens, block_index, layer, heads):
    seed = int.from_bytes(hashlib.sha256(json.dumps([tokens, block_index, layer]).encode()).digest()[:8], "little")
    g = torch.Generator().manual_seed(seed)
    return torch.randn(heads, len(tokens), 2 * HEAD_DIM, generator=g)


def request(rid, tokens=PROMPT, lora=None, cache_salt=None):
    return Request(rid, list(tokens), SamplingParams(max_tokens=4), None, lora_request=lora, cache_salt=cache_salt)


def ns():
    return f"vllm-test-{uuid.uuid4().hex[:8]}"


def run_writer(vc):
    """Engine A computes PROMPT once; its connector stores the full blocks."""
    a = Engine(vc)
    a.scheduler.add_request(request("a-1"))
    out, meta, _, _ = a.step()
    assert [len(t.blocks) for t in meta.saves] == [FULL_BLOCKS], "every full prompt block is saved once"
    assert meta.loads == []
    assert a.worker.stats["saved_blocks"] == FULL_BLOCKS
    blocks = out.scheduled_new_reqs[0].block_ids[0][:FULL_BLOCKS]
    return a, [a.block_bytes(b) for b in blocks]


def test_connector_class_is_the_real_base():
    assert issubclass(StrataConnector, KVConnectorBase_V1)


@pytest.mark.parametrize("shm", [True, False], ids=["shm-arena", "socket"])
def test_saved_blocks_are_matched_and_loaded_byte_exact_by_another_engine(server, models, shm):
    namespace = ns()
    _, written = run_writer(engine_config(models["base"], server, namespace))

    b = Engine(engine_config(models["base"], server, namespace, shm=shm))
    b.scheduler.add_request(request("b-1"))
    out, meta, recving, errors = b.step(compute=False)
    # The scheduler took load_async=True: the request waits for its KV, nothing runs.
    assert out.scheduled_new_reqs == []
    assert b.scheduler.requests["b-1"].status in (RequestStatus.WAITING_FOR_REMOTE_KVS, RequestStatus.WAITING)
    assert [len(t.blocks) for t in meta.loads] == [FULL_BLOCKS]
    assert recving == {"b-1"} and errors == set()
    loaded_ids = [bid for _, bid in meta.loads[0].blocks]
    assert [b.block_bytes(i) for i in loaded_ids] == written, "loaded byte-exact"
    assert b.worker.stats["loaded_blocks"] == FULL_BLOCKS
    # Same host: read in place in the daemon's arena, or through the socket when off.
    assert b.worker.stats["shm_reads"] == (FULL_BLOCKS if shm else 0)

    # Next step: the request runs with the loaded prefix counted as computed.
    out2, meta2, _, _ = b.step()
    [new] = out2.scheduled_new_reqs
    assert new.num_computed_tokens == FULL_BLOCKS * BLOCK
    assert out2.num_scheduled_tokens["b-1"] == len(PROMPT) - FULL_BLOCKS * BLOCK
    assert new.block_ids[0][:FULL_BLOCKS] == loaded_ids
    assert meta2.saves == [], "blocks that came from Strata are not stored again"


def test_gpu_tier_blocks_load_by_device_handle_byte_exact(gpu_server, models):
    """The daemon's GPU tier holds the blocks (emulated device): the worker, whose KV
    cache is on the same (host) device, loads them by device handle, read in place in
    the device memory the daemon sent, byte-exact, each lease released."""
    namespace = ns()
    _, written = run_writer(engine_config(models["base"], gpu_server, namespace))
    b = Engine(engine_config(models["base"], gpu_server, namespace))
    assert b.worker.client.device_memory == "emulated" and b.worker._device_reads
    b.scheduler.add_request(request("b-1"))
    _, meta, recving, errors = b.step(compute=False)
    assert recving == {"b-1"} and errors == set()
    loaded_ids = [bid for _, bid in meta.loads[0].blocks]
    assert [b.block_bytes(i) for i in loaded_ids] == written, "loaded byte-exact"
    assert b.worker.stats["device_reads"] == FULL_BLOCKS
    assert b.worker.stats["shm_reads"] == 0


@pytest.mark.parametrize("change", ["revision", "rope_scaling", "lora", "cache_salt"])
def test_changed_model_identity_is_a_miss_never_a_load(server, models, change):
    namespace = ns()
    run_writer(engine_config(models["base"], server, namespace, revision="rev-1"))

    model = models["rope_scaled"] if change == "rope_scaling" else models["base"]
    revision = "rev-2" if change == "revision" else "rev-1"
    c = Engine(engine_config(model, server, namespace, revision=revision))
    lora = LoRARequest("adapter-a", 1, "/adapters/a") if change == "lora" else None
    salt = "tenant-b" if change == "cache_salt" else None
    req = request("c-1", lora=lora, cache_salt=salt)
    # LoRA needs a LoRA-enabled engine to be scheduled; the scheduler's query to the
    # connector is the same call either way.
    matched, load_async = c.scheduler.connector.get_num_new_matched_tokens(req, 0)
    assert (matched, load_async) == (0, False)
    if change != "lora":
        c.scheduler.add_request(req)
        out, meta, recving, errors = c.step(compute=False)
        assert meta.loads == [] and not recving and not errors
        [new] = out.scheduled_new_reqs
        assert new.num_computed_tokens == 0, "recomputed from scratch"
    assert c.worker.stats["loaded_blocks"] == 0
    assert all(not t.any() for t in c.caches.values()), "nothing was copied into the cache"


def test_prompt_embeddings_are_part_of_the_key(server, models):
    """Black-box finding: a prompt given partly as embeddings (vLLM's mixed mode: the
    embedded positions hold a placeholder id) was keyed by its ids alone, so a request
    with the same ids and other embeddings loaded another request's KV. Embeddings now
    enter the keys: other embeddings miss, the same ones hit."""
    namespace = ns()
    mask = [not (4 <= i < 36) for i in range(len(PROMPT))]
    ids = [t if m else 0 for t, m in zip(PROMPT, mask)]

    def embedded(rid, seed):
        emb = torch.randn(len(ids), 64, generator=torch.Generator().manual_seed(seed))
        return Request(rid, list(ids), SamplingParams(max_tokens=4), None, prompt_embeds=emb,
                       prompt_is_token_ids=list(mask))

    a = Engine(engine_config(models["base"], server, namespace))
    a.scheduler.add_request(embedded("a-1", 1))
    a.step()
    assert a.worker.stats["saved_blocks"] == FULL_BLOCKS
    b = Engine(engine_config(models["base"], server, namespace))
    assert b.scheduler.connector.get_num_new_matched_tokens(embedded("b-1", 2), 0) == (0, False)
    assert b.scheduler.connector.get_num_new_matched_tokens(request("b-2", ids), 0) == (0, False)
    assert b.scheduler.connector.get_num_new_matched_tokens(embedded("b-3", 1), 0)[0] == FULL_BLOCKS * BLOCK


def test_same_identity_with_same_lora_and_salt_hits(server, models):
    namespace = ns()
    vc = engine_config(models["base"], server, namespace)
    a = Engine(vc)
    lora = LoRARequest("adapter-a", 1, "/adapters/a")
    a_req = request("a-1", lora=lora, cache_salt="s1")
    a.scheduler.connector.get_num_new_matched_tokens(a_req, 0)
    # Store A's blocks through the worker directly (LoRA scheduling needs a LoRA engine).
    st = a.scheduler.connector._state(a_req)
    blocks = list(range(1, FULL_BLOCKS + 1))
    a.forward(PROMPT[: FULL_BLOCKS * BLOCK], blocks)
    a.worker.bind_connector_metadata(
        StrataConnectorMetadata(saves=[BlockTransfer("a-1", list(zip(st.hashes, blocks)))]))
    a.worker.wait_for_save()
    a.worker.flush(timeout=30)
    b = Engine(engine_config(models["base"], server, namespace))
    same = b.scheduler.connector.get_num_new_matched_tokens(request("b-1", lora=lora, cache_salt="s1"), 0)
    assert same == (FULL_BLOCKS * BLOCK, True)
    other_salt = b.scheduler.connector.get_num_new_matched_tokens(request("b-2", lora=lora, cache_salt="s2"), 0)
    assert other_salt == (0, False)


def test_local_prefix_hit_loads_only_the_rest(server, models):
    namespace = ns()
    run_writer(engine_config(models["base"], server, namespace))
    b = Engine(engine_config(models["base"], server, namespace))
    # One block already computed locally: only the remaining stored blocks load.
    assert b.scheduler.connector.get_num_new_matched_tokens(request("b-1"), BLOCK) == ((FULL_BLOCKS - 1) * BLOCK, True)
    assert b.scheduler.connector.get_num_new_matched_tokens(request("b-2"), FULL_BLOCKS * BLOCK) == (0, False)


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_block_of_another_layout_is_a_load_error_not_a_load(server, models, policy):
    namespace = ns()
    run_writer(engine_config(models["base"], server, namespace))
    # Same identity, but this worker's cache has another shape (say, another attention
    # backend's head packing): the stored values do not fit and must not be copied.
    d = Engine(engine_config(models["base"], server, namespace, failure_policy=policy), kv_heads=KV_HEADS * 2)
    d.scheduler.add_request(request("d-1"))
    out, meta, recving, errors = d.step(compute=False)
    loaded_ids = {bid for _, bid in meta.loads[0].blocks}
    assert recving == {"d-1"}
    assert errors == loaded_ids, "every block reported as a load error"
    assert all(not t.any() for t in d.caches.values())
    if policy == "recompute":
        # vLLM turns the errors into a recompute: the request runs from token 0 (the
        # scheduler picks it up within a few steps of the failed load).
        for _ in range(4):
            out2, _, _, _ = d.step()
            if out2.scheduled_new_reqs:
                break
        [new] = out2.scheduled_new_reqs
        assert new.req_id == "d-1" and new.num_computed_tokens == 0
    else:
        # vLLM's default policy fails the request; it never runs on the bad blocks.
        out2, _, _, _ = d.step()
        assert "d-1" not in d.scheduler.requests and out2.scheduled_new_reqs == []


def test_prefix_needs_every_ranks_share(server, models):
    namespace = ns()
    vc = engine_config(models["base"], server, namespace)
    run_writer(vc)  # TP rank 0 only
    b = Engine(engine_config(models["base"], server, namespace))
    conn = b.scheduler.connector
    assert conn._stored_prefix(conn._state(request("b-1")).hashes) == FULL_BLOCKS
    # Had the engine two TP ranks, rank 1's shares are missing: no block is usable.
    conn.tp_size = 2
    assert conn._stored_prefix(conn._state(request("b-1")).hashes) == 0


def refuse(*_args, **_kwargs):
    raise KvError(grpc.StatusCode.FAILED_PRECONDITION, "namespace bound to another model identity")


def test_identity_refused_by_the_service_is_a_miss_and_a_load_error(server, models):
    namespace = ns()
    run_writer(engine_config(models["base"], server, namespace))
    b = Engine(engine_config(models["base"], server, namespace))
    # What the service answers once the namespace is bound to another identity.
    sched = b.scheduler.connector
    sched.client.match_prefix = refuse
    sched.client.batch_exists = refuse
    assert sched.get_num_new_matched_tokens(request("b-1"), 0) == (0, False)
    assert sched.stats["identity_refusals"] == 1
    # A refusal between lookup and load: the blocks are load errors, never filled.
    sched.client = KvClient(server["unix"], namespace=namespace, identity=sched.identity)
    b.worker.client.batched_get = refuse
    b.worker.client.get_views = refuse  # the shared-memory path's Gets
    b.scheduler.add_request(request("b-2"))
    _, meta, recving, errors = b.step(compute=False)
    assert recving == {"b-2"} and errors == {bid for _, bid in meta.loads[0].blocks}
    assert all(not t.any() for t in b.caches.values())


def test_chunked_prefill_saves_each_block_once_as_it_completes(server, models):
    namespace = ns()
    # 2 blocks per step: the prompt's prefill takes two steps, the second through vLLM's
    # cached-request path.
    a = Engine(engine_config(models["base"], server, namespace, step_tokens=2 * BLOCK))
    a.scheduler.add_request(request("a-1"))
    out1, meta1, _, _ = a.step()
    assert out1.num_scheduled_tokens == {"a-1": 2 * BLOCK}
    assert [len(t.blocks) for t in meta1.saves] == [2]
    out2, meta2, _, _ = a.step()
    assert out2.scheduled_cached_reqs.req_ids == ["a-1"]
    assert [len(t.blocks) for t in meta2.saves] == [FULL_BLOCKS - 2]
    blocks = a.scheduler.kv_cache_manager.get_blocks("a-1").get_block_ids()[0][:FULL_BLOCKS]
    written = [a.block_bytes(bid) for bid in blocks]

    b = Engine(engine_config(models["base"], server, namespace))
    b.scheduler.add_request(request("b-1"))
    _, meta, recving, errors = b.step(compute=False)
    assert recving == {"b-1"} and errors == set()
    assert [b.block_bytes(bid) for _, bid in meta.loads[0].blocks] == written


def test_lora_request_in_a_lora_engine_misses_blocks_of_the_base_model(server, models):
    namespace = ns()
    run_writer(engine_config(models["base"], server, namespace))
    c = Engine(engine_config(models["base"], server, namespace, lora=True))
    c.scheduler.add_request(request("c-1", lora=LoRARequest("adapter-a", 1, "/adapters/a")))
    out, meta, recving, errors = c.step(compute=False)
    assert meta.loads == [] and not recving and not errors
    [new] = out.scheduled_new_reqs
    assert new.num_computed_tokens == 0 and new.lora_request.lora_name == "adapter-a"
    # The same engine, the base model (no adapter): a hit.
    c.scheduler.add_request(request("c-2"))
    _, meta2, recving2, _ = c.step(compute=False)
    assert [len(t.blocks) for t in meta2.loads] == [FULL_BLOCKS] and recving2 == {"c-2"}


def test_roles_producer_only_stores_consumer_only_loads(server, models):
    namespace = ns()
    producer_cfg = engine_config(models["base"], server, namespace)
    producer_cfg.kv_transfer_config.kv_role = "kv_producer"
    run_writer(producer_cfg)
    p = Engine(producer_cfg)
    assert p.scheduler.connector.get_num_new_matched_tokens(request("p-1"), 0) == (0, False)

    consumer_cfg = engine_config(models["base"], server, namespace)
    consumer_cfg.kv_transfer_config.kv_role = "kv_consumer"
    c = Engine(consumer_cfg)
    # A prompt Strata does not hold: computed here, and a consumer does not store it.
    c.scheduler.add_request(request("c-1", tokens=list(range(900, 900 + 3 * BLOCK))))
    out, meta, _, _ = c.step()
    assert out.num_scheduled_tokens == {"c-1": 3 * BLOCK}
    assert meta.saves == [] and c.worker.stats["saved_blocks"] == 0
    assert c.scheduler.connector.get_num_new_matched_tokens(request("c-2"), 0) == (FULL_BLOCKS * BLOCK, True)
    assert not c.scheduler.connector.requires_kv_delivery


# -- load or recompute (issue 15, item 4) ---------------------------------------------------

from strata_kv.vllm import LoadClock, PrefillClock, StrataKVConnectorStats, blocks_worth_loading  # noqa: E402


def test_blocks_worth_loading_takes_the_prefix_with_the_largest_saving():
    assert blocks_worth_loading([100.0, 100.0, 100.0], None) == 3, "nothing measured: load"
    assert blocks_worth_loading([100.0, 100.0, 100.0], 500.0) == 3
    assert blocks_worth_loading([100.0, 100.0, 100.0], 50.0) == 0, "recomputing is faster"
    # Two memory blocks then disk blocks slower than recomputing: stop after the fast ones.
    assert blocks_worth_loading([10.0, 10.0, 900.0, 900.0], 300.0) == 2
    # A slow block between fast ones is worth loading when what follows pays for it.
    assert blocks_worth_loading([10.0, 400.0, 10.0, 10.0], 300.0) == 4
    assert blocks_worth_loading([], 1.0) == 0


def test_prefill_clock_averages_prefill_dominated_steps_only():
    c = PrefillClock(min_tokens=256)
    c.step(0.0, 1000)
    assert c.us_per_token is None
    c.step(0.010, 8)  # the 1000-token step took 10 ms: 10 us per token
    assert c.us_per_token == pytest.approx(10.0)
    c.step(0.500, 1000)  # the 8-token (decode) step is not a prefill measurement
    assert c.us_per_token == pytest.approx(10.0)
    c.step(0.530, 0)  # 30 us per token, averaged in
    assert c.us_per_token == pytest.approx(0.2 * 30 + 0.8 * 10)
    assert PrefillClock(fixed_us_per_token=3.0).us_per_token == 3.0


def test_a_prefix_that_recomputes_faster_than_it_loads_is_recomputed(server, models):
    namespace = ns()
    run_writer(engine_config(models["base"], server, namespace))
    c = Engine(engine_config(models["base"], server, namespace))
    conn = c.scheduler.connector
    # This engine prefills absurdly fast: every stored block loads slower than it computes.
    conn.prefill = PrefillClock(fixed_us_per_token=1e-6)
    assert conn.get_num_new_matched_tokens(request("r-fast"), 0) == (0, False)
    assert conn.stats["recompute_chosen_blocks"] == FULL_BLOCKS
    # A slow prefill (1 s per token): loading wins for every block.
    conn.prefill = PrefillClock(fixed_us_per_token=1e6)
    assert conn.get_num_new_matched_tokens(request("r-slow"), 0) == (FULL_BLOCKS * BLOCK, True)


def test_load_clock_scales_estimates_by_what_loads_measured_and_forgets_slowly():
    c = LoadClock()
    assert c.factor(0.0) == 1.0, "nothing measured: the service's estimate as it is"
    c.planned("r1", 1_000.0)
    c.measured(["r1"], 50_000.0, now=10.0)
    assert c.factor(10.0) == pytest.approx(50.0), "the first load sets the factor"
    c.measured(["r1"], 1.0, now=10.0)
    assert c.factor(10.0) == pytest.approx(50.0), "a load nobody planned (or reported twice) teaches nothing"
    c.planned("r2", 1_000.0)
    c.measured(["r2"], 1_000.0, now=10.0)
    assert c.factor(10.0) == pytest.approx(50.0 ** 0.7), "one accurate load moves it a bounded step back"
    assert c.factor(10.0 + LoadClock.HALF_LIFE_S) == pytest.approx(50.0 ** 0.35), "decays toward 1"
    # A layer-by-layer step's load covers its requests together: their plans summed.
    c = LoadClock()
    c.planned("a", 100.0)
    c.planned("b", 300.0)
    c.measured(["a", "b"], 4_000.0, now=0.0)
    assert c.factor(0.0) == pytest.approx(10.0)
    # Bounded: plans of requests that never loaded do not pile up.
    for i in range(LoadClock.MAX_PLANNED + 10):
        c.planned(f"x{i}", 1.0)
    assert len(c._planned) == LoadClock.MAX_PLANNED


def test_connector_stats_aggregate_ranks_and_reduce_for_vllms_log():
    a, b = StrataKVConnectorStats(), StrataKVConnectorStats()
    a.record(["r1"], 2_000.0)
    b.record(["r1"], 6_000.0)
    assert not a.is_empty() and StrataKVConnectorStats().is_empty()
    merged = StrataConnector.build_kv_connector_stats(a.data).aggregate(b)
    assert merged.reduce() == {"Loads": 2, "Avg load time (ms)": 4.0, "Max load time (ms)": 6.0}


def test_loads_slower_than_estimated_teach_the_scheduler_to_recompute(server, models):
    """The service times its side of a Get only; here the worker's side is slow (a
    loaded host): after one such load measured, the scheduler recomputes prefixes the
    service's own estimate says are worth loading."""
    namespace = ns()
    run_writer(engine_config(models["base"], server, namespace))
    c = Engine(engine_config(models["base"], server, namespace))
    conn = c.scheduler.connector
    # Recomputing a block takes 50 ms: the service's estimate for these 16 KiB blocks
    # (well under a millisecond) says load.
    conn.prefill = PrefillClock(fixed_us_per_token=50_000 / BLOCK)
    fetch = c.worker._fetch_into

    def slow_fetch(keys, fill):
        time.sleep(0.6)  # 200 ms a block on this worker's side
        return fetch(keys, fill)

    c.worker._fetch_into = slow_fetch
    c.scheduler.add_request(request("c-1"))
    _, meta, recving, _ = c.step(compute=False)
    assert [len(t.blocks) for t in meta.loads] == [FULL_BLOCKS], "the first prefix loads on the estimate"
    assert recving == {"c-1"}
    assert conn.load_clock.factor(time.monotonic()) > 100, "the step's output taught the scheduler"
    assert conn.get_num_new_matched_tokens(request("c-2"), 0) == (0, False), "now recomputed"
    assert conn.stats["recompute_chosen_blocks"] == FULL_BLOCKS


# -- layer by layer (issue 15): loads overlap the forward pass, saves leave per layer ----

import struct  # noqa: E402
import threading  # noqa: E402

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.v1.kv_cache_interface import SlidingWindowSpec  # noqa: E402

from strata_kv import layer_key, rank_key  # noqa: E402


def run_layerwise_writer(vc, on_layer=None):
    """Engine A computes PROMPT once, layer by layer; returns it and, per layer, the
    bytes of each full prompt block."""
    a = Engine(vc)
    a.scheduler.add_request(request("a-1"))
    out, meta, _, _ = a.step(on_layer=on_layer)
    assert [len(t.blocks) for t in meta.saves] == [FULL_BLOCKS]
    blocks = out.scheduled_new_reqs[0].block_ids[0][:FULL_BLOCKS]
    assert a.worker.stats["saved_blocks"] == FULL_BLOCKS * len(LAYERS), "one value per layer and block"
    return a, {n: [a.block_bytes(b, [n]) for b in blocks] for n in LAYERS}


def test_layer_key_extends_the_rank_key_with_the_layer():
    h = bytes(range(32))
    assert layer_key(h, 1, 2, 3) == rank_key(h, 1, 2) + b"\x03\x00"
    assert len(layer_key(h, 0, 0, 0)) == 38
    assert layer_key(h, 0, 0, 0) != layer_key(h, 0, 0, 1)
    with pytest.raises(ValueError):
        layer_key(h, 0, 0, 1 << 16)


def test_layerwise_load_runs_in_the_step_of_the_request_byte_exact(server, models):
    namespace = ns()
    a, written = run_layerwise_writer(engine_config(models["base"], server, namespace, layerwise=True))
    hashes = a.scheduler.connector._state(request("a-x")).hashes[:FULL_BLOCKS]
    probe = KvClient(server["unix"], namespace=namespace, identity=a.worker.identity)
    assert all(probe.batch_exists([layer_key(h, 0, 0, li) for h in hashes for li in range(len(LAYERS))]))
    assert not any(probe.batch_exists([rank_key(h, 0, 0) for h in hashes])), "no whole-block values"

    b = Engine(engine_config(models["base"], server, namespace, layerwise=True))
    b.scheduler.add_request(request("b-1"))
    seen = {}

    def on_layer(name):
        # When the forward pass reaches a layer, that layer's blocks are in.
        ids = [bid for _, bid in b.worker._connector_metadata.loads[0].blocks]
        seen[name] = [b.block_bytes(i, [name]) for i in ids]

    out, meta, recving, errors = b.step(on_layer=on_layer)
    # load_async=False: the request runs in this very step, the prefix counted as computed.
    [new] = out.scheduled_new_reqs
    assert new.num_computed_tokens == FULL_BLOCKS * BLOCK
    assert out.num_scheduled_tokens["b-1"] == len(PROMPT) - FULL_BLOCKS * BLOCK
    assert [len(t.blocks) for t in meta.loads] == [FULL_BLOCKS]
    assert errors == set() and not recving, "a synchronous load reports no finished_recving"
    assert seen == written, "each layer loaded byte-exact before its attention ran"
    assert b.worker.stats["loaded_layer_blocks"] == FULL_BLOCKS * len(LAYERS)
    assert b.worker.stats["loaded_blocks"] == FULL_BLOCKS, "a block counts once all its layers are in"
    assert b.worker.stats["shm_reads"] == FULL_BLOCKS * len(LAYERS)
    assert meta.saves == [], "blocks that came from Strata are not stored again"
    # A whole-block engine in the same namespace misses the layer values (other keys).
    c = Engine(engine_config(models["base"], server, namespace))
    assert c.scheduler.connector.get_num_new_matched_tokens(request("c-1"), 0) == (0, False)


def test_layerwise_a_prompt_held_whole_leaves_its_last_block_to_compute(server, models):
    """Black-box finding: with layerwise loads, a prompt of whole blocks all stored (the
    same prompt sent twice) was reported external in full; the step that schedules it
    then had no token to compute and vLLM's scheduler died on its assert. The last block
    is now left to compute, as vLLM's own prefix cache leaves the last token."""
    namespace = ns()
    whole = PROMPT[: FULL_BLOCKS * BLOCK]
    a = Engine(engine_config(models["base"], server, namespace, layerwise=True))
    a.scheduler.add_request(request("a-1", whole))
    a.step()
    assert a.worker.stats["saved_blocks"] == FULL_BLOCKS * len(LAYERS)
    b = Engine(engine_config(models["base"], server, namespace, layerwise=True))
    assert b.scheduler.connector.get_num_new_matched_tokens(request("b-0", whole), 0) == (
        (FULL_BLOCKS - 1) * BLOCK, False)
    b.scheduler.add_request(request("b-1", whole))
    out, meta, _, errors = b.step()
    [new] = out.scheduled_new_reqs
    assert new.num_computed_tokens == (FULL_BLOCKS - 1) * BLOCK
    assert out.num_scheduled_tokens["b-1"] == BLOCK
    assert [len(t.blocks) for t in meta.loads] == [FULL_BLOCKS - 1] and errors == set()


def test_wait_for_layer_load_waits_only_for_its_own_layer(server, models):
    namespace = ns()
    _, written = run_layerwise_writer(engine_config(models["base"], server, namespace, layerwise=True))
    b = Engine(engine_config(models["base"], server, namespace, layerwise=True))
    # Layer 1's fetch is held until layer 0's attention has run.
    layer0_done = threading.Event()
    held = []
    fetch = b.worker.client.get_views  # a batch of values (the shared-memory path)
    assert b.worker.shm

    def gated(keys, namespace=None, **kw):
        layer1 = [k for k in keys if k[-2:] == struct.pack("<H", 1)]
        if layer1:
            held.extend(layer1)
            assert layer0_done.wait(30), "layer 0 never ran"
        return fetch(keys, namespace, **kw)

    b.worker.client.get_views = gated
    b.scheduler.add_request(request("b-1"))
    checked = []

    def on_layer(name):
        ids = [bid for _, bid in b.worker._connector_metadata.loads[0].blocks]
        if name == LAYERS[0]:
            assert [b.block_bytes(i, [name]) for i in ids] == written[name]
            assert not b.worker._layer_ready[LAYERS[1]].is_set(), "layer 1 still loading"
            assert all(not b.caches[LAYERS[1]][i].any() for i in ids), "layer 1 not filled yet"
            layer0_done.set()
        else:
            assert [b.block_bytes(i, [name]) for i in ids] == written[name]
        checked.append(name)

    _, _, _, errors = b.step(on_layer=on_layer)
    assert checked == LAYERS and errors == set()
    assert len(held) == FULL_BLOCKS, "layer 1's fetches were held"


def test_layerwise_save_sends_each_layer_as_soon_as_it_is_written(server, models):
    namespace = ns()
    a = Engine(engine_config(models["base"], server, namespace, layerwise=True))
    hashes = a.scheduler.connector._state(request("x")).hashes
    probe = KvClient(server["unix"], namespace=namespace, identity=a.worker.identity)
    stored = {}

    def on_layer(name):
        if name == LAYERS[1]:
            a.worker.flush(timeout=30)  # layer 0 was handed over; layer 1 not computed yet
            stored["layer0"] = probe.batch_exists([layer_key(h, 0, 0, 0) for h in hashes[:FULL_BLOCKS]])
            stored["layer1"] = probe.batch_exists([layer_key(h, 0, 0, 1) for h in hashes[:FULL_BLOCKS]])

    a.scheduler.add_request(request("a-1"))
    a.step(on_layer=on_layer)
    assert stored == {"layer0": [True] * FULL_BLOCKS, "layer1": [False] * FULL_BLOCKS}
    assert all(probe.batch_exists([layer_key(h, 0, 0, 1) for h in hashes[:FULL_BLOCKS]]))


def test_layerwise_load_error_is_reported_and_recomputed(server, models):
    namespace = ns()
    run_layerwise_writer(engine_config(models["base"], server, namespace, layerwise=True))
    # Another cache shape: no stored layer value fits, none is copied in.
    d = Engine(engine_config(models["base"], server, namespace, layerwise=True), kv_heads=KV_HEADS * 2)
    d.scheduler.add_request(request("d-1"))
    out, meta, _, errors = d.step(compute=False)
    loaded_ids = {bid for _, bid in meta.loads[0].blocks}
    assert errors == loaded_ids
    assert all(not d.caches[n][i].any() for n in LAYERS for i in loaded_ids)
    # vLLM rolls the request back to the first bad block and computes it again; the
    # connector does not offer the failed blocks to it again.
    assert d.scheduler.requests["d-1"].num_computed_tokens == 0
    assert d.scheduler.connector._reqs["d-1"].load_limit == 0
    out2, meta2, _, _ = d.step()
    assert meta2.loads == []
    assert out2.num_scheduled_tokens.get("d-1") == len(PROMPT)


# -- the hybrid memory allocator (SupportsHMA) -------------------------------------------

WINDOW = 2 * BLOCK
HMA_PROMPT = list(range(300, 300 + 6 * BLOCK + 3))  # six full blocks: more than the window
HMA_FULL = len(HMA_PROMPT) // BLOCK


def full_spec():
    return FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_DIM, dtype=torch.float32)


def swa_spec():
    return SlidingWindowSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_DIM, dtype=torch.float32,
                             sliding_window=WINDOW)


class HybridEngine(Engine):
    """Engine with vLLM's hybrid memory allocator on: layer 0 full attention, layer 1 a
    sliding window, each group its own block table (``group_of``)."""

    def __init__(self, vc):
        self.kv_cache_config = KVCacheConfig(
            num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec([LAYERS[0]], full_spec()), KVCacheGroupSpec([LAYERS[1]], swa_spec())])
        self.group_of = {LAYERS[0]: 0, LAYERS[1]: 1}
        self.scheduler = Scheduler(vllm_config=vc, kv_cache_config=self.kv_cache_config,
                                   structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK)
        assert isinstance(self.scheduler.connector, StrataConnector)
        self.worker = StrataConnector(vc, KVConnectorRole.WORKER, self.kv_cache_config)
        self.caches = {n: torch.zeros(NUM_BLOCKS, KV_HEADS, BLOCK, 2 * HEAD_DIM) for n in LAYERS}
        self.worker.register_kv_caches(self.caches)

    def step(self, compute=True, on_layer=None):
        out, meta = self._forward_pass(compute, on_layer)
        results = self.worker.get_transfer_results(set())
        assert self.worker.get_block_ids_with_load_errors() == set(), "no block-level errors with several groups"
        self._feed_back(out, KVConnectorOutput(finished_recving=results.finished_recving or None,
                                               failed_recving=results.failed_recving))
        return out, meta, results

    def forward(self, tokens, block_ids, start=0, layers=None):
        for pos in range(start - start % BLOCK, len(tokens), BLOCK):
            b = block_ids[pos // BLOCK]
            if b == 0:
                continue  # the null block: the window has moved past it
            chunk = tokens[pos : pos + BLOCK]
            for li, name in enumerate(LAYERS):
                if layers is None or li in layers:
                    self.caches[name][b, :, : len(chunk)] = kv_of(chunk, pos // BLOCK, li, KV_HEADS)

    def layer_blocks(self, req_id, name):
        """The request's block ids in ``name``'s group."""
        return self.scheduler.kv_cache_manager.get_blocks(req_id).get_block_ids()[self.group_of[name]]


@pytest.fixture
def hma_platform(monkeypatch):
    """The platform as a GPU's (or vLLM's CPU platform) declares it: hybrid KV cache
    supported. These tests run on vLLM's unspecified platform (no accelerator, no
    vllm._C), which turns the hybrid memory allocator off whatever the connector."""
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "support_hybrid_kv_cache", classmethod(lambda cls: True))


def hma_config(model, server, namespace, **kw):
    vc = engine_config(model, server, namespace, **kw)
    assert vc.scheduler_config.disable_hybrid_kv_cache_manager is False, "vLLM keeps HMA on for this connector"
    return vc


def expected_kv(index, name):
    chunk = HMA_PROMPT[index * BLOCK : (index + 1) * BLOCK]
    return kv_of(chunk, index, LAYERS.index(name), KV_HEADS)


def test_connector_supports_vllms_hybrid_memory_allocator(server, models, hma_platform):
    # vLLM leaves its hybrid memory allocator on with this connector (it turns it off
    # for a connector without SupportsHMA, as it did for this one before).
    vc = engine_config(models["base"], server, ns())
    assert issubclass(StrataConnector, SupportsHMA)
    assert KVConnectorFactory.supports_hma_config(vc.kv_transfer_config)
    assert vc.scheduler_config.disable_hybrid_kv_cache_manager is False


def test_hybrid_groups_save_and_load_byte_exact_each_layer_in_its_group(server, models, hma_platform):
    space = ns()
    a = HybridEngine(hma_config(models["base"], server, space))
    a.scheduler.add_request(request("a-1", HMA_PROMPT))
    out, meta, _ = a.step()
    assert [len(t.blocks) for t in meta.saves] == [HMA_FULL]
    assert meta.saves[0].group_ids is not None and all(len(g) == 2 for g in meta.saves[0].group_ids)
    assert a.worker.stats["saved_blocks"] == HMA_FULL, "every block saved: both groups held it when computed"

    b = HybridEngine(hma_config(models["base"], server, space))
    b.scheduler.add_request(request("b-1", HMA_PROMPT))
    out, meta, res = b.step()
    assert [len(t.blocks) for t in meta.loads] == [HMA_FULL]
    assert res.finished_recving == {"b-1"} and not res.failed_recving
    assert b.worker.stats["loaded_blocks"] == HMA_FULL
    full_ids, swa_ids = b.layer_blocks("b-1", LAYERS[0]), b.layer_blocks("b-1", LAYERS[1])
    assert [g for g in meta.loads[0].group_ids] == list(zip(full_ids[:HMA_FULL], swa_ids[:HMA_FULL]))
    # Full attention: every block loaded, byte-exact, into its own group's blocks.
    for i in range(HMA_FULL):
        assert torch.equal(b.caches[LAYERS[0]][full_ids[i]], expected_kv(i, LAYERS[0]))
    # The sliding window: the blocks its group holds are loaded byte-exact; the ones it
    # left to the null block (outside the window) were skipped, not written.
    held = [i for i in range(HMA_FULL) if swa_ids[i] != 0]
    assert held and held[-1] == HMA_FULL - 1
    assert len(held) < HMA_FULL, "the window's group holds the null block before the window"
    for i in held:
        assert torch.equal(b.caches[LAYERS[1]][swa_ids[i]], expected_kv(i, LAYERS[1]))
    assert torch.count_nonzero(b.caches[LAYERS[1]][0]) == 0, "nothing written into the null block"
    # A block the window's group no longer holds cannot be saved whole: no value at all.
    assert b.worker._pack((full_ids[0], 0)) is None
    assert b.worker._pack((full_ids[held[0]], swa_ids[held[0]])) is not None
    # The request goes on from the loaded prefix.
    out2, meta2, _ = b.step()
    [new] = out2.scheduled_new_reqs
    assert new.num_computed_tokens == HMA_FULL * BLOCK
    assert out2.num_scheduled_tokens["b-1"] == len(HMA_PROMPT) - HMA_FULL * BLOCK
    assert meta2.saves == [], "blocks that came from Strata are not stored again"


def test_hybrid_and_single_group_engines_share_values(server, models, hma_platform):
    # Engine A without HMA (one group, sliding-window layers keep every block) stores;
    # engine B with HMA loads the same values, each layer into its group's block.
    space = ns()
    vc = engine_config(models["base"], server, space)
    vc.scheduler_config.disable_hybrid_kv_cache_manager = True
    a = Engine(vc)
    a.scheduler.add_request(request("a-1", HMA_PROMPT))
    a.step()
    assert a.worker.stats["saved_blocks"] == HMA_FULL
    b = HybridEngine(hma_config(models["base"], server, space))
    b.scheduler.add_request(request("b-1", HMA_PROMPT))
    _, meta, res = b.step()
    assert res.finished_recving == {"b-1"} and b.worker.stats["loaded_blocks"] == HMA_FULL
    for i, fid in enumerate(b.layer_blocks("b-1", LAYERS[0])[:HMA_FULL]):
        assert torch.equal(b.caches[LAYERS[0]][fid], expected_kv(i, LAYERS[0]))


def test_hybrid_failed_load_fails_the_receive_and_is_recomputed(server, models, hma_platform):
    space = ns()
    a = HybridEngine(hma_config(models["base"], server, space))
    a.scheduler.add_request(request("a-1", HMA_PROMPT))
    a.step()
    # Another layout's value under the first block's key: its load fails.
    st_hashes = a.scheduler.connector._reqs["a-1"].hashes
    with KvClient(server["unix"], namespace=space, identity=a.worker.identity) as c:
        key = rank_key(st_hashes[0], 0, 0)
        assert c.remove([key]) == 1
        c.put(key, b"STRKVv1\0" + bytes(32) + bytes(a.worker._block_value_bytes - 40))
    b = HybridEngine(hma_config(models["base"], server, space))
    b.scheduler.add_request(request("b-1", HMA_PROMPT))
    _, meta, res = b.step()
    assert len(meta.loads) == 1
    assert res.failed_recving == {"b-1"} and "b-1" in res.finished_recving
    assert b.worker.stats["load_errors"] == 1
    # vLLM recomputes the whole request; the connector never offers that load again.
    assert b.scheduler.requests["b-1"].num_computed_tokens == 0
    out2, meta2, _ = b.step()
    assert meta2.loads == []
    assert out2.num_scheduled_tokens.get("b-1") == len(HMA_PROMPT)


@pytest.mark.parametrize("what", ["mamba", "block_size", "layerwise"])
def test_hybrid_groups_it_cannot_store_are_refused_with_the_reason(server, models, what):
    from vllm.v1.kv_cache_interface import MambaSpec

    vc = engine_config(models["base"], server, ns(), layerwise=(what == "layerwise"))
    other = {
        "mamba": MambaSpec(block_size=BLOCK, shapes=((4, 8),), dtypes=(torch.float32,)),
        "block_size": SlidingWindowSpec(block_size=2 * BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_DIM,
                                        dtype=torch.float32, sliding_window=WINDOW),
        "layerwise": swa_spec(),
    }[what]
    hybrid = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec([LAYERS[0]], full_spec()),
                                            KVCacheGroupSpec([LAYERS[1]], other)])
    reason = {"mamba": "MambaSpec", "block_size": "block size", "layerwise": "layer-by-layer"}[what]
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        with pytest.raises(ValueError, match=reason):
            StrataConnector(vc, role, hybrid)


def test_a_layerwise_load_from_a_daemon_that_froze_costs_one_timeout_not_one_per_layer(models):
    """Black-box finding: layer by layer, with the daemon frozen as the load began, the
    load thread asked for each layer with a fresh ``timeout_s`` and the forward pass
    waited ``timeout_s`` per layer (32 layers at the default 30 s: 16 minutes), each
    block's error counted once per layer. After the first layer fails, the rest fail at
    once: one bounded wait, each block one load error, recomputed."""
    with strata_serve([]) as srv:
        vc = engine_config(models["base"], srv, ns(), layerwise=True, timeout_s=2, lookup_timeout_s=0.5)
        run_layerwise_writer(vc)
        b = Engine(vc)
        b.scheduler.add_request(request("b-1"))
        meta = b.scheduler.schedule().kv_connector_metadata
        assert [len(t.blocks) for t in meta.loads] == [FULL_BLOCKS]
        freeze(srv["pid"])
        try:
            b.worker.bind_connector_metadata(meta)
            started = time.monotonic()
            b.worker.start_load_kv(None)
            for name in LAYERS:
                b.worker.wait_for_layer_load(name)
            took = time.monotonic() - started
        finally:
            os.kill(srv["pid"], signal.SIGCONT)
        assert took < 3.2, f"the forward pass waited {took:.1f} s for {len(LAYERS)} layers at timeout_s=2"
        b.worker.flush(timeout=30)
        assert b.worker.stats["load_errors"] == FULL_BLOCKS, b.worker.stats
        assert len(b.worker.get_block_ids_with_load_errors()) == FULL_BLOCKS


def test_a_frozen_daemon_costs_one_short_lookup_and_one_save_timeout_then_recompute(models):
    """Black-box finding: with the daemon frozen (SIGSTOP), each new request held the
    scheduler's step for the whole ``timeout_s`` (4 requests: 12 s at 3 s), and the
    worker's saves queued without bound, each waiting ``timeout_s``, so shutdown took
    minutes. Lookups now have their own short bound and, after one fails, are skipped
    (the requests recompute); saves are dropped while paused; shutdown drops what has
    not started; and the daemon is used again once it answers."""
    with strata_serve([]) as srv:
        vc = engine_config(models["base"], srv, ns(), timeout_s=2, lookup_timeout_s=0.5)
        a, _ = run_writer(vc)  # blocks stored while the daemon answers
        b = Engine(vc)
        freeze(srv["pid"])
        try:
            for i in range(4):
                b.scheduler.add_request(request(f"b-{i}", tokens=PROMPT + [i]))
            started = time.monotonic()
            out = b.scheduler.schedule()
            took = time.monotonic() - started
            assert took < 2.0, f"one schedule() of 4 new requests took {took:.1f} s"
            assert b.scheduler.connector.stats["lookups_skipped"] == 3
            assert out.kv_connector_metadata.loads == [], "recomputed, not loaded"
            # The worker's saves: one times out, the rest are dropped.
            b.worker.bind_connector_metadata(out.kv_connector_metadata)
            for name in LAYERS:
                b.worker.save_kv_layer(name, b.caches[name], None)
            started = time.monotonic()
            b.worker.wait_for_save()
            b.worker.flush(timeout=30)
            took = time.monotonic() - started
            assert took < 4.0, f"saves with the daemon frozen took {took:.1f} s"
            assert b.worker.stats["save_dropped"] > 0, b.worker.stats
            b.worker.clear_connector_metadata()
        finally:
            os.kill(srv["pid"], signal.SIGCONT)
        # Once the pause is over the daemon is asked again, and the blocks load.
        time.sleep(2.2)
        c = Engine(vc)
        c.scheduler.add_request(request("c-1"))
        _, meta, _, _ = c.step()
        assert [len(t.blocks) for t in meta.loads] == [FULL_BLOCKS], "loaded after the daemon is back"
        started = time.monotonic()
        c.worker.shutdown()
        assert time.monotonic() - started < 5.0


def test_the_identity_names_the_weights_commit_vllm_loaded_not_the_ref():
    """Black-box finding: vLLM's revision is the ref asked for ("main") with the commit
    it resolved beside it; the identity took "main", so engines on two snapshots of a
    moved main shared one identity and loaded each other's KV."""
    from types import SimpleNamespace

    from strata_kv.vllm import model_identity_of

    class Resolved(str):
        resolved = None

    def cfg(revision):
        hf = SimpleNamespace(rope_theta=10000.0)
        mc = SimpleNamespace(model="org/m", revision=revision, hf_text_config=hf, hf_config=hf,
                             dtype="float16", quantization=None)
        return SimpleNamespace(model_config=mc, cache_config=SimpleNamespace(cache_dtype="auto", block_size=16),
                               parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1))

    def main_at(commit):
        r = Resolved("main")
        r.resolved = commit
        return r

    a, b = model_identity_of(cfg(main_at("a" * 40))), model_identity_of(cfg(main_at("b" * 40)))
    assert a.revision == "a" * 40 and a.digest() != b.digest()
    assert model_identity_of(cfg("v1.0")).revision == "v1.0"
    assert model_identity_of(cfg(None)).revision == ""


def test_a_steps_save_over_the_queue_cap_goes_when_nothing_waits_and_reset_is_refused(server, models):
    """Black-box findings: one step's save larger than ``max_pending_save_mb`` was
    dropped whole even with an empty queue (an 8k-token chunk of an 8B model is just over
    the 1 GiB default); and vLLM's connector reset read as done while nothing was."""
    namespace = ns()
    a = Engine(engine_config(models["base"], server, namespace, max_pending_save_mb=0.001))
    a.scheduler.add_request(request("a-1"))
    a.step()
    assert a.worker.stats["saved_blocks"] == FULL_BLOCKS, a.worker.stats
    assert a.worker.stats["save_dropped"] == 0
    assert a.scheduler.connector.reset_cache() is False
