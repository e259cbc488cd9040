//! Stable, versioned key derivation for KV blocks (specified in docs/KV_KEYS.md; the
//! Python client implements the same functions and both check the same test vectors,
//! `kvcache/tests/key_vectors_v1.json` and `key_vectors_v2.json`).
//!
//! v2 ([`chain_hashes_v2`]) binds every key to a [`ModelIdentity`] digest: blocks of
//! another weights revision, RoPE scaling, KV dtype or layout, parallel layout, LoRA
//! adapter or cache salt are a miss, never a load (vllm#49261, LMCache#4463: KV reused
//! across such changes silently produced garbage).
//!
//! v1: a block's hash is
//!
//! ```text
//! SHA-256( "strata-kv-v1"                      12 ASCII bytes, the version tag
//!        || parent                              32 bytes; 32 zero bytes for the first block
//!        || le_u32(n) || le_u32(t_0) .. le_u32(t_{n-1})   the block's token ids
//!        || le_u32(m) || extras                 m opaque bytes (LoRA id, image hash...) )
//! ```
//!
//! chained block by block, so a block's hash names its whole prefix: two requests share
//! a cached block exactly when they share every token before and in it. Lengths are
//! prefixed so that no two different inputs hash the same bytes. No seeds, no
//! process-dependent state (LMCache #1139, #1842: unseeded hashes broke sharing).

use sha2::{Digest, Sha256};

/// Tag of this derivation; a new derivation gets a new tag (and new test vectors).
pub const V1_TAG: &[u8] = b"strata-kv-v1";

/// Length of a v1 hash.
pub const V1_HASH_LEN: usize = 32;

/// Parent of the first block of a chain.
pub const V1_ROOT: [u8; V1_HASH_LEN] = [0u8; V1_HASH_LEN];

/// Hash of one block given its parent's hash (or [`V1_ROOT`]).
pub fn block_hash_v1(
    parent: &[u8; V1_HASH_LEN],
    tokens: &[u32],
    extras: &[u8],
) -> [u8; V1_HASH_LEN] {
    let mut h = Sha256::new();
    h.update(V1_TAG);
    h.update(parent);
    block_body(h, tokens, extras)
}

/// The part of a block's hash every derivation shares: the length-prefixed tokens and
/// extras after the derivation's own prefix.
fn block_body(mut h: Sha256, tokens: &[u32], extras: &[u8]) -> [u8; 32] {
    h.update((tokens.len() as u32).to_le_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.update((extras.len() as u32).to_le_bytes());
    h.update(extras);
    h.finalize().into()
}

/// Chains `block` over the `block_tokens`-token blocks of `tokens` from a zero root
/// (see [`chain_hashes_v1`] for the partial-block rule).
fn chain(
    tokens: &[u32],
    block_tokens: usize,
    include_partial: bool,
    block: impl Fn(&[u8; 32], &[u32]) -> [u8; 32],
) -> Vec<[u8; 32]> {
    if block_tokens == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tokens.len() / block_tokens + 1);
    let mut parent = [0u8; 32];
    for chunk in tokens.chunks(block_tokens) {
        if chunk.len() < block_tokens && !include_partial {
            break;
        }
        parent = block(&parent, chunk);
        out.push(parent);
    }
    out
}

/// Hashes of the blocks of a token sequence cut into `block_tokens`-token blocks,
/// chained from [`V1_ROOT`]. A trailing partial block is hashed only when
/// `include_partial` is set (vLLM caches full blocks only; LMCache also the tail).
/// `block_tokens == 0` yields no blocks.
pub fn chain_hashes_v1(
    tokens: &[u32],
    block_tokens: usize,
    extras: &[u8],
    include_partial: bool,
) -> Vec<[u8; V1_HASH_LEN]> {
    chain(tokens, block_tokens, include_partial, |parent, chunk| {
        block_hash_v1(parent, chunk, extras)
    })
}

/// Tag of the v2 block derivation.
pub const V2_TAG: &[u8] = b"strata-kv-v2";
/// Tag of the v2 model-identity digest.
pub const IDENTITY_V2_TAG: &[u8] = b"strata-kv-identity-v2";
/// Length of a v2 hash and of an identity digest.
pub const V2_HASH_LEN: usize = 32;
/// Parent of the first block of a v2 chain.
pub const V2_ROOT: [u8; V2_HASH_LEN] = [0u8; V2_HASH_LEN];
/// gRPC metadata carrying a client's identity digest (64 hex digits).
pub const IDENTITY_METADATA: &str = "strata-model-identity";

