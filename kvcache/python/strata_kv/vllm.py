"""vLLM KV connector on Strata (issue 15): ``StrataConnector``, a ``KVConnectorBase_V1``.

Load it with::

    vllm serve <model> --kv-transfer-config '{"kv_connector": "StrataConnector",
      "kv_connector_module_path": "strata_kv.vllm", "kv_role": "kv_both",
      "kv_connector_extra_config": {"strata_addr": "unix:///run/strata/kv.sock",
                                    "namespace": "llama3-8b"}}'

What it does, per request:

* Scheduler: the request's full prompt blocks are hashed with the v2 derivation bound to
  the model identity (model, revision, dtype/KV dtype, block size, RoPE scaling from the
  HF config, TP/PP size, quantization) plus the request's LoRA adapter and cache salt,
  so KV of another revision, RoPE scaling or adapter is a miss, never a load.
  ``get_num_new_matched_tokens`` asks Strata for the longest prefix whose every rank's
  share is stored and answers ``load_async=True``: the load is its own scheduling stage
  and the request waits in ``WAITING_FOR_REMOTE_KVS`` while other requests run.
* Worker: each rank stores and loads only its own share of a block under
  :func:`strata_kv.rank_key` (36-byte key: chain hash, TP rank, PP rank). A value is a
  small header naming the rank's cache layout (layer names, per-block shapes, dtypes)
  and the block's bytes for every layer; a value whose header or size does not match
  is a load error (the blocks are recomputed), never copied into the cache.

Layer by layer (extra config ``"layerwise": true``): each layer of a rank's block is
its own value (:func:`strata_kv.layer_key`), the lookup answers ``load_async=False`` so
the request runs in the step its KV loads in, ``start_load_kv`` starts fetching the
layers in order and ``wait_for_layer_load`` waits only for its own layer, so layer
``i``'s attention runs while layers ``i+1..`` are still arriving; ``save_kv_layer``
copies each layer's finished blocks out as soon as the layer has written them and sends
them while the next layers compute. Whole-block values (the default) suit a cache
whose loads take longer than a step: the request then waits off the GPU while others
run. The two modes' keys differ (36 vs 38 bytes), so they miss, never misread, each
other's blocks in a shared namespace.

Hybrid models (vLLM's hybrid memory allocator, ``SupportsHMA``): the KV cache groups
are attention groups (full, sliding window, chunked local, MLA) with one block table
each. A block's value is the same as with one group (every layer's bytes at the
block's index, in the runner's layer order), so engines with the allocator on and off
share values; each layer is read from and written to its own group's block. A group
that no longer holds a block (a sliding window's null block, outside the window) is
skipped on load (vLLM does not read it) and makes the block unsaveable (never a
value with a hole). With several groups vLLM takes no block-level load errors, so a
failed load fails the request's receive (``failed_recving``) and vLLM recomputes it.
Refused at construction, with the reason: SSM (Mamba) groups (a state per request,
not per block of tokens), groups with another block size, host-resident (HiSparse)
groups, and layer-by-layer mode with several groups (its errors are block-level).

Extra config: ``strata_addr`` (default ``$STRATA_KV_ADDR`` or ``127.0.0.1:7070``),
``namespace`` (default: the model name; past 128 bytes, its tail and a digest), ``token`` (default ``$STRATA_KV_TOKEN``),
``revision`` (overrides the model config's revision, e.g. a weights checksum),
``min_load_blocks`` (default 1), ``timeout_s`` (default 30: a load or save),
``lookup_timeout_s`` (default 2: the scheduler's lookups, which hold its step),
``max_pending_save_mb`` (default 1024: block copies waiting to be sent), ``prefill_us_per_token``
(default: measured), ``load_or_recompute`` (default true), ``layerwise`` (default false), ``shm`` (default: true
for a ``unix://`` address: a worker attaches to the daemon's shared-memory arena and
copies each loaded block straight from it into the KV cache, one copy instead of the
socket's; off, or no arena: the bytes come through the socket).

A daemon that fails (stopped, frozen, gone) costs one bounded call, then a pause: the
scheduler's lookups are bounded by ``lookup_timeout_s`` and, after one fails
(unavailable or past its deadline), are skipped for 2 s, doubling with each failure
in a row up to 30 s, so requests recompute instead of each holding the scheduler for
a timeout; saves are dropped (counted in ``save_dropped``) while paused, and while more
than ``max_pending_save_mb`` of copies wait; ``shutdown`` drops saves not started.

Load or recompute: a stored prefix is loaded only as far as loading beats recomputing
it. The service's ``EstimateLoad`` gives each block's expected load time from the
tier it is on and the bandwidth it measures online (with what is queued); the
connector measures this engine's prefill time per token from its own scheduler steps
(an exponential average over prefill-dominated steps, or ``prefill_us_per_token``) and
loads the prefix with the largest saving (:func:`blocks_worth_loading`). Until a
prefill has been measured it loads (a cache hit is the better first guess). The service
times only its side of a Get, so the workers time each load and hand the times to the
scheduler through vLLM's connector stats (:class:`StrataKVConnectorStats`), which
scales the service's estimates by measured / estimated (:class:`LoadClock`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
import warnings
from contextlib import nullcontext
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

import grpc
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from ._pause import Pause as _Pause
from .client import KvClient, KvError, check_namespace, config_flag, namespace_from_name
from .keys import ModelIdentity, chain_hashes_v2, layer_key, rank_key

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

#: First bytes of every stored block value; the version changes when the format does.
VALUE_MAGIC = b"STRKVv1\0"
#: First bytes of a one-layer value (layer-by-layer mode).
LAYER_MAGIC = b"STRKVl1\0"
HEADER_BYTES = len(VALUE_MAGIC) + 32
#: vLLM's null block (``vllm.v1.attention.backends.utils.NULL_BLOCK_ID``): the id a
#: group's block table holds where the group keeps no block (outside a sliding window).
NULL_BLOCK_ID = 0
#: Keys fetched per call when attached to the arena: one round trip for 64 values
#: rather than one each, while a batch's leases (64 values: a few MiB, tens for large
#: models) mostly fit a session's share of the arena (a quarter of it; a value past
#: that share comes as bytes).
VIEW_BATCH = 64


# -- load or recompute -------------------------------------------------------------------


def blocks_worth_loading(load_us: Sequence[float], recompute_us_per_block: Optional[float]) -> int:
    """How many of the leading blocks to load: the prefix whose loading saves the most
    time over recomputing it (0 when none saves any). ``None``: no prefill measured yet,
    load them all. Recomputing is taken as linear in tokens, which undercounts long
    prompts (attention grows with the position), so it errs toward recomputing."""
    if recompute_us_per_block is None:
        return len(load_us)
    best_k, best, spent = 0, 0.0, 0.0
    for i, us in enumerate(load_us):
        spent += us
        saving = (i + 1) * recompute_us_per_block - spent
        if saving > best:
            best, best_k = saving, i + 1
    return best_k


class PrefillClock:
    """This engine's prefill time per token, from its scheduler's steps: the time from
    one ``build_connector_meta`` to the next is the previous step's, and a step that
    schedules at least ``min_tokens`` tokens is dominated by prefill."""

    #: Weight of the newest step in the average: a few steps follow a load change.
    ALPHA = 0.2

    def __init__(self, min_tokens: int = 256, fixed_us_per_token: Optional[float] = None):
        self.min_tokens = min_tokens
        self.us_per_token: Optional[float] = fixed_us_per_token
        self._fixed = fixed_us_per_token is not None
        self._last: Optional[Tuple[float, int]] = None

    def step(self, now: float, scheduled_tokens: int) -> None:
        if self._last is not None and not self._fixed:
            t, tokens = self._last
            if tokens >= self.min_tokens and now > t:
                us = (now - t) * 1e6 / tokens
                self.us_per_token = us if self.us_per_token is None else (
                    self.ALPHA * us + (1 - self.ALPHA) * self.us_per_token)
        self._last = (now, scheduled_tokens)


class LoadClock:
    """How far the service's ``EstimateLoad`` is from the loads this engine's workers
    measure, as a factor on the estimate. The service times its side of a Get only;
    the worker's side (receiving, unpacking into the KV cache, a loaded host) is often
    most of a load (black-box finding: 4 MiB blocks estimated at 0.5-0.8 ms each took
    8-125 ms, so loads slower than recomputing were chosen). Each load the scheduler
    planned is matched with the time its workers report (the slowest rank's, as they
    load in parallel); the factor is a geometric average of measured / estimated, so
    one outlier moves it by a bounded step. With no new measurement it decays back
    toward 1 (half-life ``HALF_LIFE_S``): a factor that makes every prefix recompute
    would otherwise never see a load again to learn that loads got faster."""

    #: Weight of the newest load in the (log) average: a few loads follow a change.
    ALPHA = 0.3
    HALF_LIFE_S = 60.0
    #: Planned loads remembered for matching (a request whose blocks were never
    #: allocated leaves its plan behind; the oldest go first).
    MAX_PLANNED = 4096

    def __init__(self):
        self._log_factor = 0.0
        self._at: Optional[float] = None
        self._planned: Dict[str, float] = {}

    def factor(self, now: float) -> float:
        if self._at is None:
            return 1.0
        decay = 0.5 ** (max(0.0, now - self._at) / self.HALF_LIFE_S)
        return math.exp(self._log_factor * decay)

    def planned(self, req_id: str, estimated_us: float) -> None:
        """The service estimated ``estimated_us`` for the blocks ``req_id`` will load."""
        self._planned.pop(req_id, None)
        self._planned[req_id] = estimated_us
        while len(self._planned) > self.MAX_PLANNED:
            self._planned.pop(next(iter(self._planned)))

    def measured(self, req_ids: Sequence[str], us: float, now: float) -> None:
        """The workers loaded the planned blocks of ``req_ids`` in ``us`` (a layer-by-
        layer step loads all its requests' blocks together)."""
        planned = [self._planned.pop(r, None) for r in req_ids]
        if not planned or any(p is None for p in planned):
            return
        est = sum(planned)
        if est <= 0 or us <= 0:
            return
        sample = math.log(us / est)
        if self._at is None:
            # The first load is the only evidence there is: the factor of 1 was a guess.
            self._log_factor = sample
        else:
            self._log_factor = (1 - self.ALPHA) * math.log(self.factor(now)) + self.ALPHA * sample
        self._at = now


@dataclass
class StrataKVConnectorStats(KVConnectorStats):
    """What a worker's connector measured since vLLM last asked: ``loads``, a list of
    ``[request ids, microseconds]`` (one entry per load; a layer-by-layer step's load
    covers its requests together). vLLM carries it to the scheduler's connector
    (``update_connector_output``), aggregating the ranks' lists, and to its logger."""

    #: Entries kept if vLLM never collects them.
    MAX_LOADS = 1024

    def __post_init__(self):
        self.data.setdefault("loads", [])

    def record(self, req_ids: Sequence[str], us: float) -> None:
        loads = self.data["loads"]
        if len(loads) < self.MAX_LOADS:
            loads.append([list(req_ids), float(us)])

    def reset(self):
        self.data = {"loads": []}

    def is_empty(self) -> bool:
        return not self.data.get("loads")

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        self.data.setdefault("loads", []).extend((other.data or {}).get("loads", []))
        return self

    def reduce(self) -> Dict[str, Any]:
        times = [us for _, us in self.data.get("loads", [])]
        if not times:
            return {"Loads": 0}
        return {"Loads": len(times), "Avg load time (ms)": round(sum(times) / len(times) / 1e3, 3),
                "Max load time (ms)": round(max(times) / 1e3, 3)}


# -- the model identity -----------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def model_identity_of(vllm_config: "VllmConfig", revision: Optional[str] = None) -> ModelIdentity:
    """The engine-wide identity: everything in vLLM's config that changes KV values.

    Per-request fields (LoRA adapter, cache salt) are added by :func:`request_identity`.
    """
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    pc = vllm_config.parallel_config
    hf = getattr(mc, "hf_text_config", None) or mc.hf_config
    rope = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None)
    extra: Dict[str, str] = {"engine": "vllm", "dtype": str(mc.dtype)}
    theta = getattr(hf, "rope_theta", None)
    if theta is not None:
        extra["rope_theta"] = repr(theta)
    if getattr(mc, "quantization", None):
        extra["quantization"] = str(mc.quantization)
    kv_dtype = cc.cache_dtype if cc.cache_dtype and cc.cache_dtype != "auto" else str(mc.dtype)
    return ModelIdentity(
        model=str(mc.model),
        # The commit vLLM loaded, not the ref asked for: vLLM's revision is the ref
        # ("main") with the resolved commit beside it (black-box finding: two engines
        # on two snapshots of "main" shared one identity, and loaded each other's KV).
        revision=revision if revision is not None else str(getattr(mc.revision, "resolved", None) or mc.revision or ""),
        kv_dtype=str(kv_dtype),
        # Blocks are stored per rank as [B, H, N, C] layer slices; the value header
        # pins the exact per-layer shapes, so this names the format only.
        kv_layout="vllm:block-per-layer",
        block_tokens=int(cc.block_size),
        rope_scaling=_jsonable(rope),
        tp_size=int(pc.tensor_parallel_size),
        pp_size=int(pc.pipeline_parallel_size),
        extra=extra,
    )


