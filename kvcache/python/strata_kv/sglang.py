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

    def _get_v1_shared(self, keys: Sequence[str], offsets: Sequence[int]) -> List[bool]:
        """batch_get_v1 through the arena: each page read in place, one copy into the pool."""
        pool = self.mem_pool_host
        client = self._conn()
        results = []
        # The host pool is in host memory: an emulated GPU tier's blocks are read in place
        # in its memory by handle (a CUDA tier's would need a device-to-host copy here,
        # which the daemon's own read does as well: those come as bytes).
        device = client.device_memory == "emulated"
        for key, off in zip(keys, offsets):
            try:
                view = client.get_view(self._key(key), device=device)
            except KvError as e:
                self._failed("get", e)
                results.extend([False] * (len(keys) - len(results)))
                return results
            if view is None:
                self._stats["misses"] += 1
                results.append(False)
                continue
            with view:
                if len(view.data) != self._page_bytes:
                    self._stats["errors"] += 1
                    results.append(False)
                    continue
                with warnings.catch_warnings():
                    # The arena is mapped read-only; torch only reads this view.
                    warnings.filterwarnings("ignore", message="The given buffer is not writable")
                    page = torch.frombuffer(view.data, dtype=torch.uint8).view(pool.dtype)
                    pool.set_from_flat_data_page(off, page)
            self._stats["pages_read"] += 1
            self._stats["bytes_read"] += self._page_bytes
            if view.device is not None:
                self._stats["device_reads"] += 1
            results.append(True)
        return results

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        offsets = self._page_offsets(keys, host_indices)
        pool = self.mem_pool_host
        self._conn()
        if self._shm:
            return self._get_v1_shared(keys, offsets)
        results = []
        for off, data in zip(offsets, self._fetch(keys)):
            if data is None or len(data) != self._page_bytes:
                if data is not None:
                    self._stats["errors"] += 1
                results.append(False)
                continue
            page = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(pool.dtype)
            pool.set_from_flat_data_page(off, page)
            results.append(True)
        return results

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not self._writer:
            return [True] * len(keys)
        offsets = self._page_offsets(keys, host_indices)
        blobs = [self._bytes_of(self.mem_pool_host.get_data_page(off, flat=True)) for off in offsets]
        return self._put(keys, blobs)

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
