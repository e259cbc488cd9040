"""Stable, versioned key derivation for KV blocks (docs/KV_KEYS.md).

Identical to the Rust ``strata_kvcache::keys``; both check the test vectors in
``kvcache/tests/key_vectors_v1.json`` and ``key_vectors_v2.json``.

v2 binds every key to a :class:`ModelIdentity` (weights revision, the config fields
that change KV values, KV dtype and layout, parallel layout, LoRA, cache salt), so
blocks of another model revision, RoPE scaling or adapter are a miss, never a load.

v1: ``SHA-256(b"strata-kv-v1" || parent(32 B, zeros for the first block)
|| le_u32(len(tokens)) || le_u32(t) for t in tokens || le_u32(len(extras)) || extras)``
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

V1_TAG = b"strata-kv-v1"
V1_HASH_LEN = 32
V1_ROOT = bytes(V1_HASH_LEN)


def block_hash_v1(parent: bytes, tokens: Sequence[int], extras: bytes = b"") -> bytes:
    """Hash of one block given its parent's hash (or ``V1_ROOT``)."""
    if len(parent) != V1_HASH_LEN:
        raise ValueError(f"parent hash must be {V1_HASH_LEN} bytes, got {len(parent)}")
    return _block_digest(V1_TAG + bytes(parent), tokens, extras)


def _block_digest(prefix: bytes, tokens: Sequence[int], extras: bytes) -> bytes:
    """SHA-256 of a derivation's prefix, then the length-prefixed tokens and extras."""
    h = hashlib.sha256()
    h.update(prefix)
    h.update(struct.pack("<I", len(tokens)))
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))
    h.update(struct.pack("<I", len(extras)))
    h.update(extras)
    return h.digest()


def _chain(tokens: Sequence[int], block_tokens: int, include_partial: bool, block) -> List[bytes]:
    """``block(parent, chunk)`` chained over the blocks of ``tokens`` from a zero root."""
    out: List[bytes] = []
    if block_tokens <= 0:
        return out
    parent = bytes(32)
    for i in range(0, len(tokens), block_tokens):
        chunk = tokens[i : i + block_tokens]
        if len(chunk) < block_tokens and not include_partial:
            break
        parent = block(parent, chunk)
        out.append(parent)
    return out


def chain_hashes_v1(
    tokens: Sequence[int], block_tokens: int, extras: bytes = b"", include_partial: bool = False
) -> List[bytes]:
    """Hashes of the ``block_tokens``-token blocks of ``tokens``, chained from ``V1_ROOT``.

    A trailing partial block is hashed only with ``include_partial``.
    """
    return _chain(tokens, block_tokens, include_partial, lambda p, c: block_hash_v1(p, c, extras))


# -- v2: keys bound to the model --------------------------------------------------------

V2_TAG = b"strata-kv-v2"
IDENTITY_V2_TAG = b"strata-kv-identity-v2"
V2_HASH_LEN = 32
V2_ROOT = bytes(V2_HASH_LEN)
#: gRPC metadata carrying a client's identity digest (hex); the service binds a
#: namespace to the first identity it sees and refuses another (FAILED_PRECONDITION).
IDENTITY_METADATA = "strata-model-identity"


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True)
class ModelIdentity:
    """What makes two engines' KV values interchangeable. Any field that differs gives
    different keys. Ranks are not here: every rank of one model shares the identity (and
    the namespace binding); per-rank pages use :func:`rank_key`.

    ``model``: the model's name; ``revision``: the weights' revision or digest (a hub
    commit, a checksum of the safetensors); ``kv_dtype``/``kv_layout``: the KV cache's
    element type and memory layout as the engine names them; ``block_tokens``: tokens per
    block; ``rope_scaling``: the config's RoPE scaling (any JSON value, canonicalised);
    ``tp_size``/``pp_size``: the parallel layout; ``lora``: the adapter id ("" none);
    ``cache_salt``: a per-tenant or per-request salt; ``extra``: anything else that changes
    KV values (string to string).
    """

    model: str
    revision: str = ""
    kv_dtype: str = ""
    kv_layout: str = ""
    block_tokens: int = 0
    rope_scaling: Any = None
    tp_size: int = 1
    pp_size: int = 1
    lora: str = ""
    cache_salt: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)

    def __hash__(self) -> int:
        # By the canonical fields: ``extra`` (a dict) and ``rope_scaling`` (any JSON
        # value) would make the generated hash fail, and equal identities hash alike.
        return hash(tuple(self.fields()))

    def fields(self) -> List[Tuple[str, str]]:
        """The canonical (name, value) pairs, sorted by name; empty values left out."""
        out = {
            "model": self.model,
            "revision": self.revision,
            "kv_dtype": self.kv_dtype,
            "kv_layout": self.kv_layout,
            "block_tokens": str(int(self.block_tokens)),
            "rope_scaling": "" if self.rope_scaling is None else _canonical_json(self.rope_scaling),
            "tp_size": str(int(self.tp_size)),
            "pp_size": str(int(self.pp_size)),
            "lora": self.lora or "",
            "cache_salt": self.cache_salt or "",
        }
        for k, v in self.extra.items():
            out["x." + k] = str(v)
        return sorted((k, v) for k, v in out.items() if v != "")

    def digest(self) -> bytes:
        if not self.model:
            raise ValueError("a model identity needs the model's name")
        return identity_digest_v2(self.fields())

    def hex(self) -> str:
        return self.digest().hex()


