"""Python client of Strata's KV-cache service (gRPC ``strata.kv.v1``).

>>> from strata_kv import KvClient, chain_hashes_v1
>>> c = KvClient("unix:///var/cache/strata/kv.sock", namespace="llama3-8b/tenant-a")
>>> keys = chain_hashes_v1(token_ids, 256)
>>> hit = c.batched_contains(keys)        # leading blocks cached
>>> blocks = c.batched_get(keys[:hit])
"""

from .client import BatchPutError, KvClient, KvError
from .keys import (
    V1_ROOT,
    V2_ROOT,
    ModelIdentity,
    block_hash_v1,
    block_hash_v2,
    chain_hashes_v1,
    chain_hashes_v2,
    layer_key,
    rank_key,
)

__all__ = [
    "BatchPutError",
    "KvClient",
    "KvError",
    "ModelIdentity",
    "V1_ROOT",
    "V2_ROOT",
    "block_hash_v1",
    "block_hash_v2",
    "chain_hashes_v1",
    "chain_hashes_v2",
    "layer_key",
    "rank_key",
]
__version__ = "0.1.0"
