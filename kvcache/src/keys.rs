//! Stable, versioned key derivation for KV blocks (specified in docs/KV_KEYS.md; the
//! Python client implements the same function and both check the same test vectors,
//! `kvcache/tests/key_vectors_v1.json`).
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
    h.update((tokens.len() as u32).to_le_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.update((extras.len() as u32).to_le_bytes());
    h.update(extras);
    h.finalize().into()
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
    if block_tokens == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tokens.len() / block_tokens + 1);
    let mut parent = V1_ROOT;
    for chunk in tokens.chunks(block_tokens) {
        if chunk.len() < block_tokens && !include_partial {
            break;
        }
        parent = block_hash_v1(&parent, chunk, extras);
        out.push(parent);
    }
    out
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
}