def identity_digest_v2(fields: Sequence[Tuple[str, str]]) -> bytes:
    """SHA-256 of the tag and the length-prefixed (name, value) pairs, in the given order
    (:meth:`ModelIdentity.fields` sorts them)."""
    h = hashlib.sha256()
    h.update(IDENTITY_V2_TAG)
    for name, value in fields:
        nb, vb = name.encode(), value.encode()
        h.update(struct.pack("<I", len(nb)))
        h.update(nb)
        h.update(struct.pack("<I", len(vb)))
        h.update(vb)
    return h.digest()


IdentityLike = Union[ModelIdentity, bytes]


def _digest_of(identity: IdentityLike) -> bytes:
    d = identity.digest() if isinstance(identity, ModelIdentity) else bytes(identity)
    if len(d) != V2_HASH_LEN:
        raise ValueError(f"identity digest must be {V2_HASH_LEN} bytes, got {len(d)}")
    return d


def block_hash_v2(identity: IdentityLike, parent: bytes, tokens: Sequence[int], extras: bytes = b"") -> bytes:
    """Hash of one block of ``identity``'s model given its parent's hash (or ``V2_ROOT``)."""
    if len(parent) != V2_HASH_LEN:
        raise ValueError(f"parent hash must be {V2_HASH_LEN} bytes, got {len(parent)}")
    return _block_digest(V2_TAG + _digest_of(identity) + bytes(parent), tokens, extras)


def chain_hashes_v2(
    identity: IdentityLike,
    tokens: Sequence[int],
    block_tokens: int,
    extras: bytes = b"",
    include_partial: bool = False,
) -> List[bytes]:
    """As :func:`chain_hashes_v1`, bound to ``identity`` (a :class:`ModelIdentity` or its
    32-byte digest)."""
    digest = _digest_of(identity)
    return _chain(tokens, block_tokens, include_partial, lambda p, c: block_hash_v2(digest, p, c, extras))


def rank_key(block_hash: bytes, tp_rank: int = 0, pp_rank: int = 0) -> bytes:
    """The key of one rank's share of a block: the chain hash, then le_u16 tp_rank and
    le_u16 pp_rank (36 bytes). Prefix matching runs on the chain hashes, so every rank
    gets the same answer; each rank stores and loads its own pages."""
    if not (0 <= tp_rank < 1 << 16 and 0 <= pp_rank < 1 << 16):
        raise ValueError(f"ranks must fit 16 bits: tp {tp_rank}, pp {pp_rank}")
    return bytes(block_hash) + struct.pack("<HH", tp_rank, pp_rank)


def layer_key(block_hash: bytes, tp_rank: int, pp_rank: int, layer: int) -> bytes:
    """The key of one layer of one rank's share of a block (the vLLM connector's
    layer-by-layer mode): :func:`rank_key` then le_u16 layer index (38 bytes), so a
    layer's values load and store on their own while the forward pass runs."""
    if not 0 <= layer < 1 << 16:
        raise ValueError(f"layer index must fit 16 bits: {layer}")
    return rank_key(block_hash, tp_rank, pp_rank) + struct.pack("<H", layer)

