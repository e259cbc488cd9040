"""Stable, versioned key derivation for KV blocks (docs/KV_KEYS.md).

Identical to the Rust ``strata_kvcache::keys``; both check the test vectors in
``kvcache/tests/key_vectors_v1.json``.

v1: ``SHA-256(b"strata-kv-v1" || parent(32 B, zeros for the first block)
|| le_u32(len(tokens)) || le_u32(t) for t in tokens || le_u32(len(extras)) || extras)``
"""

from __future__ import annotations

import hashlib
import struct
from typing import Iterable, List, Sequence

V1_TAG = b"strata-kv-v1"
V1_HASH_LEN = 32
V1_ROOT = bytes(V1_HASH_LEN)


def block_hash_v1(parent: bytes, tokens: Sequence[int], extras: bytes = b"") -> bytes:
    """Hash of one block given its parent's hash (or ``V1_ROOT``)."""
    if len(parent) != V1_HASH_LEN:
        raise ValueError(f"parent hash must be {V1_HASH_LEN} bytes, got {len(parent)}")
    h = hashlib.sha256()
    h.update(V1_TAG)
    h.update(parent)
    h.update(struct.pack("<I", len(tokens)))
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))
    h.update(struct.pack("<I", len(extras)))
    h.update(extras)
    return h.digest()


def chain_hashes_v1(
    tokens: Sequence[int], block_tokens: int, extras: bytes = b"", include_partial: bool = False
) -> List[bytes]:
    """Hashes of the ``block_tokens``-token blocks of ``tokens``, chained from ``V1_ROOT``.

    A trailing partial block is hashed only with ``include_partial``.
    """
    out: List[bytes] = []
    if block_tokens <= 0:
        return out
    parent = V1_ROOT
    for i in range(0, len(tokens), block_tokens):
        chunk = tokens[i : i + block_tokens]
        if len(chunk) < block_tokens and not include_partial:
            break
        parent = block_hash_v1(parent, chunk, extras)
        out.append(parent)
    return out
