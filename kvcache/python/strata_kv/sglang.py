"""SGLang HiCache storage backend on Strata (issue 15).

Load it as a dynamic backend::

    python -m sglang.launch_server --model-path ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "strata",
        "module_path": "strata_kv.sglang", "class_name": "StrataHiCacheStorage",
        "interface_v1": 1, "strata_addr": "unix:///run/strata/kv.sock",
        "namespace": "llama3-8b", "revision": "<weights commit>"}'

Keys: SGLang names a page by its own chain hash (tokens, LoRA/extra key and cache salt
already in it). Strata binds that name to the model identity (v2 derivation: model,
revision, KV dtype, host layout, page size, RoPE scaling, TP/PP size, and the host
pool's geometry, :func:`pool_geometry`: layer count, KV heads, head dims, dtype, layout,
page size and bytes, as the pool exposes them, in the identity's ``x.kv_geometry``) and
to the rank's share of the page (:func:`strata_kv.rank_key`), so pages of another
revision, layout or geometry are a miss, never a load, even when two models are served
under one name into one namespace, and every rank stores and loads only its own share.
With pipeline parallelism the stages' layer counts may differ: the per-stage fields
(layer counts, page shape and bytes) are then left out (every rank's identity must be the
same), and a page of another size is still refused on load. A hybrid model's other
pools (v2 API) name their pages with the pool's name and its geometry likewise.

A daemon that stops answering (stopped, frozen, gone) costs one bounded call: a batch
(``batch_set_v1``, ``batch_get_v1``, their v2 forms) has one deadline of ``timeout_s``
for all its pages, and after a call fails unavailable or past its deadline every call
is skipped for 2 s, doubling with each failure in a row up to 30 s (lookups miss, gets
fail, sets are dropped and counted in ``set_dropped``), until the daemon answers again.
"""

from __future__ import annotations

import json
import logging
import warnings
import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from ._pause import Pause
from .client import KvClient, KvError, check_namespace, config_flag, namespace_from_name
from .keys import V2_ROOT, ModelIdentity, _canonical_json, block_hash_v2, rank_key

logger = logging.getLogger(__name__)

#: Prefix of the extras that carry SGLang's page hash into a v2 key: keeps these keys
#: apart from token-chained v2 keys of the same identity.
SGLANG_PAGE_TAG = b"sglang-page:"


def sglang_page_key(identity_digest: bytes, page_hash: str, tp_share: int, pp_rank: int) -> bytes:
    """The Strata key of one rank's share of an SGLang page.

    ``block_hash_v2(identity, V2_ROOT, [], b"sglang-page:" + page_hash)`` then
    :func:`rank_key`: the page hash already chains the tokens, so the v2 hash adds the
    model identity without re-hashing tokens SGLang never hands to a storage backend.
    """
    h = block_hash_v2(identity_digest, V2_ROOT, [], SGLANG_PAGE_TAG + page_hash.encode())
    return rank_key(h, tp_share, pp_rank)


#: Host pool attributes that fix the bytes of a page (SGLang 0.5.23's MHA, MLA, Mamba,
#: DSA indexer, ... host pools; those a pool lacks are left out).
GEOMETRY_ATTRS = (
    "layer_num", "target_layer_num", "head_num", "head_dim", "v_head_dim", "head_group_num",
    "kv_lora_rank", "qk_rope_head_dim", "kv_cache_dim", "dsa_kv_cache_store_fp8",
    "num_mamba_layers", "conv_state_shapes", "temporal_state_shape", "conv_dtype", "temporal_dtype",
    "indexer_dtype", "indexer_page_stride_size", "size_per_token", "page_size", "dtype", "layout",
    "storage_format_tag", "stores_page_envelope",
)
#: The fields that depend on how many layers a pipeline stage holds.
PER_STAGE_GEOMETRY = frozenset({"layer_num", "target_layer_num", "num_mamba_layers", "size_per_token",
                                "page_shape", "page_bytes"})


