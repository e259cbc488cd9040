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


# -- v2: keys bound to the model ----------------------------------------------------------

from dataclasses import replace  # noqa: E402

from strata_kv import ModelIdentity, chain_hashes_v2, rank_key  # noqa: E402
from strata_kv.keys import identity_digest_v2  # noqa: E402

VECTORS_V2 = VECTORS.with_name("key_vectors_v2.json")


def test_v2_matches_checked_in_vectors():
    doc = json.loads(VECTORS_V2.read_text())
    assert doc["derivation"] == "strata-kv-v2"
    for ident in doc["identities"]:
        assert identity_digest_v2([tuple(f) for f in ident["fields"]]).hex() == ident["digest_hex"], ident["name"]
    for case in doc["cases"]:
        got = chain_hashes_v2(bytes.fromhex(case["identity_digest_hex"]), case["tokens"], case["block_tokens"],
                              bytes.fromhex(case["extras_hex"]), case["include_partial"])
        assert [h.hex() for h in got] == case["hashes_hex"], case["name"]
    for rk in doc["rank_keys"]:
        assert rank_key(bytes.fromhex(rk["block_hash_hex"]), rk["tp_rank"], rk["pp_rank"]).hex() == rk["key_hex"]


def test_v2_every_identity_field_changes_every_key():
    base = ModelIdentity(model="m", revision="r1", kv_dtype="bfloat16", kv_layout="NHD", block_tokens=16)
    tokens = list(range(48))
    keys = chain_hashes_v2(base, tokens, 16)
    assert len(keys) == 3
    variants = [
        replace(base, revision="r2"),
        replace(base, rope_scaling={"type": "linear", "factor": 2.0}),
        replace(base, lora="adapter-1"),
        replace(base, kv_dtype="fp8"),
        replace(base, kv_layout="HND"),
        replace(base, tp_size=2),
        replace(base, pp_size=2),
        replace(base, cache_salt="s"),
        replace(base, extra={"sliding_window": "4096"}),
    ]
    for v in variants:
        other = chain_hashes_v2(v, tokens, 16)
        assert all(a != b for a, b in zip(keys, other)), v
    # The same identity built twice (dict order aside) gives the same keys.
    again = replace(base, rope_scaling=None, extra={})
    assert chain_hashes_v2(again, tokens, 16) == keys
    r1 = replace(base, rope_scaling={"factor": 2.0, "type": "linear"})
    r2 = replace(base, rope_scaling={"type": "linear", "factor": 2.0})
    assert r1.digest() == r2.digest(), "rope_scaling is canonicalised"
    # v1 and v2 never share a key.
    assert set(keys).isdisjoint(chain_hashes_v1(tokens, 16))


def test_rank_keys_share_the_chain_and_differ_per_rank():
    h = chain_hashes_v2(ModelIdentity(model="m"), list(range(16)), 16)[0]
    k00, k10 = rank_key(h, 0, 0), rank_key(h, 1, 0)
    assert k00[:32] == k10[:32] == h and k00 != k10 and len(k00) == 36


def test_model_identities_hash_by_their_canonical_fields():
    """Black-box finding: a frozen ModelIdentity was unhashable (its ``extra`` dict), so
    it could not key a dict or sit in a set."""
    from strata_kv import ModelIdentity
    a = ModelIdentity(model="m", rope_scaling={"factor": 2.0}, extra={"k": "v"})
    b = ModelIdentity(model="m", rope_scaling={"factor": 2.0}, extra={"k": "v"})
    c = ModelIdentity(model="m", extra={"k": "w"})
    assert a == b and hash(a) == hash(b)
    assert len({a, b, c}) == 2