/// What makes two engines' KV values interchangeable; any differing field gives
/// different keys. Ranks are not part of it: every rank of one model shares the
/// identity (and the namespace binding); per-rank pages use [`rank_key`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelIdentity {
    /// The model's name.
    pub model: String,
    /// The weights' revision or digest.
    pub revision: String,
    /// KV cache element type and memory layout, as the engine names them.
    pub kv_dtype: String,
    pub kv_layout: String,
    /// Tokens per block.
    pub block_tokens: u32,
    /// The config's RoPE scaling as canonical JSON (sorted keys, no spaces); "" none.
    pub rope_scaling: String,
    pub tp_size: u32,
    pub pp_size: u32,
    /// LoRA adapter id; "" none.
    pub lora: String,
    pub cache_salt: String,
    /// Anything else that changes KV values (encoded as `x.<name>`).
    pub extra: std::collections::BTreeMap<String, String>,
}

impl ModelIdentity {
    /// The canonical (name, value) pairs, sorted by name, empty values left out.
    pub fn fields(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = [
            ("model", self.model.clone()),
            ("revision", self.revision.clone()),
            ("kv_dtype", self.kv_dtype.clone()),
            ("kv_layout", self.kv_layout.clone()),
            ("block_tokens", self.block_tokens.to_string()),
            ("rope_scaling", self.rope_scaling.clone()),
            ("tp_size", self.tp_size.to_string()),
            ("pp_size", self.pp_size.to_string()),
            ("lora", self.lora.clone()),
            ("cache_salt", self.cache_salt.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(
            self.extra
                .iter()
                .map(|(k, v)| (format!("x.{k}"), v.clone())),
        )
        .filter(|(_, v)| !v.is_empty())
        .collect();
        out.sort();
        out
    }

    /// The identity's digest (what keys and the namespace binding use).
    pub fn digest(&self) -> [u8; V2_HASH_LEN] {
        identity_digest_v2(&self.fields())
    }
}

/// SHA-256 of the tag and the length-prefixed (name, value) pairs, in the given order.
pub fn identity_digest_v2(fields: &[(String, String)]) -> [u8; V2_HASH_LEN] {
    let mut h = Sha256::new();
    h.update(IDENTITY_V2_TAG);
    for (name, value) in fields {
        h.update((name.len() as u32).to_le_bytes());
        h.update(name.as_bytes());
        h.update((value.len() as u32).to_le_bytes());
        h.update(value.as_bytes());
    }
    h.finalize().into()
}

/// Hash of one block of the model named by `identity` (its digest), given its parent's
/// hash (or [`V2_ROOT`]).
pub fn block_hash_v2(
    identity: &[u8; V2_HASH_LEN],
    parent: &[u8; V2_HASH_LEN],
    tokens: &[u32],
    extras: &[u8],
) -> [u8; V2_HASH_LEN] {
    let mut h = Sha256::new();
    h.update(V2_TAG);
    h.update(identity);
    h.update(parent);
    block_body(h, tokens, extras)
}

/// As [`chain_hashes_v1`], bound to the model identity `identity` (its digest).
pub fn chain_hashes_v2(
    identity: &[u8; V2_HASH_LEN],
    tokens: &[u32],
    block_tokens: usize,
    extras: &[u8],
    include_partial: bool,
) -> Vec<[u8; V2_HASH_LEN]> {
    chain(tokens, block_tokens, include_partial, |parent, chunk| {
        block_hash_v2(identity, parent, chunk, extras)
    })
}

/// The key of one rank's share of a block: the chain hash, then `le_u16(tp_rank)` and
/// `le_u16(pp_rank)` (36 bytes). Prefix matching runs on chain hashes, so every rank
/// gets the same answer; each rank stores and loads its own pages.
pub fn rank_key(block_hash: &[u8; V2_HASH_LEN], tp_rank: u16, pp_rank: u16) -> Vec<u8> {
    let mut k = Vec::with_capacity(V2_HASH_LEN + 4);
    k.extend_from_slice(block_hash);
    k.extend_from_slice(&tp_rank.to_le_bytes());
    k.extend_from_slice(&pp_rank.to_le_bytes());
    k
}

/// Parses an identity digest sent as 64 hex digits.
pub fn parse_identity_hex(s: &str) -> Option<[u8; V2_HASH_LEN]> {
    let b = hex::decode(s.trim()).ok()?;
    b.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_is_prefix_stable_and_extras_separate() {
        let tokens: Vec<u32> = (0..40).collect();
        let a = chain_hashes_v1(&tokens, 16, b"", false);
        assert_eq!(a.len(), 2);
        let b = chain_hashes_v1(&tokens[..32], 16, b"", false);
        assert_eq!(a, b, "same prefix, same keys");
        let c = chain_hashes_v1(&tokens, 16, b"", true);
        assert_eq!(c.len(), 3);
        assert_eq!(&c[..2], &a[..]);
        let lora = chain_hashes_v1(&tokens, 16, b"lora:7", false);
        assert_ne!(lora[0], a[0]);
        // A change in the first block changes every later key.
        let mut t2 = tokens.clone();
        t2[0] = 99;
        let d = chain_hashes_v1(&t2, 16, b"", false);
        assert_ne!(d[0], a[0]);
        assert_ne!(d[1], a[1]);
        assert!(chain_hashes_v1(&tokens, 0, b"", true).is_empty());
    }

    #[test]
    fn matches_checked_in_vectors() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/key_vectors_v1.json"
        ))
        .expect("test vectors are checked in");
        let v: serde_json::Value = serde_json::from_str(&text).expect("vectors parse");
        let cases = v["cases"].as_array().expect("cases array");
        assert!(cases.len() >= 4);
        for case in cases {
            let tokens: Vec<u32> = case["tokens"]
                .as_array()
                .expect("tokens")
                .iter()
                .map(|t| t.as_u64().expect("token id") as u32)
                .collect();
            let block_tokens = case["block_tokens"].as_u64().expect("block_tokens") as usize;
            let extras =
                hex::decode(case["extras_hex"].as_str().expect("extras_hex")).expect("hex");
            let partial = case["include_partial"].as_bool().expect("include_partial");
            let got: Vec<String> = chain_hashes_v1(&tokens, block_tokens, &extras, partial)
                .iter()
                .map(hex::encode)
                .collect();
            let want: Vec<String> = case["hashes_hex"]
                .as_array()
                .expect("hashes")
                .iter()
                .map(|h| h.as_str().expect("hex string").to_string())
                .collect();
            assert_eq!(got, want, "case {}", case["name"]);
        }
    }

    fn load(name: &str) -> serde_json::Value {
        let path = format!("{}/tests/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(path).expect("test vectors are checked in");
        serde_json::from_str(&text).expect("vectors parse")
    }

    fn digest_hex(v: &serde_json::Value) -> [u8; 32] {
        parse_identity_hex(v.as_str().expect("hex")).expect("32-byte digest")
    }

    #[test]
    fn v2_matches_checked_in_vectors() {
        let v = load("key_vectors_v2.json");
        assert_eq!(v["derivation"], "strata-kv-v2");
        for ident in v["identities"].as_array().expect("identities") {
            let fields: Vec<(String, String)> = ident["fields"]
                .as_array()
                .expect("fields")
                .iter()
                .map(|f| {
                    (
                        f[0].as_str().expect("name").to_string(),
                        f[1].as_str().expect("value").to_string(),
                    )
                })
                .collect();
            assert_eq!(
                identity_digest_v2(&fields),
                digest_hex(&ident["digest_hex"]),
                "identity {}",
                ident["name"]
            );
        }
        let cases = v["cases"].as_array().expect("cases");
        assert!(cases.len() >= 5);
        for case in cases {
            let tokens: Vec<u32> = case["tokens"]
                .as_array()
                .expect("tokens")
                .iter()
                .map(|t| t.as_u64().expect("token id") as u32)
                .collect();
            let extras =
                hex::decode(case["extras_hex"].as_str().expect("extras_hex")).expect("hex");
            let got: Vec<String> = chain_hashes_v2(
                &digest_hex(&case["identity_digest_hex"]),
                &tokens,
                case["block_tokens"].as_u64().expect("block_tokens") as usize,
                &extras,
                case["include_partial"].as_bool().expect("include_partial"),
            )
            .iter()
            .map(hex::encode)
            .collect();
            let want: Vec<String> = case["hashes_hex"]
                .as_array()
                .expect("hashes")
                .iter()
                .map(|h| h.as_str().expect("hex string").to_string())
                .collect();
            assert_eq!(got, want, "case {}", case["name"]);
        }
        for rk in v["rank_keys"].as_array().expect("rank keys") {
            let key = rank_key(
                &digest_hex(&rk["block_hash_hex"]),
                rk["tp_rank"].as_u64().expect("tp") as u16,
                rk["pp_rank"].as_u64().expect("pp") as u16,
            );
            assert_eq!(hex::encode(key), rk["key_hex"].as_str().expect("key"));
        }
    }

    #[test]
    fn v2_identity_struct_matches_the_python_canonical_fields() {
        // The vectors' "llama_base" identity, built field by field.
        let id = ModelIdentity {
            model: "meta-llama/Llama-3-8B".into(),
            revision: "8cde5ca8380496c9a6cc7ef3a8b46a0372a1d920".into(),
            kv_dtype: "bfloat16".into(),
            kv_layout: "NHD".into(),
            block_tokens: 16,
            tp_size: 1,
            pp_size: 1,
            ..Default::default()
        };
        let v = load("key_vectors_v2.json");
        let base = v["identities"]
            .as_array()
            .expect("identities")
            .iter()
            .find(|i| i["name"] == "llama_base")
            .expect("llama_base");
        assert_eq!(id.digest(), digest_hex(&base["digest_hex"]));
        let tokens: Vec<u32> = (0..32).collect();
        let keys = chain_hashes_v2(&id.digest(), &tokens, 16, b"", false);
        let mut lora = id.clone();
        lora.lora = "a".into();
        let other = chain_hashes_v2(&lora.digest(), &tokens, 16, b"", false);
        assert!(keys.iter().zip(&other).all(|(a, b)| a != b));
        assert!(keys
            .iter()
            .all(|k| !chain_hashes_v1(&tokens, 16, b"", false).contains(k)));
    }
}