def _plain(value: Any) -> Any:
    """``value`` as JSON (dtypes and enums by name, shapes as lists); None if it has none."""
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (list, tuple)):  # torch.Size too
        items = [_plain(v) for v in value]
        return None if any(v is None for v in items) else items
    return None


def pool_geometry(pool: Any, pp_size: int = 1) -> Dict[str, Any]:
    """What fixes the bytes of one page of ``pool`` (an SGLang host pool): the
    :data:`GEOMETRY_ATTRS` it has, and its flat page's shape, dtype and size. Two pools
    whose pages hold the same number of bytes in another arrangement (2 layers x 8 heads,
    4 layers x 4 heads) differ here. With ``pp_size > 1`` the per-stage fields
    (:data:`PER_STAGE_GEOMETRY`) are left out: every rank must name a page alike."""
    geo: Dict[str, Any] = {}
    for name in GEOMETRY_ATTRS:
        value = _plain(getattr(pool, name, None))
        if value is not None:
            geo[name] = value
    try:
        page = pool.get_dummy_flat_data_page()
    except Exception:  # a pool without flat pages: its attributes only
        page = None
    if page is not None:
        geo["page_shape"] = [int(d) for d in page.shape]
        geo["page_dtype"] = str(page.dtype)
        geo["page_bytes"] = int(page.numel() * page.element_size())
    if pp_size > 1:
        geo = {k: v for k, v in geo.items() if k not in PER_STAGE_GEOMETRY}
    return geo


