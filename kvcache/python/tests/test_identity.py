"""Keys bound to the model against the real binary: the namespace is bound to the first
identity that puts into it; another revision, RoPE scaling or LoRA is refused with
FAILED_PRECONDITION (never served the first model's blocks); v1 clients still work."""

from dataclasses import replace

import grpc
import pytest

from strata_kv import KvClient, ModelIdentity, chain_hashes_v2
from strata_kv.client import KvError

NS = "identity-test/llama"
BASE = ModelIdentity(model="meta-llama/Llama-3-8B", revision="rev-1", kv_dtype="bfloat16", kv_layout="NHD",
                     block_tokens=16)


def test_another_model_identity_is_a_refusal_never_a_load(server):
    tokens = list(range(64))
    keys = chain_hashes_v2(BASE, tokens, 16)
    blocks = [bytes([i]) * 8192 for i in range(len(keys))]
    with KvClient(server["tcp"], NS, identity=BASE) as a:
        for k, b in zip(keys, blocks):
            a.put(k, b)
        assert a.match_prefix(keys) == 4
        assert a.get(keys[2]) == blocks[2]
    for other in (replace(BASE, revision="rev-2"), replace(BASE, rope_scaling={"type": "yarn", "factor": 4.0}),
                  replace(BASE, lora="adapter-7")):
        # Its own v2 keys are different, so a lookup by them would simply miss...
        assert set(chain_hashes_v2(other, tokens, 16)).isdisjoint(keys)
        # ...and even the first model's exact keys are refused in the bound namespace.
        with KvClient(server["tcp"], NS, identity=other) as b:
            for call in (lambda: b.get(keys[0]), lambda: b.match_prefix(keys), lambda: b.exists(keys[0]),
                         lambda: b.put(b"x" * 32, bytes(8192))):
                with pytest.raises(KvError) as e:
                    call()
                assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION, e.value
                assert NS in e.value.message
    with KvClient(server["tcp"], NS) as v1:  # no identity: not checked
        assert v1.get(keys[0]) == blocks[0]
