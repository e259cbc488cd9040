"""The Python key derivation matches the checked-in v1 vectors (shared with Rust)."""

import json
from pathlib import Path

from strata_kv import block_hash_v1, chain_hashes_v1, V1_ROOT

VECTORS = Path(__file__).resolve().parents[2] / "tests" / "key_vectors_v1.json"


def test_matches_checked_in_vectors():
    doc = json.loads(VECTORS.read_text())
    assert doc["derivation"] == "strata-kv-v1"
    assert len(doc["cases"]) >= 4
    for case in doc["cases"]:
        got = chain_hashes_v1(case["tokens"], case["block_tokens"], bytes.fromhex(case["extras_hex"]),
                              case["include_partial"])
        assert [h.hex() for h in got] == case["hashes_hex"], case["name"]


def test_chain_is_prefix_stable():
    tokens = list(range(64))
    a = chain_hashes_v1(tokens, 16)
    assert chain_hashes_v1(tokens[:32], 16) == a[:2]
    assert a[0] == block_hash_v1(V1_ROOT, tokens[:16])
    assert a[1] == block_hash_v1(a[0], tokens[16:32])
