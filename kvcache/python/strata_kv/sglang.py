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
revision, KV dtype, host layout, page size, RoPE scaling, TP/PP size) and to the rank's
share of the page (:func:`strata_kv.rank_key`), so pages of another revision or layout
are a miss, never a load, and every rank stores and loads only its own share.
"""

from __future__ import annotations

import json
import logging
import warnings
import os
import threading
from typing import Any, Dict, List, Optional, Sequence

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

from .client import KvClient, KvError
from .keys import V2_ROOT, ModelIdentity, block_hash_v2, rank_key

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


class StrataHiCacheStorage(HiCacheStorage):
    """A :class:`HiCacheStorage` whose pages live in a Strata KV service.

    ``extra_config`` (``--hicache-storage-backend-extra-config``) keys:
    ``strata_addr`` (default ``$STRATA_KV_ADDR`` or ``127.0.0.1:7070``), ``namespace``
    (default: the model name), ``token`` (default ``$STRATA_KV_TOKEN``), and the identity
    fields SGLang does not hand a backend: ``revision``, ``rope_scaling`` (read from the
    model directory's config.json when it is local and this is absent), ``kv_dtype``
    (default: the host pool's dtype), ``cache_salt``, ``identity_extra`` (a dict).
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        extra = dict(storage_config.extra_config or {})
        self._extra = extra
        self.addr = extra.get("strata_addr") or os.environ.get("STRATA_KV_ADDR", "127.0.0.1:7070")
        self.namespace = extra.get("namespace") or (storage_config.model_name or "default")
        self._token = extra.get("token") or os.environ.get("STRATA_KV_TOKEN")
        # Seconds per call: a store that does not answer must not stall prefetch forever.
        self._timeout = float(extra.get("timeout_s", 30.0))
        # Same host (a unix:// address): pages are read in place from the daemon's
        # shared-memory arena and copied once, into the host pool ("shm": false to not).
        self._shm = bool(extra.get("shm", str(self.addr).startswith("unix:")))

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
        self._stats = {"pages_read": 0, "pages_written": 0, "bytes_read": 0, "bytes_written": 0,
                       "misses": 0, "errors": 0, "identity_refusals": 0, "device_reads": 0}

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
        rope = extra["rope_scaling"] if "rope_scaling" in extra else _rope_scaling_of(sc.model_name)
        identity_extra = {str(k): str(v) for k, v in (extra.get("identity_extra") or {}).items()}
        identity_extra["engine"] = "sglang"
        if sc.attn_cp_size > 1:
            identity_extra["attn_cp_size"] = str(sc.attn_cp_size)
        if sc.dcp_size > 1:
            identity_extra["dcp_size"] = str(sc.dcp_size)
        return ModelIdentity(
            model=sc.model_name or self.namespace,
            revision=str(extra.get("revision", "")),
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
        with self._lock:
            if self._client is None:
                try:
                    self._client = KvClient(self.addr, namespace=self.namespace, token=self._token,
                                            timeout=self._timeout, identity=self._identity, shm=self._shm)
                except OSError as e:  # no arena (off, or tenants): bytes through the socket
                    logger.warning("strata: shared memory unavailable (%s); reading through the socket", e)
                    self._shm = False
                    self._client = KvClient(self.addr, namespace=self.namespace, token=self._token,
                                            timeout=self._timeout, identity=self._identity)
            return self._client

    def _failed(self, what: str, e: KvError) -> None:
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
        try:
            return self._conn().exists(self._key(key))
        except KvError as e:
            self._failed("exists", e)
            return False

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """Leading pages whose every share (all TP/CP shares, all PP stages) is stored:
        every rank asks the same question, so every rank gets the same answer."""
        if not keys:
            return 0
        shares = [(t, p) for p in range(self._pp_size) for t in range(self._tp_shares)]
        digest = self._identity.digest()
        probe = [sglang_page_key(digest, k, t, p) for k in keys for t, p in shares]
        try:
            if len(shares) == 1:
                return self._conn().match_prefix(probe)
            present = self._conn().batch_exists(probe)
        except KvError as e:
            self._failed("batch_exists", e)
            return 0
        n = len(shares)
        for i in range(len(keys)):
            if not all(present[i * n : (i + 1) * n]):
                return i
        return len(keys)

    def _fetch(self, keys: Sequence[str]) -> List[Optional[bytes]]:
        try:
            out = self._conn().batched_get([self._key(k) for k in keys])
        except KvError as e:
            self._failed("get", e)
            return [None] * len(keys)
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
        ok = []
        conn = self._conn()
        for k, b in zip(keys, blobs):
            try:
                conn.put(self._key(k), b)
                ok.append(True)
                self._stats["pages_written"] += 1
                self._stats["bytes_written"] += len(b)
            except KvError as e:
                self._failed("put", e)
                ok.append(False)
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
        A value of another size than the pool's page is not loaded."""
        client = self._conn()
        if not self._shm:
            try:
                values = client.batched_get(list(strata_keys))
            except KvError as e:
                self._failed("get", e)
                return [False] * len(strata_keys)
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
        results = []
        for key, off in zip(strata_keys, offsets):
            try:
                view = client.get_view(key, device=device)
            except KvError as e:
                self._failed("get", e)
                results.extend([False] * (len(strata_keys) - len(results)))
                return results
            if view is None:
                self._stats["misses"] += 1
                results.append(False)
                continue
            with view:
                if len(view.data) != page_bytes:
                    self._stats["errors"] += 1
                    results.append(False)
                    continue
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
        return results

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        offsets = self._page_offsets(keys, host_indices)
        self._conn()
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
        page = host_pool.get_dummy_flat_data_page()
        # A pool's pages are keyed with its name and its page layout: pages of another
        # shape or dtype (another model's pool of that name) are a miss, never a load.
        tag = json.dumps([str(host_pool_name), list(page.shape), str(page.dtype),
                          str(getattr(host_pool, "layout", ""))])
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
        shares = [(t, p) for p in range(self._pp_size) for t in range(self._tp_shares)]
        digest = self._identity.digest()
        probe = [sglang_page_key(digest, k, t, p) for k in page_names for t, p in shares]
        present = self._conn().batch_exists(probe)
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
        self._conn()
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
        # The namespace is shared with other engines and restarts: never wiped from here.
        pass

    def get_stats(self) -> Dict[str, int]:
        return dict(self._stats)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


__all__ = ["StrataHiCacheStorage", "sglang_page_key"]