def request_identity(base: ModelIdentity, request: "Request") -> ModelIdentity:
    """``base`` with the request's LoRA adapter and cache salt."""
    lora = getattr(request, "lora_request", None)
    lora_id = ""
    if lora is not None:
        # The name is what users pick; the path and id tell two uploads of a name apart.
        lora_id = f"{lora.lora_name}#{lora.lora_int_id}@{getattr(lora, 'lora_path', '')}"
    return replace(base, lora=lora_id, cache_salt=getattr(request, "cache_salt", None) or "")


def _mm_extras(request: "Request") -> bytes:
    """Multimodal inputs change KV values behind the same placeholder tokens: their
    hashes enter every block's extras (coarse: the whole request's, never a wrong hit).
    So do prompt embeddings: their positions hold a placeholder id, and two requests
    with the same ids and other embeddings have other KV (black-box finding: a request
    with embeddings E2 loaded the blocks of one with E1)."""
    feats = getattr(request, "mm_features", None) or []
    ids = [str(getattr(f, "identifier", "")) for f in feats]
    out = ("mm:" + ",".join(ids)).encode() if ids else b""
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is not None:
        h = hashlib.sha256()
        t = embeds.detach().contiguous().cpu()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        mask = getattr(request, "prompt_is_token_ids", None)
        if mask is not None:
            m = mask.detach().contiguous().cpu() if hasattr(mask, "detach") else torch.tensor(list(mask))
            h.update(m.to(torch.uint8).numpy().tobytes())
        out += b"embeds:" + h.hexdigest().encode()
    return out