def _rope_scaling_of(model_path: Optional[str]) -> Any:
    """RoPE scaling from a local model directory's config.json (None when not local)."""
    if not model_path:
        return None
    path = os.path.join(model_path, "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    return cfg.get("rope_scaling", cfg.get("rope_parameters"))


def _served_weights() -> Tuple[Optional[str], Optional[str]]:
    """The model path and revision the SGLang server was started with (None, None when
    no server published its arguments: a backend built outside one)."""
    try:
        from sglang.srt.runtime_context import get_server_args

        args = get_server_args()
    except Exception:  # noqa: BLE001 - no server context in this process
        return None, None
    path = getattr(args, "model_path", None)
    revision = getattr(args, "revision", None)
    return (str(path) if path else None), (str(revision) if revision else None)


class StrataHiCacheStorage(HiCacheStorage):
    """A :class:`HiCacheStorage` whose pages live in a Strata KV service.

    ``extra_config`` (``--hicache-storage-backend-extra-config``) keys:
    ``strata_addr`` (default ``$STRATA_KV_ADDR`` or ``127.0.0.1:7070``), ``namespace``
    (default: the model name; past 128 bytes, its tail and a digest), ``token`` (default ``$STRATA_KV_TOKEN``), and the identity
    fields SGLang does not hand a backend: ``revision``, ``rope_scaling`` (read from the
    model directory's config.json when it is local and this is absent), ``kv_dtype``
    (default: the host pool's dtype), ``cache_salt``, ``identity_extra`` (a dict).
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        extra = dict(storage_config.extra_config or {})
        self._extra = extra
        self.addr = extra.get("strata_addr") or os.environ.get("STRATA_KV_ADDR", "127.0.0.1:7070")
        # The model name by default, shortened with a digest past the service's 128 bytes.
        self.namespace = check_namespace(extra.get("namespace") or namespace_from_name(storage_config.model_name or "default"))
        self._token = extra.get("token") or os.environ.get("STRATA_KV_TOKEN")
        # Seconds per call: a store that does not answer must not stall prefetch forever.
        self._timeout = float(extra.get("timeout_s", 30.0))
        # Same host (a unix:// address): pages are read in place from the daemon's
        # shared-memory arena and copied once, into the host pool ("shm": false to not).
        self._shm = config_flag("shm", extra.get("shm", str(self.addr).startswith("unix:")))
        if self._shm and not str(self.addr).startswith("unix:"):
            # Refused here, at the engine's start, as the vLLM connector does (black-box
            # finding: it was accepted, then every storage call raised ValueError).
            raise ValueError(f"StrataHiCacheStorage: \"shm\": true needs a unix:// strata_addr, "
                             f"got {self.addr!r}")

        sc = storage_config
        cp = max(1, sc.attn_cp_size)
        if sc.is_mla_model:
            # MLA KV is the same on every TP rank: one share per DCP shard, written by
            # the first DCP group only (sc.is_storage_writer).
            self._tp_share = sc.dcp_rank * cp + sc.attn_cp_rank
            self._tp_shares = sc.dcp_size * cp
        else:
            # Under attention context parallelism each CP rank holds a disjoint slice.
            self._tp_share = sc.tp_rank * cp + sc.attn_cp_rank
            self._tp_shares = sc.tp_size * cp
        self._pp_rank = sc.pp_rank
        self._pp_size = sc.pp_size
        self._writer = sc.is_storage_writer

        self.mem_pool_host = None
        self._page_bytes: Optional[int] = None
        #: Extra host pools (v2) by name: their page layout, part of their page names.
        self._pool_tags: Dict[str, str] = {}
        self._identity = self._make_identity(None)
        self._client: Optional[KvClient] = None
        self._lock = threading.Lock()
        #: After a call the daemon did not answer (unavailable, past its deadline): no
        #: call for a while (see the module doc), so one batch costs one bounded call.
        self._pause = Pause()
        self._stats = {"pages_read": 0, "pages_written": 0, "bytes_read": 0, "bytes_written": 0,
                       "misses": 0, "errors": 0, "identity_refusals": 0, "device_reads": 0,
                       "set_dropped": 0, "paused_skips": 0}

    # -- identity and keys ----------------------------------------------------------

    def _make_identity(self, host_pool: Any) -> ModelIdentity:
        sc, extra = self.storage_config, self._extra
        kv_dtype = extra.get("kv_dtype") or (str(host_pool.dtype) if host_pool is not None else "")
        layout = "sglang:" + (getattr(host_pool, "layout", None) or
                              ("page_first" if sc.is_page_first_layout else "layer_first"))
        fmt = getattr(host_pool, "storage_format_tag", None) if host_pool is not None else None
        if fmt:
            layout += ":" + fmt
        if sc.is_mla_model:
            layout += ":mla"
        page = getattr(host_pool, "page_size", None) or sc.logical_page_size or 0
        # The weights the server loaded, not the name it serves them under: SGLang hands
        # a backend `--served-model-name` (black-box finding: two fine-tunes of one base
        # served as "chat" had one identity and loaded each other's pages).
        model_path, served_revision = _served_weights()
        model = model_path or sc.model_name or self.namespace
        rope = extra["rope_scaling"] if "rope_scaling" in extra else _rope_scaling_of(model)
        identity_extra = {str(k): str(v) for k, v in (extra.get("identity_extra") or {}).items()}
        identity_extra["engine"] = "sglang"
        if host_pool is not None:
            # Layers, heads, head dims, page bytes...: KV of another geometry served under
            # the same model name is another model's KV.
            identity_extra["kv_geometry"] = _canonical_json(pool_geometry(host_pool, sc.pp_size))
        if sc.attn_cp_size > 1:
            identity_extra["attn_cp_size"] = str(sc.attn_cp_size)
        if sc.dcp_size > 1:
            identity_extra["dcp_size"] = str(sc.dcp_size)
        return ModelIdentity(
            model=model,
            revision=str(extra.get("revision", served_revision or "")),
            kv_dtype=kv_dtype,
            kv_layout=layout,
            block_tokens=int(page),
            rope_scaling=rope,
            tp_size=sc.tp_size,
            pp_size=sc.pp_size,
            cache_salt=str(extra.get("cache_salt", "")),
            extra=identity_extra,
        )

    @property
    def identity(self) -> ModelIdentity:
        return self._identity

    def _key(self, page_hash: str, tp_share: Optional[int] = None, pp_rank: Optional[int] = None) -> bytes:
        return sglang_page_key(
            self._identity.digest(),
            page_hash,
            self._tp_share if tp_share is None else tp_share,
            self._pp_rank if pp_rank is None else pp_rank,
        )

    def _conn(self) -> KvClient:
        """The client (made on first use). Raises :class:`KvError` (``DEADLINE_EXCEEDED``)
        when the daemon's arena does not answer the attach within ``timeout_s``."""
        with self._lock:
            if self._client is None:
                try:
                    self._client = KvClient(self.addr, namespace=self.namespace, token=self._token,
                                            timeout=self._timeout, identity=self._identity, shm=self._shm)
                except TimeoutError as e:  # a stopped daemon: tried again after the pause
                    raise KvError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"shared-memory attach timed out: {e}") from None
                except OSError as e:  # no arena (off, or tenants): bytes through the socket
                    logger.warning("strata: shared memory unavailable (%s); reading through the socket", e)
                    self._shm = False
                    self._client = KvClient(self.addr, namespace=self.namespace, token=self._token,
                                            timeout=self._timeout, identity=self._identity)
            return self._client

    def _paused(self, pages: int = 1) -> bool:
        """True while calls are paused after the daemon failed (``pages`` skipped)."""
        if self._pause.active():
            self._stats["paused_skips"] += pages
            return True
        return False

    def _answered(self) -> None:
        self._pause.outcome(None)

    def _failed(self, what: str, e: KvError) -> None:
        self._pause.outcome(e)  # unavailable or past its deadline: pause
        if e.code == grpc.StatusCode.FAILED_PRECONDITION:
            # The namespace is bound to another model identity: a miss, never a load.
            self._stats["identity_refusals"] += 1
            logger.warning("strata: %s refused, namespace %r holds another model identity: %s",
                           what, self.namespace, e.message)
        else:
            self._stats["errors"] += 1
            logger.warning("strata: %s failed: %s", what, e)

    # -- HiCacheStorage -------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        # The host pool fixes the page's dtype, layout and size: part of the identity.
        with self._lock:
            self._identity = self._make_identity(mem_pool_host)
            if self._client is not None:
                self._client.close()
                self._client = None
        page = mem_pool_host.get_dummy_flat_data_page()
        self._page_bytes = page.numel() * page.element_size()

    def exists(self, key: str) -> bool:
        if self._paused():
            return False
        try:
            found = self._conn().exists(self._key(key))
        except KvError as e:
            self._failed("exists", e)
            return False
        self._answered()
        return found

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """Leading pages whose every share (all TP/CP shares, all PP stages) is stored:
        every rank asks the same question, so every rank gets the same answer."""
        if not keys or self._paused(len(keys)):
            return 0
        shares = [(t, p) for p in range(self._pp_size) for t in range(self._tp_shares)]
        digest = self._identity.digest()
        probe = [sglang_page_key(digest, k, t, p) for k in keys for t, p in shares]
        try:
            if len(shares) == 1:
                matched = self._conn().match_prefix(probe)
                self._answered()
                return matched
            present = self._conn().batch_exists(probe)
        except KvError as e:
            self._failed("batch_exists", e)
            return 0
        self._answered()
        n = len(shares)
        for i in range(len(keys)):
            if not all(present[i * n : (i + 1) * n]):
                return i
        return len(keys)

    def _fetch(self, keys: Sequence[str]) -> List[Optional[bytes]]:
        if self._paused(len(keys)):
            return [None] * len(keys)
        try:
            out = self._conn().batched_get([self._key(k) for k in keys])
        except KvError as e:
            self._failed("get", e)
            return [None] * len(keys)
        self._answered()
        for data in out:
            if data is None:
                self._stats["misses"] += 1
            else:
                self._stats["pages_read"] += 1
                self._stats["bytes_read"] += len(data)
        return out

    @staticmethod
    def _fill(target: torch.Tensor, data: bytes) -> bool:
        flat = target.view(-1).view(torch.uint8) if target.is_contiguous() else None
        if flat is None or flat.numel() != len(data):
            return False
        flat.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return True

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None):
        datas = self._fetch(keys)
        out: List[Optional[torch.Tensor]] = []
        for i, data in enumerate(datas):
            if data is None:
                out.append(None)
                continue
            target = target_locations[i] if target_locations is not None else None
            if target is None:
                out.append(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            elif self._fill(target, data):
                out.append(target)
            else:
                # A page of another size is not this model's page: never load it.
                self._stats["errors"] += 1
                logger.warning("strata: page %s is %d bytes, the target holds %d", keys[i], len(data),
                               target.numel() * target.element_size())
                out.append(None)
        return out

    @staticmethod
    def _bytes_of(value: torch.Tensor) -> bytes:
        return value.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()

    def _put(self, keys: Sequence[str], blobs: Sequence[bytes]) -> List[bool]:
        """Stores the pages in order, the batch within one deadline of ``timeout_s``: a
        daemon that stops answering costs one bounded call (not one per page); the pages
        not sent (past the deadline, or paused after a failure) are dropped (False,
        counted in ``set_dropped``)."""
        ok = [False] * len(keys)
        if not keys:
            return ok
        if self._pause.active():
            self._stats["set_dropped"] += len(keys)
            return ok
        deadline = time.monotonic() + self._timeout
        try:
            conn = self._conn()
        except KvError as e:
            self._failed("put", e)
            self._stats["set_dropped"] += len(keys)
            return ok
        for i, (k, b) in enumerate(zip(keys, blobs)):
            left = deadline - time.monotonic()
            if left <= 0 or self._pause.active():
                self._stats["set_dropped"] += len(keys) - i
                logger.warning("strata: %d of %d pages not stored (%s)", len(keys) - i, len(keys),
                               "the batch's deadline passed" if left <= 0 else "the daemon failed")
                break
            try:
                conn.put(self._key(k), b, timeout=left)
            except KvError as e:
                self._failed("put", e)
                continue
            self._answered()
            ok[i] = True
            self._stats["pages_written"] += 1
            self._stats["bytes_written"] += len(b)
        return ok

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        if not self._writer:
            return True  # another rank writes this replicated (MLA) share
        if values is None or len(values) != len(keys):
            return False
        return all(self._put(keys, [self._bytes_of(v) for v in values]))

    # -- v1: pages straight from and into the host pool ------------------------------

    def _page_offsets(self, keys: Sequence[str], host_indices: torch.Tensor) -> List[int]:
        page = self.mem_pool_host.page_size
        if host_indices.numel() != len(keys) * page:
            raise ValueError(f"{len(keys)} pages but {host_indices.numel()} host indices (page {page})")
        return [int(host_indices[i * page].item()) for i in range(len(keys))]

    def _read_pages(self, pool: Any, page_bytes: int, strata_keys: Sequence[bytes],
                    offsets: Sequence[int]) -> List[bool]:
        """Pages ``strata_keys`` into ``pool`` at ``offsets``: attached to the arena, each
        read in place (by device handle when the daemon's GPU tier is emulated, i.e. in
        host memory like the pool) and copied once into the pool; else one BatchGet.
        A value of another size than the pool's page is not loaded. The batch has one
        deadline of ``timeout_s``; pages past it, or while paused, are not loaded."""
        if not strata_keys or self._paused(len(strata_keys)):
            return [False] * len(strata_keys)
        deadline = time.monotonic() + self._timeout
        try:
            client = self._conn()
        except KvError as e:
            self._failed("get", e)
            return [False] * len(strata_keys)
        if not self._shm:
            try:
                values = client.batched_get(list(strata_keys))
            except KvError as e:
                self._failed("get", e)
                return [False] * len(strata_keys)
            self._answered()
            results = []
            for off, data in zip(offsets, values):
                if data is None:
                    self._stats["misses"] += 1
                    results.append(False)
                    continue
                if len(data) != page_bytes:
                    self._stats["errors"] += 1
                    results.append(False)
                    continue
                page = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(pool.dtype)
                pool.set_from_flat_data_page(off, page)
                self._stats["pages_read"] += 1
                self._stats["bytes_read"] += page_bytes
                results.append(True)
            return results
        # The host pool is in host memory: an emulated GPU tier's blocks are read in place
        # in its memory by handle (a CUDA tier's would need a device-to-host copy here,
        # which the daemon's own read does as well: those come as bytes).
        device = client.device_memory == "emulated"
        left = deadline - time.monotonic()
        if left <= 0:
            return [False] * len(strata_keys)
        # The batch's Gets go together (one round trip, not one per page), bounded by the
        # batch's deadline.
        try:
            views = client.get_views(list(strata_keys), device=device, timeout=left)
        except KvError as e:
            self._failed("get", e)
            return [False] * len(strata_keys)
        self._answered()
        results: List[bool] = []
        try:
            for view, off in zip(views, offsets):
                self._load_view(pool, page_bytes, view, off, results)
        finally:
            # Leases of pages not reached (an error while copying one) go back too.
            for view in views[len(results) + 1:]:
                if view is not None:
                    view.release()
        return results

    def _load_view(self, pool, page_bytes: int, view, off: int, results: List[bool]) -> None:
        """Copies one page's view (None: a miss) into the host pool at ``off``; appends
        whether it loaded to ``results``."""
        if view is None:
            self._stats["misses"] += 1
            results.append(False)
            return
        with view:
            if len(view.data) != page_bytes:
                self._stats["errors"] += 1
                results.append(False)
                return
            with warnings.catch_warnings():
                # The arena is mapped read-only; torch only reads this view.
                warnings.filterwarnings("ignore", message="The given buffer is not writable")
                page = torch.frombuffer(view.data, dtype=torch.uint8).view(pool.dtype)
                pool.set_from_flat_data_page(off, page)
            if view.device is not None:
                self._stats["device_reads"] += 1
        self._stats["pages_read"] += 1
        self._stats["bytes_read"] += page_bytes
        results.append(True)

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        offsets = self._page_offsets(keys, host_indices)
        return self._read_pages(self.mem_pool_host, self._page_bytes, [self._key(k) for k in keys], offsets)

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not self._writer:
            return [True] * len(keys)
        offsets = self._page_offsets(keys, host_indices)
        blobs = [self._bytes_of(self.mem_pool_host.get_data_page(off, flat=True)) for off in offsets]
        return self._put(keys, blobs)

    # -- v2: several host pools (hybrid models: SWA, Mamba, DSA indexer, ...) ----------

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        # A pool's pages are keyed with its name and its geometry: pages of another
        # geometry (another model's pool of that name, e.g. 1 layer x 4 heads against
        # 2 x 2, the same bytes) are a miss, never a load.
        tag = _canonical_json([str(host_pool_name), pool_geometry(host_pool, self._pp_size)])
        with self._lock:
            self._pool_tags[str(host_pool_name)] = tag

    def _v2_pool(self, name: Any) -> Optional[Any]:
        pools = getattr(self, "registered_pools", {}) or {}
        pool = pools.get(name)
        if pool is None and str(name) == str(PoolName.KV):
            pool = self.mem_pool_host
        return pool

    def _component(self, page_hash: str, name: Any) -> str:
        """The page name of ``name``'s part of a page: the KV pool's is SGLang's page
        hash itself (v1 and v2 share KV pages); another pool's adds its tag."""
        if str(name) == str(PoolName.KV):
            return page_hash
        tag = self._pool_tags.get(str(name))
        if tag is None:
            raise KeyError(f"pool {name} was not registered (register_mem_host_pool_v2)")
        return f"{page_hash}\0pool:{tag}"

    def _all_shares_present(self, page_names: Sequence[str]) -> List[bool]:
        """For each page name: is every TP/CP and PP share stored (the same answer on
        every rank, as batch_exists)."""
        if not page_names:
            return []
        if self._paused(len(page_names)):
            return [False] * len(page_names)
        shares = [(t, p) for p in range(self._pp_size) for t in range(self._tp_shares)]
        digest = self._identity.digest()
        probe = [sglang_page_key(digest, k, t, p) for k in page_names for t, p in shares]
        present = self._conn().batch_exists(probe)
        self._answered()
        n = len(shares)
        return [all(present[i * n : (i + 1) * n]) for i in range(len(page_names))]

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        """The leading KV pages stored (every share), cut by each extra pool's policy:
        ``ALL_PAGES`` needs the pool's page for every page of the prefix,
        ``TRAILING_PAGES`` only for the last ``len(transfer.keys)`` pages (a window ending
        at the prefix's end, so 5 may be restorable while 4 is not); the usable prefix is
        the longest length every pool can restore. ``BLOCK_GROUPS`` is refused (as by
        SGLang's own file backend): its group verdicts are not implemented here."""
        kv_pages = self.batch_exists(keys, extra_info)
        hit: Dict[str, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            if transfer.hit_policy not in (PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES):
                raise ValueError(f"Unsupported pool hit policy: {transfer.hit_policy}")
            if not restorable:
                break
            try:
                present = self._all_shares_present([self._component(k, transfer.name) for k in keys[:kv_pages]])
            except KvError as e:
                self._failed("batch_exists_v2", e)
                present = [False] * kv_pages
            if transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = next((i for i, ok in enumerate(present) if not ok), kv_pages)
                pool_restorable = set(range(1, boundary + 1))
            else:
                trailing = max(1, len(transfer.keys) if transfer.keys else 1)
                pool_restorable = {n for n in range(1, kv_pages + 1) if all(present[max(0, n - trailing) : n])}
                boundary = max(pool_restorable, default=0)
            if boundary:
                hit[transfer.name] = boundary
            restorable = [n for n in restorable if n in pool_restorable]
        return PoolTransferResult(restorable[-1] if restorable else 0, hit, restorable)

    def _v2_offsets(self, transfer: PoolTransfer, pool: Any) -> Optional[List[int]]:
        keys = transfer.keys or []
        page = getattr(pool, "page_size", 1) or 1
        idx = transfer.host_indices
        if idx is None or idx.numel() != len(keys) * page:
            logger.error("strata: pool %s: %d pages but %s host indices", transfer.name, len(keys),
                         None if idx is None else idx.numel())
            return None
        return [int(idx[i * page].item()) for i in range(len(keys))]

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[str, List[bool]]:
        """Each transfer's pages from Strata into its host pool (per-page success)."""
        out: Dict[str, List[bool]] = {}
        for t in transfers:
            keys = t.keys or []
            pool = self._v2_pool(t.name)
            offsets = self._v2_offsets(t, pool) if pool is not None else None
            if pool is None or offsets is None:
                out[t.name] = [False] * len(keys)
                continue
            page = pool.get_dummy_flat_data_page()
            names = [self._component(k, t.name) for k in keys]
            out[t.name] = self._read_pages(pool, page.numel() * page.element_size(),
                                           [self._key(n) for n in names], offsets)
        return out

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[str, List[bool]]:
        """Each transfer's pages from its host pool into Strata (per-page success)."""
        out: Dict[str, List[bool]] = {}
        for t in transfers:
            keys = t.keys or []
            if not self._writer:
                out[t.name] = [True] * len(keys)  # another rank writes this replicated share
                continue
            pool = self._v2_pool(t.name)
            offsets = self._v2_offsets(t, pool) if pool is not None else None
            if pool is None or offsets is None:
                out[t.name] = [False] * len(keys)
                continue
            blobs = [self._bytes_of(pool.get_data_page(off, flat=True)) for off in offsets]
            out[t.name] = self._put([self._component(k, t.name) for k in keys], blobs)
        return out

    def clear(self) -> None:
        # The namespace is shared with other engines and restarts: never wiped from
        # here. Raised, so SGLang reports the clear as failed rather than done
        # (black-box finding: it answered "cleared" and the pages kept loading).
        raise NotImplementedError(
            "Strata keeps KV pages shared across engines and restarts, keyed by the model "
            "identity: after new weights, give the extra config a new \"revision\" (a clean "
            "cache for them) rather than clearing")

    def get_stats(self) -> Dict[str, int]:
        return dict(self._stats)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


__all__ = ["StrataHiCacheStorage", "pool_geometry", "sglang_page_key"]