# -- metadata the scheduler hands the workers ---------------------------------------------


@dataclass
class BlockTransfer:
    req_id: str
    #: (chain hash of the block, block id in the paged cache; with several KV cache
    #: groups, the first group's)
    blocks: List[Tuple[bytes, int]]
    #: Several KV cache groups: each block's id in every group, in group order.
    group_ids: Optional[List[Tuple[int, ...]]] = None

    def ids(self, i: int) -> Tuple[int, ...]:
        """Block ``i``'s id in every KV cache group."""
        return self.group_ids[i] if self.group_ids is not None else (self.blocks[i][1],)


def _transfer(req_id: str, hashes: Sequence[bytes], ids: Sequence[Tuple[int, ...]]) -> BlockTransfer:
    return BlockTransfer(req_id, [(h, g[0]) for h, g in zip(hashes, ids)],
                         group_ids=list(ids) if ids and len(ids[0]) > 1 else None)


#: Kinds of KV cache group whose blocks are a block of tokens' attention KV, read only
#: through the group's block table (exact types: subclasses such as sink or ring
#: attention keep other state).
def _transferable_specs() -> Tuple[type, ...]:
    from vllm.v1 import kv_cache_interface as k

    names = ("FullAttentionSpec", "MLAAttentionSpec", "SlidingWindowSpec", "SlidingWindowMLASpec",
             "ChunkedLocalAttentionSpec")
    return tuple(getattr(k, n) for n in names if hasattr(k, n))


def _check_group(index: int, group: Any, block_size: int) -> None:
    """Raises ValueError for a KV cache group this connector cannot store or load."""
    spec = group.kv_cache_spec
    specs = list(getattr(spec, "kv_cache_specs", {}).values()) or [spec]  # uniform-type groups
    allowed = _transferable_specs()
    for sp in specs:
        if type(sp) not in allowed:
            raise ValueError(
                f"StrataConnector: KV cache group {index} is {type(sp).__name__}; it stores "
                "attention KV per block of tokens (full, sliding window, chunked local, MLA), "
                "not SSM state or other per-request state")
    if int(getattr(spec, "block_size", block_size)) != block_size:
        raise ValueError(f"StrataConnector: KV cache group {index} has block size {spec.block_size}, "
                         f"the cache {block_size}: keys are per {block_size}-token block")
    if getattr(group, "host_resident", False):
        raise ValueError(f"StrataConnector: KV cache group {index} is host-resident (HiSparse)")


@dataclass
class StrataConnectorMetadata(KVConnectorMetadata):
    loads: List[BlockTransfer] = field(default_factory=list)
    saves: List[BlockTransfer] = field(default_factory=list)


@dataclass
class _ReqState:
    request: Any
    hashes: List[bytes]
    #: the request's block ids, one list per KV cache group
    block_ids: List[List[int]] = field(default_factory=list)
    #: leading blocks known to be in Strata (looked up or stored): never stored again
    stored_blocks: int = 0
    #: locally computed tokens the last lookup was told about
    local_tokens: int = 0
    #: blocks a failed load showed unusable here: never offered again (else vLLM's
    #: recompute policy would send the request straight back to the same failed load)
    load_limit: Optional[int] = None
    #: the in-flight load: (index of its first block, its block ids)
    loading: Optional[Tuple[int, List[int]]] = None
    #: a layer-by-layer load was handed to the workers: it ran in that step, so the
    #: next connector output carries its errors
    sync_load_sent: bool = False
    failed_block_ids: Set[int] = field(default_factory=set)


class StrataConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = self._kv_transfer_config
        get = cfg.get_from_extra_config
        self.block_size = int(vllm_config.cache_config.block_size)
        self.addr = get("strata_addr", None) or os.environ.get("STRATA_KV_ADDR", "127.0.0.1:7070")
        # The model path by default, shortened with a digest past the service's 128 bytes
        # (black-box finding: a Hugging Face snapshot path is ~136 bytes, and an engine
        # started with it cached nothing, each call refused).
        self.namespace = check_namespace(get("namespace", None) or namespace_from_name(str(vllm_config.model_config.model)))
        token = get("token", None) or os.environ.get("STRATA_KV_TOKEN")
        revision = get("revision", None)
        # A single block saves little next to a round trip; one is the floor.
        self.min_load_blocks = max(1, int(get("min_load_blocks", 1)))
        fixed = get("prefill_us_per_token", None)
        self.prefill = PrefillClock(fixed_us_per_token=float(fixed) if fixed is not None else None)
        #: Scheduler side: measured / estimated load time, from the workers' reports.
        self.load_clock = LoadClock()
        #: Worker side: load times not yet handed to vLLM (``get_kv_connector_stats``).
        self._load_times = StrataKVConnectorStats()
        self.load_or_recompute = config_flag("load_or_recompute", get("load_or_recompute", True))
        self.layerwise = config_flag("layerwise", get("layerwise", False))
        groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
        #: KV cache groups (block tables) the requests' block ids come in.
        self._num_groups = max(1, len(groups))
        #: Each stored layer's KV cache group; a layer of a group vLLM marks as not
        #: transferable (a replica it rebuilds after a load) is neither stored nor loaded.
        self._layer_group: Dict[str, int] = {}
        if len(groups) > 1:
            for gi, g in enumerate(groups):
                _check_group(gi, g, self.block_size)
                if getattr(g, "enable_kv_transfer", True):
                    self._layer_group.update({n: gi for n in g.layer_names})
            if self.layerwise:
                raise ValueError(
                    f"StrataConnector: layer-by-layer mode with {len(groups)} KV cache groups: its "
                    "failed loads are block-level errors, which vLLM takes only with one group; "
                    "use whole-block values (layerwise: false) with the hybrid memory allocator")
        #: Layer names in the order the model runs them (the index in layer keys).
        self._layer_names: List[str] = [n for g in groups for n in g.layer_names
                                         if len(groups) == 1 or n in self._layer_group]
        self.identity = model_identity_of(vllm_config, revision)
        pc = vllm_config.parallel_config
        self.tp_size = int(pc.tensor_parallel_size)
        self.pp_size = int(pc.pipeline_parallel_size)
        # The namespace binds to the engine-wide identity; LoRA and salt only change keys.
        self.timeout_s = float(get("timeout_s", 30.0))
        # The scheduler's client only looks up, inside the scheduler's step: its calls
        # get the short bound (black-box finding: with the daemon frozen, each new
        # request held schedule() for the whole timeout_s).
        self.lookup_timeout_s = min(self.timeout_s, float(get("lookup_timeout_s", 2.0)))
        call_timeout = self.lookup_timeout_s if role == KVConnectorRole.SCHEDULER else self.timeout_s
        self.max_pending_save_bytes = int(float(get("max_pending_save_mb", 1024)) * (1 << 20))
        self._lookup_pause = _Pause()
        self._save_pause = _Pause()
        # Loads too: after one fails on a daemon that does not answer, the loads and
        # layers behind it fail at once (black-box finding: layer by layer, a frozen
        # daemon held the forward pass timeout_s per layer; whole blocks, the Nth queued
        # load waited N x timeout_s).
        self._load_pause = _Pause()
        self._pending_save_bytes = 0
        # Only a worker loads blocks: only a worker attaches to the arena.
        self.shm = (role == KVConnectorRole.WORKER
                    and config_flag("shm", get("shm", str(self.addr).startswith("unix:"))))
        try:
            self.client = KvClient(self.addr, namespace=self.namespace, token=token,
                                   timeout=call_timeout, identity=self.identity, shm=self.shm)
        except OSError as e:  # no arena (off, or tenants): bytes through the socket
            logger.warning("strata: shared memory unavailable (%s); loading through the socket", e)
            self.shm = False
            self.client = KvClient(self.addr, namespace=self.namespace, token=token,
                                   timeout=call_timeout, identity=self.identity)

        # kv_producer only stores, kv_consumer only loads, kv_both does both.
        self.loads_enabled = bool(cfg.is_kv_consumer)
        self.saves_enabled = bool(cfg.is_kv_producer)

        # scheduler side
        self._reqs: Dict[str, _ReqState] = {}
        self._pending_loads: List[BlockTransfer] = []

        # worker side
        self.tp_rank, self.pp_rank = _ranks()
        self._layers: List[Tuple[str, torch.Tensor]] = []
        self._layer_tensors: Dict[str, torch.Tensor] = {}
        self._layer_digests: Dict[str, bytes] = {}
        self._layer_value_bytes: Dict[str, int] = {}
        #: this step's layer-by-layer load: per layer, set when its blocks are in
        self._layer_ready: Dict[str, threading.Event] = {}
        self._layer_load_blocks: List[int] = []
        self._kernel_blocks = 1
        self._layout_digest = b""
        self._block_value_bytes = 0
        # One thread: loads and saves keep their order, and gRPC calls stay off the
        # forward pass.
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strata-kv")
        # Loads on their own thread: a load the forward pass waits for must not queue
        # behind the previous step's saves.
        self._load_io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strata-kv-load")
        self._io_futures: List[Any] = []
        self._lock = threading.Lock()
        self._finished_loads: Set[str] = set()
        self._load_errors: Set[int] = set()
        #: Requests whose load failed, with several KV cache groups (reported whole).
        self._failed_loads: Set[str] = set()
        self._load_stream = None
        self.stats = {"lookups": 0, "matched_blocks": 0, "loaded_blocks": 0, "saved_blocks": 0,
                      "load_errors": 0, "save_errors": 0, "identity_refusals": 0,
                      "recompute_chosen_blocks": 0, "shm_reads": 0,
                      "device_reads": 0, "lookups_skipped": 0, "save_dropped": 0}
        #: Ask for device handles of GPU-tier blocks (set in register_kv_caches).
        self._device_reads = False

    @property
    def requires_kv_delivery(self) -> bool:
        # A cache, not a hand-off: a save lost to a preemption is a later miss.
        return False

    # ==============================================================================
    # scheduler side
    # ==============================================================================

    def _state(self, request: "Request") -> _ReqState:
        st = self._reqs.get(request.request_id)
        if st is None:
            tokens = list(request.prompt_token_ids or [])
            ident = request_identity(self.identity, request)
            hashes = chain_hashes_v2(ident, tokens, self.block_size, extras=_mm_extras(request))
            st = _ReqState(request=request, hashes=hashes)
            self._reqs[request.request_id] = st
        return st

    def _refused(self, what: str, e: KvError) -> None:
        if e.code == grpc.StatusCode.FAILED_PRECONDITION:
            self.stats["identity_refusals"] += 1
            logger.warning("strata: %s refused: namespace %r holds another model identity (%s)",
                           what, self.namespace, e.message)
        else:
            logger.warning("strata: %s failed: %s", what, e)

    def _stored_prefix(self, hashes: Sequence[bytes]) -> int:
        """Leading blocks whose every rank's share is stored (the same for all ranks);
        0 while lookups are paused after a failure (the request recomputes)."""
        if not hashes:
            return 0
        if self._lookup_pause.active():
            self.stats["lookups_skipped"] += 1
            return 0
        try:
            n = self._lookup_prefix(hashes)
        except KvError as e:
            self._lookup_pause.outcome(e)
            self._refused("lookup", e)
            return 0
        self._lookup_pause.outcome(None)
        return n

    def _lookup_prefix(self, hashes: Sequence[bytes]) -> int:
        shares = [(t, p) for p in range(self.pp_size) for t in range(self.tp_size)]
        if self.layerwise:
            # Every layer of every rank: the leading keys stored, in block order.
            per_block = [(t, p, li) for t, p in shares for li in range(len(self._layer_names))]
            keys = [layer_key(h, t, p, li) for h in hashes for t, p, li in per_block]
            return self.client.match_prefix(keys) // max(1, len(per_block))
        keys = [rank_key(h, t, p) for h in hashes for t, p in shares]
        if len(shares) == 1:
            return self.client.match_prefix(keys)
        present = self.client.batch_exists(keys)
        n = len(shares)
        for i in range(len(hashes)):
            if not all(present[i * n : (i + 1) * n]):
                return i
        return len(hashes)

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        st = self._state(request)  # a kv_producer needs it too: the keys to store under
        st.local_tokens = num_computed_tokens
        if not self.loads_enabled:
            return 0, False
        self.stats["lookups"] += 1
        matched = self._stored_prefix(st.hashes)
        if st.load_limit is not None:
            matched = min(matched, st.load_limit)
        st.stored_blocks = max(st.stored_blocks, matched)
        self.stats["matched_blocks"] += matched
        matched = self._worth_loading(request.request_id, st.hashes, num_computed_tokens // self.block_size, matched)
        if self.layerwise:
            # Loaded in the step that schedules the request, which must compute at least
            # one token (vLLM asserts it): a prompt held whole leaves its last block to
            # compute (black-box finding: a repeated prompt of whole blocks killed the
            # scheduler). Whole-block loads are a stage of their own: vLLM recomputes the
            # last token itself after them.
            matched = min(matched, (request.num_tokens - 1) // self.block_size)
        ext = matched * self.block_size - num_computed_tokens
        if matched < self.min_load_blocks or ext <= 0:
            return 0, False
        # Layer by layer: the load overlaps this request's own forward pass, in the
        # step that schedules it; whole blocks: a stage of its own (WAITING_FOR_REMOTE_KVS).
        return ext, not self.layerwise

    def _worth_loading(self, req_id: str, hashes: Sequence[bytes], first: int, matched: int) -> int:
        """``matched`` cut to the prefix that loads faster than it recomputes, the
        service's estimates scaled by what this engine's loads measured (``LoadClock``)."""
        rate = self.prefill.us_per_token
        if not self.load_or_recompute or rate is None or matched <= first:
            return matched
        if self.layerwise:
            # Layer 0's values stand for the block's; a block is that many layers.
            keys, layers = [layer_key(h, 0, 0, 0) for h in hashes[first:matched]], max(1, len(self._layer_names))
        else:
            keys, layers = [rank_key(h, 0, 0) for h in hashes[first:matched]], 1
        if self._lookup_pause.active():
            return matched
        try:
            est = self.client.estimate_load(keys)
        except KvError as e:
            self._lookup_pause.outcome(e)
            self._refused("estimate", e)
            return matched
        load_us = [us * layers for _, us in est["blocks"]]
        factor = self.load_clock.factor(time.monotonic())
        keep = blocks_worth_loading([us * factor for us in load_us], rate * self.block_size)
        if keep:
            self.load_clock.planned(req_id, sum(load_us[:keep]))
        if keep < len(load_us):
            self.stats["recompute_chosen_blocks"] += len(load_us) - keep
        return first + keep

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        st = self._state(request)
        # All the request's blocks (vLLM passes every block, also on the second call
        # after an async load, and new ones after a preemption).
        ids = [list(g) for g in blocks.get_block_ids()] if blocks is not None else []
        if any(ids):
            st.block_ids = ids
        if num_external_tokens <= 0:
            return
        first = st.local_tokens // self.block_size
        last = (st.local_tokens + num_external_tokens) // self.block_size
        plan = _transfer(request.request_id, st.hashes[first:last], [self._ids(st, i) for i in range(first, last)])
        st.loading = (first, [b for _, b in plan.blocks])
        st.failed_block_ids = set()
        st.sync_load_sent = False
        self._pending_loads.append(plan)

    @staticmethod
    def _ids(st: _ReqState, i: int) -> Tuple[int, ...]:
        """Block ``i``'s id in every group (the null block where a group has none)."""
        return tuple(g[i] if i < len(g) else NULL_BLOCK_ID for g in st.block_ids)

    def update_connector_output(self, connector_output: Any):
        """Learns which loads failed, so a retried request is not offered them again,
        and how long the workers' loads took (``LoadClock``)."""
        self._learn_load_times(getattr(connector_output, "kv_connector_stats", None))
        invalid = set(getattr(connector_output, "invalid_block_ids", None) or ())
        for st in self._reqs.values():
            if st.loading is not None and invalid:
                st.failed_block_ids |= invalid.intersection(st.loading[1])
            if st.loading is not None and st.sync_load_sent:
                # A layer-by-layer load ran in the step this output is of: done.
                self._load_done(st)
        failed = set(getattr(connector_output, "failed_recving", None) or ())
        for req_id in failed:
            # Several groups: a failed load is the whole request's (vLLM recomputes it).
            st = self._reqs.get(req_id)
            if st is not None and st.loading is not None:
                st.failed_block_ids = set(st.loading[1])
        for req_id in getattr(connector_output, "finished_recving", None) or ():
            st = self._reqs.get(req_id)
            if st is None or st.loading is None:
                continue
            self._load_done(st)

    def _learn_load_times(self, stats: Any) -> None:
        data = getattr(stats, "data", None)
        if not isinstance(data, dict):
            return
        # Ranks load in parallel: a load took as long as its slowest rank's.
        slowest: Dict[Tuple[str, ...], float] = {}
        for entry in data.get("loads", ()):
            try:
                req_ids, us = tuple(sorted(str(r) for r in entry[0])), float(entry[1])
            except (TypeError, ValueError, IndexError):
                continue
            slowest[req_ids] = max(slowest.get(req_ids, 0.0), us)
        now = time.monotonic()
        for req_ids, us in slowest.items():
            self.load_clock.measured(req_ids, us, now)

    def _load_done(self, st: _ReqState) -> None:
        """Blocks that failed to load are never offered to this request again."""
        if st.loading is None:
            return
        first, ids = st.loading
        if st.failed_block_ids:
            bad = min(i for i, b in enumerate(ids) if b in st.failed_block_ids)
            st.load_limit = first + bad
        st.loading = None
        st.sync_load_sent = False


    def _blocks_to_save(self, st: _ReqState, req_id: str, computed_tokens: int) -> Optional[BlockTransfer]:
        if not self.saves_enabled or not st.block_ids:
            return None
        done = min(computed_tokens // self.block_size, len(st.hashes), len(st.block_ids[0]))
        first = st.stored_blocks
        st.stored_blocks = max(st.stored_blocks, done)
        if done <= first:
            return None
        return _transfer(req_id, st.hashes[first:done], [self._ids(st, i) for i in range(first, done)])

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        self.prefill.step(time.monotonic(), sum(scheduler_output.num_scheduled_tokens.values()))
        meta = StrataConnectorMetadata(loads=self._pending_loads)
        self._pending_loads = []
        if self.layerwise:
            for t in meta.loads:
                st = self._reqs.get(t.req_id)
                if st is not None:
                    st.sync_load_sent = True
        for new in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue  # never looked up: its identity (salt) is unknown, so never stored
            st.block_ids = [list(g) for g in new.block_ids]
            computed = new.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            save = self._blocks_to_save(st, new.req_id, computed)
            if save is not None:
                meta.saves.append(save)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids and new_ids is not None:
                st.block_ids = [list(g) for g in new_ids]  # a resumed request gets all its blocks anew
            elif new_ids is not None:
                if not st.block_ids:
                    st.block_ids = [[] for _ in new_ids]
                for mine, more in zip(st.block_ids, new_ids):
                    mine.extend(more)
            computed = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            save = self._blocks_to_save(st, req_id, computed)
            if save is not None:
                meta.saves.append(save)
        return meta

    def request_finished(self, request: "Request", block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        # Saves copy the blocks out in wait_for_save, so the blocks can be freed now.
        self._reqs.pop(request.request_id, None)
        return False, None

    def request_finished_all_groups(self, request: "Request",
                                    block_ids: Tuple[List[int], ...]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        # SupportsHMA's form of request_finished: the same (nothing held past the step).
        return self.request_finished(request, list(block_ids[0]) if block_ids else [])

    # ==============================================================================
    # worker side
    # ==============================================================================

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]):
        if self._layer_group:
            # Several groups: the layers of the transferable ones, in the runner's order.
            kv_caches = {n: t for n, t in kv_caches.items() if n in self._layer_group}
        self._layers = list(kv_caches.items())
        self._layer_tensors = dict(self._layers)
        if not self._layers:
            return
        if set(self._layer_names) != set(kv_caches):
            # No group in the config (or another set of layers): the runner's order.
            self._layer_names = [n for n, _ in self._layers]
        num_blocks = getattr(self._kv_cache_config, "num_blocks", None)
        first = self._layers[0][1]
        # vLLM may split a logical block into several kernel blocks (leading dim).
        self._kernel_blocks = max(1, first.shape[0] // num_blocks) if num_blocks else 1
        desc = []
        for name, t in self._layers:
            per_block = list(t.shape[1:])
            desc.append([name, per_block, str(t.dtype), self._kernel_blocks])
        desc_json = json.dumps({"layers": desc, "tp": [self.tp_rank, self.tp_size],
                                "pp": [self.pp_rank, self.pp_size]}, sort_keys=True)
        self._layout_digest = hashlib.sha256(desc_json.encode()).digest()
        for i, (name, t) in enumerate(self._layers):
            # Each layer's value names the whole layout and its own place in it.
            self._layer_digests[name] = hashlib.sha256(
                desc_json.encode() + b"\0" + name.encode() + b"\0" + str(self._layer_names.index(name)).encode()
            ).digest()
            self._layer_value_bytes[name] = HEADER_BYTES + self._kernel_blocks * t[0].numel() * t.element_size()
        self._block_value_bytes = HEADER_BYTES + sum(
            self._kernel_blocks * t[0].numel() * t.element_size() for _, t in self._layers)
        if first.is_cuda:
            self._load_stream = torch.cuda.Stream(device=first.device)
        # Blocks in the daemon's GPU tier come by device handle when the KV cache is on
        # that device: a CUDA cache opens CUDA IPC handles (device-to-device copy, no
        # host hop); a CPU cache reads an emulated device's memory in place.
        self._device_reads = self.shm and (first.is_cuda or self.client.device_memory == "emulated")

    def _layer_view(self, name: str, block_id: int) -> torch.Tensor:
        k = self._kernel_blocks
        return self._layer_tensors[name][block_id * k : (block_id + 1) * k]

    def _pack_layer(self, name: str, block_id: int) -> bytes:
        v = self._layer_view(name, block_id)
        return b"".join([LAYER_MAGIC, self._layer_digests[name],
                         v.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()])

    def _unpack_layer_into(self, name: str, block_id: int, value: Optional[bytes]) -> bool:
        if value is None or len(value) != self._layer_value_bytes[name]:
            return False
        head = _head(value)
        if head[: len(LAYER_MAGIC)] != LAYER_MAGIC or head[len(LAYER_MAGIC) :] != self._layer_digests[name]:
            return False
        view = self._layer_view(name, block_id)
        src = _as_uint8(value)[HEADER_BYTES:]
        view.copy_(src.view(view.dtype).view(view.shape), non_blocking=False)
        return True

    def _fetch_into(self, keys: List[bytes], fill) -> List[bool]:
        """Fetches ``keys`` and hands each value (or None) to ``fill(i, value)``, which
        copies it into the cache and says whether it fit. A batch of keys per call,
        each copied into the cache before the next is asked for: host memory stays a
        batch's, not the prefix's (black-box finding: over the socket 1,200 blocks held
        640 MiB at once), and a batch's leases stay within the session's share of the
        arena. Attached to the arena, values are read in place there (leased together,
        or Gets sent together for device handles) and released once copied; else one
        BatchGet per batch. While loads are paused after the daemon failed, every value
        is None at once."""
        if self._load_pause.active():
            return [fill(i, None) for i in range(len(keys))]
        out: List[bool] = []
        for start in range(0, len(keys), VIEW_BATCH):
            chunk = keys[start : start + VIEW_BATCH]
            try:
                if self.shm:
                    views = self.client.get_views(chunk, device=self._device_reads)
                else:
                    values = self.client.batched_get(chunk)
                self._load_pause.outcome(None)
            except KvError as e:
                self._load_pause.outcome(e)
                self._refused("load", e)
                return out + [fill(j, None) for j in range(start, len(keys))]
            if not self.shm:
                out.extend(fill(start + j, v) for j, v in enumerate(values))
                continue
            try:
                for j, (key, view) in enumerate(zip(chunk, views)):
                    out.append(self._fill_view(start + j, key, view, fill))
            finally:
                for view in views:
                    if view is not None:
                        view.release()
        return out

    def _fill_view(self, i: int, key: bytes, view, fill) -> bool:
        """``fill(i, ...)`` with one fetched view's bytes (None: a miss)."""
        if view is None:
            return fill(i, None)
        with view:
            value = view.data
            if view.device is not None:
                self.stats["device_reads"] += 1
                if view.device == "cuda":
                    try:
                        value = view.cuda_tensor(self._layers[0][1].device.index)
                    except (OSError, ValueError) as e:
                        # Another GPU (or no peer access): bytes from now on.
                        logger.warning("strata: CUDA IPC handle did not open (%s); loading bytes", e)
                        self._device_reads = False
                        view.release()
                        return fill(i, self.client.get(key))
            elif view.shared:
                self.stats["shm_reads"] += 1
            return fill(i, value)

    def _block_views(self, ids: Tuple[int, ...]) -> List[Optional[torch.Tensor]]:
        """Each layer's view of one block (its group's block ``ids[group]``); None for
        a layer whose group holds the null block there."""
        k = self._kernel_blocks
        out: List[Optional[torch.Tensor]] = []
        for name, t in self._layers:
            b = ids[self._layer_group.get(name, 0)]
            out.append(None if len(ids) > 1 and b == NULL_BLOCK_ID else t[b * k : (b + 1) * k])
        return out

    def _pack(self, ids: Tuple[int, ...]) -> Optional[bytes]:
        """A block's value; None when a group no longer holds it (never a value with a
        hole: a load of it would fill the layer with another block's bytes)."""
        parts = [VALUE_MAGIC, self._layout_digest]
        for v in self._block_views(ids):
            if v is None:
                return None
            parts.append(v.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
        return b"".join(parts)

    def _unpack_into(self, ids: Tuple[int, ...], value: Optional[bytes]) -> bool:
        if value is None or len(value) != self._block_value_bytes:
            return False
        head = _head(value)
        if head[: len(VALUE_MAGIC)] != VALUE_MAGIC or head[len(VALUE_MAGIC) :] != self._layout_digest:
            return False
        buf = _as_uint8(value)
        off = HEADER_BYTES
        for (_, t), view in zip(self._layers, self._block_views(ids)):
            n = self._kernel_blocks * t[0].numel() * t.element_size()
            if view is not None:  # a group's null block: vLLM reads nothing there
                view.copy_(buf[off : off + n].view(view.dtype).view(view.shape), non_blocking=False)
            off += n
        return True

    def _load(self, transfer: BlockTransfer) -> None:
        keys = [rank_key(h, self.tp_rank, self.pp_rank) for h, _ in transfer.blocks]
        started = time.monotonic()
        ctx = torch.cuda.stream(self._load_stream) if self._load_stream is not None else nullcontext()
        with ctx:
            ok = self._fetch_into(keys, lambda i, v: self._unpack_into(transfer.ids(i), v))
        failed = [b for (_, b), good in zip(transfer.blocks, ok) if not good]
        self.stats["loaded_blocks"] += len(ok) - len(failed)
        if self._load_stream is not None:
            self._load_stream.synchronize()
        with self._lock:
            if not failed:
                self._load_times.record([transfer.req_id], (time.monotonic() - started) * 1e6)
            if failed:
                self.stats["load_errors"] += len(failed)
                logger.warning("strata: %d of %d blocks of %s did not load; vLLM recomputes them",
                               len(failed), len(keys), transfer.req_id)
                if self._num_groups > 1:
                    # Block ids are per group there: vLLM takes the request's failure only.
                    self._failed_loads.add(transfer.req_id)
                else:
                    # Errors before completion: vLLM must see them no later than the request.
                    self._load_errors.update(failed)
            self._finished_loads.add(transfer.req_id)

    def _save(self, req_id: str, items: List[Tuple[bytes, bytes]]) -> None:
        try:
            for key, value in items:
                if self._save_pause.active():
                    self.stats["save_dropped"] += 1
                    continue
                try:
                    self.client.put(key, value)
                    self.stats["saved_blocks"] += 1
                    self._save_pause.outcome(None)
                except KvError as e:
                    self.stats["save_errors"] += 1
                    self._save_pause.outcome(e)
                    self._refused(f"save of {req_id}", e)
        finally:
            with self._lock:
                self._pending_save_bytes -= sum(len(v) for _, v in items)

    def _submit_save(self, req_id: str, items: List[Tuple[bytes, bytes]]) -> None:
        """Queues a save, or drops it while the daemon is paused or the queue holds
        more than ``max_pending_save_mb`` of copies (a cache: a dropped save is a later
        miss, never a wrong load)."""
        size = sum(len(v) for _, v in items)
        with self._lock:
            # One step's save larger than the cap still goes when nothing waits (it is
            # in memory already; black-box finding: an 8k-token chunk of an 8B model is
            # just over the 1 GiB default, and was dropped every time).
            full = (self._pending_save_bytes > 0
                    and self._pending_save_bytes + size > self.max_pending_save_bytes)
            if not full and not self._save_pause.active():
                self._pending_save_bytes += size
                queued = True
            else:
                queued = False
        if not queued:
            self.stats["save_dropped"] += len(items)
            return
        self._submit(self._save, req_id, items)

    def _load_layers(self, blocks: List[Tuple[bytes, int]], ready: Dict[str, threading.Event],
                     req_ids: Sequence[str] = ()) -> None:
        """Fetches and fills the layers in the order the model runs them, each
        announced as soon as its blocks are in (a failed block is a load error)."""
        names = [n for n in self._layer_names if n in ready]
        failed_any: set = set()
        started = time.monotonic()
        for name in names:
            li = self._layer_names.index(name)
            failed: List[int] = []
            try:
                keys = [layer_key(h, self.tp_rank, self.pp_rank, li) for h, _ in blocks]
                ctx = torch.cuda.stream(self._load_stream) if self._load_stream is not None else nullcontext()
                with ctx:
                    ok = self._fetch_into(keys, lambda i, v: self._unpack_layer_into(name, blocks[i][1], v))
                failed = [b for (_, b), good in zip(blocks, ok) if not good]
                if self._load_stream is not None:
                    self._load_stream.synchronize()
            except Exception:  # noqa: BLE001 - any failure is this layer's load error
                logger.exception("strata: loading layer %s failed", name)
                failed = [b for _, b in blocks]
            finally:
                with self._lock:
                    if failed:
                        self._count_load_errors(failed)
                        failed_any.update(failed)
                    else:
                        self.stats["loaded_layer_blocks"] = self.stats.get("loaded_layer_blocks", 0) + len(blocks)
                    if name == names[-1]:
                        # A block is loaded once all its layers are, counted before the
                        # last layer is announced (black-box finding: this counter stayed
                        # 0 layer by layer, as if nothing loaded).
                        self.stats["loaded_blocks"] += sum(1 for _, b in blocks if b not in failed_any)
                        if not failed_any and req_ids:
                            self._load_times.record(req_ids, (time.monotonic() - started) * 1e6)
                ready[name].set()

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._connector_metadata
        if not isinstance(meta, StrataConnectorMetadata) or not self._layers:
            return
        if self.layerwise:
            blocks = [b for t in meta.loads for b in t.blocks]
            self._layer_ready = {}
            self._layer_load_blocks = [b for _, b in blocks]
            if blocks:
                self._layer_ready = {n: threading.Event() for n in self._layer_names}
                self._submit(self._load_layers, blocks, self._layer_ready, [t.req_id for t in meta.loads],
                             executor=self._load_io)
            return
        for transfer in meta.loads:
            self._submit(self._load, transfer, executor=self._load_io)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Whole blocks load asynchronously (load_async=True): such a request runs only
        # after its load finished. Layer by layer: wait for this layer only.
        ready = self._layer_ready.get(layer_name)
        if ready is None or ready.wait(timeout=self.timeout_s):
            return
        # Late: the forward pass goes on; vLLM recomputes the blocks reported here.
        logger.warning("strata: layer %s did not load within %.0f s", layer_name, self.timeout_s)
        with self._lock:
            self._count_load_errors(self._layer_load_blocks)

    def _count_load_errors(self, blocks) -> None:
        """Adds ``blocks`` to this step's load errors, counting each once (a layer that
        timed out here and then failed in the load thread is one error per block).
        Under ``self._lock``."""
        before = len(self._load_errors)
        self._load_errors.update(blocks)
        self.stats["load_errors"] += len(self._load_errors) - before

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        # Whole blocks are saved once every layer is written: in wait_for_save. Layer by
        # layer: this layer's blocks are final now; copied out here, sent in the
        # background while the next layers compute.
        meta = self._connector_metadata
        if not self.layerwise or not isinstance(meta, StrataConnectorMetadata) or layer_name not in self._layer_digests:
            return
        li = self._layer_names.index(layer_name)
        for transfer in meta.saves:
            items = [(layer_key(h, self.tp_rank, self.pp_rank, li), self._pack_layer(layer_name, b))
                     for h, b in transfer.blocks]
            self._submit_save(transfer.req_id, items)

    def wait_for_save(self):
        meta = self._connector_metadata
        if not isinstance(meta, StrataConnectorMetadata) or not self._layers or self.layerwise:
            return
        for transfer in meta.saves:
            # Copied out now, before vLLM may reuse the blocks; sent in the background.
            items = []
            for i, (h, _) in enumerate(transfer.blocks):
                value = self._pack(transfer.ids(i))
                if value is None:
                    self.stats["unsaveable_blocks"] = self.stats.get("unsaveable_blocks", 0) + 1
                    continue
                items.append((rank_key(h, self.tp_rank, self.pp_rank), value))
            self._submit_save(transfer.req_id, items)

    def _submit(self, fn, *args, executor: Optional[ThreadPoolExecutor] = None) -> None:
        fut = (executor or self._io).submit(fn, *args)
        with self._lock:
            self._io_futures = [f for f in self._io_futures if not f.done()]
            self._io_futures.append(fut)

    def idle(self) -> bool:
        """Whether every background load and save submitted so far has finished."""
        with self._lock:
            return all(f.done() for f in self._io_futures)

    def flush(self, timeout: Optional[float] = None) -> None:
        """Waits for the background loads and saves submitted so far."""
        with self._lock:
            futs = list(self._io_futures)
        for f in futs:
            f.result(timeout=timeout)

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        """The load times measured since the last call (worker side), for the
        scheduler's ``LoadClock``; None when there are none."""
        with self._lock:
            if self._load_times.is_empty():
                return None
            out, self._load_times = self._load_times, StrataKVConnectorStats()
        return out

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> Optional[KVConnectorStats]:
        return StrataKVConnectorStats(data=dict(data) if data is not None else {})

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        with self._lock:
            done, self._finished_loads = self._finished_loads, set()
        return None, (done or None)

    def get_transfer_results(self, finished_req_ids: Set[str]) -> KVConnectorTransferResults:
        """Finished loads, and (several KV cache groups) the requests whose load
        failed: vLLM recomputes those, as it recomputes a single group's failed blocks."""
        with self._lock:  # one lock: a load is never reported finished twice
            done, self._finished_loads = self._finished_loads, set()
            failed, self._failed_loads = self._failed_loads, set()
        return KVConnectorTransferResults(finished_recving=done | failed, failed_recving=failed)

    def reset_cache(self) -> bool:
        """Not done: KV in Strata is shared across engines and restarts, keyed by the
        model identity. False, so vLLM reports the reset as failed (black-box finding:
        the base class's None read as success, and pre-reset KV kept loading)."""
        logger.warning("strata: a connector cache reset is not done: KV is keyed by the model identity; "
                       "after new weights set \"revision\" in kv_connector_extra_config to their checksum")
        return False

    def get_block_ids_with_load_errors(self) -> Set[int]:
        with self._lock:
            errs, self._load_errors = self._load_errors, set()
        return errs

    def shutdown(self):
        # Saves not started are dropped (black-box finding: with the daemon stopped,
        # shutdown waited for every queued save, one timeout_s each).
        self._io.shutdown(wait=True, cancel_futures=True)
        self._load_io.shutdown(wait=True, cancel_futures=True)
        self.client.close()


def _head(value) -> bytes:
    """A value's header (magic + layout digest) as host bytes; a CUDA value (a block
    opened by IPC handle) copies just these 40 bytes to the host."""
    if isinstance(value, torch.Tensor):
        return bytes(value[:HEADER_BYTES].cpu().numpy())
    return bytes(value[:HEADER_BYTES])


def _as_uint8(value) -> torch.Tensor:
    """A uint8 tensor over a value's bytes without copying them: ``bytes`` from the
    socket, a read-only view into the shared-memory arena or an emulated device's
    memory (only ever read from), or a CUDA tensor over a block opened by IPC handle."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bytes):
        value = bytearray(value)  # torch wants a writable buffer; bytes are immutable
        return torch.frombuffer(value, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "buffer is not writable": only read
        return torch.frombuffer(value, dtype=torch.uint8)


def _ranks() -> Tuple[int, int]:
    """This worker's (TP rank, PP rank); (0, 0) before vLLM's groups exist."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group, model_parallel_is_initialized

        if model_parallel_is_initialized():
            return get_tp_group().rank_in_group, get_pp_group().rank_in_group
    except (ImportError, AssertionError, AttributeError):
        pass
    return 0, 0


__all__ = ["StrataConnector", "StrataConnectorMetadata", "model_identity_of", "request_identity"]
