//! Bodies of the fuzz targets (`tests/fuzz/`, run with `cargo fuzz`), shared with the
//! corpus regression test (`tests/tests/fuzz_corpora.rs`) that replays every committed
//! corpus file on stable Rust: each function takes the fuzzer's bytes, drives them
//! through Strata's real parsing code, and panics only on a bug (a broken invariant or
//! a panic inside the parser). Errors the parsers return are the expected outcome.
//!
//! [`TARGETS`] lists them by the name of their fuzz target and corpus directory.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use prost::Message;
use strata_cache_core::tiers::disk::format::{self, IndexEntry};
use strata_cache_core::tiers::memory::MemoryTier;
use strata_cache_core::{AccessContext, CacheEngine, CacheKey, JobId};
use strata_kvcache::pb;
use strata_kvcache::pb::kv_cache_server::KvCache;
use strata_kvcache::tenants::{self, Tenant, TenantConfig};
use strata_kvcache::{keys, KvService, ServerConfig};

/// A fuzz target: its name (of `tests/fuzz/fuzz_targets/<name>.rs` and of
/// `tests/fuzz/corpus/<name>/`) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target.
pub const TARGETS: &[Target] = &[
    ("disk_header", disk_header),
    ("trace_csv", trace_csv),
    ("keys", keys),
    ("grpc_request", grpc_request),
];

/// Splits `n` bytes off the front of `data` (fewer when it is shorter).
fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = data.split_at(n.min(data.len()));
    *data = tail;
    head
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
    u64::from_le_bytes(a)
}

/// The disk tier's block file header and index value (`tiers/disk/format.rs`): the
/// input is `index value (25 bytes) || key_len:u8 || key || block file`. Also checks
/// that a header the parser accepts names a data range inside the file, and that a
/// header written for the input's key and data is accepted.
pub fn disk_header(mut data: &[u8]) {
    let index = take(&mut data, format::INDEX_VALUE_LEN);
    let klen = take(&mut data, 1).first().copied().unwrap_or(0) as usize;
    let key = take(&mut data, klen);
    let file = data;

    let decoded = IndexEntry::decode(index);
    if let Ok(e) = decoded {
        assert_eq!(
            IndexEntry::decode(&e.encode()),
            Ok(e),
            "index value round trip"
        );
        let _ = e.file_len();
    }
    // The file against the index value given, and against one that agrees with the
    // header's own fields (so the fuzzer reaches the range checks past the crc).
    let expects = [
        decoded.ok(),
        (file.len() >= format::FIXED_HEADER).then(|| IndexEntry {
            file_id: 1,
            header_len: u32::from_le_bytes(file[12..16].try_into().expect("4 bytes")),
            crc: u32::from_le_bytes(file[20..24].try_into().expect("4 bytes")),
            data_len: u64::from_le_bytes(file[24..32].try_into().expect("8 bytes")),
        }),
    ];
    for e in expects.into_iter().flatten() {
        if let Ok(r) = format::check_header(file, key, &e) {
            assert!(
                r.start <= r.end && r.end <= file.len(),
                "range {r:?} in {}",
                file.len()
            );
            assert_eq!((r.end - r.start) as u64, e.data_len);
        }
    }

    // A header written for this key and data is accepted and names the data.
    let hlen = format::header_len(key.len());
    let body = &file[..file.len().min(1 << 16)];
    let crc = crc32c::crc32c(body);
    let e = IndexEntry {
        file_id: 2,
        data_len: body.len() as u64,
        crc,
        header_len: hlen as u32,
    };
    let mut out = vec![0u8; e.file_len() as usize];
    format::write_header(&mut out, key, body.len() as u64, crc);
    out[hlen..hlen + body.len()].copy_from_slice(body);
    let r = format::check_header(&out, key, &e).expect("a written header is accepted");
    assert_eq!(&out[r], body);
}

/// The replay's trace CSV parser (`strata_replay::trace::read_csv`) and the checks a
/// replay runs on a parsed trace (`check_replayable`, the block walk of a bounded
/// trace). The first byte picks the block size (2^(byte % 40)).
pub fn trace_csv(mut data: &[u8]) {
    use strata_replay::trace;
    let shift = take(&mut data, 1).first().copied().unwrap_or(20) % 40;
    let block_bytes = 1u64 << shift;
    let Ok(t) = trace::read_csv(data) else {
        return;
    };
    let _ = t.block_accesses(block_bytes);
    if t.check_replayable(block_bytes).is_ok() && t.block_accesses(block_bytes) <= 1 << 16 {
        // What a replay enumerates, only for traces the check lets through (and small
        // enough for a fuzzer's iteration).
        let _ = t.unique_bytes(block_bytes);
        for r in &t.records {
            let _ = trace::blocks_of(t.path_name(r), r.offset, r.len, r.size, block_bytes).count();
        }
        // A parsed trace writes back to CSV that parses to the same records.
        let mut out = Vec::new();
        trace::write_csv(&t, &mut out).expect("a parsed trace writes");
        let again = trace::read_csv(&out[..]).expect("a written trace parses");
        assert_eq!(again.records, t.records, "trace round trip");
    }
}

/// Key and name parsing: `CacheKey::decode` (the disk index's keys; an accepted key
/// re-encodes to the same bytes), the KV key derivation (`kvcache/src/keys.rs`), and
/// tenants' namespace patterns and scoping. The first byte picks the part.
pub fn keys(mut data: &[u8]) {
    let sel = take(&mut data, 1).first().copied().unwrap_or(0);
    match sel % 3 {
        0 => {
            if let Ok(k) = CacheKey::decode(data) {
                assert_eq!(k.encode(), data, "key round trip");
                let again = CacheKey::decode(&k.encode()).expect("re-decodes");
                assert_eq!(again, k);
                assert_eq!(again.content_hash(), k.content_hash());
                let _ = k.path();
                let _ = k.to_string();
                let _ = k.is_current_format();
            }
        }
        1 => {
            // block_tokens:u8, include_partial:bit, extras_len:u8, extras, tokens (u32 LE).
            let block_tokens = take(&mut data, 1).first().copied().unwrap_or(0) as usize;
            let elen = take(&mut data, 1).first().copied().unwrap_or(0) as usize;
            let extras = take(&mut data, elen);
            let tokens: Vec<u32> = data.chunks(4).map(|c| le_u64(c) as u32).collect();
            let partial = sel & 0x80 != 0;
            let chain = keys::chain_hashes_v1(&tokens, block_tokens, extras, partial);
            match tokens.len().checked_div(block_tokens) {
                Some(full) => {
                    let want = if partial {
                        tokens.len().div_ceil(block_tokens)
                    } else {
                        full
                    };
                    assert_eq!(chain.len(), want);
                    // Each hash chains from the previous one.
                    let mut parent = keys::V1_ROOT;
                    for (i, h) in chain.iter().enumerate() {
                        let end = ((i + 1) * block_tokens).min(tokens.len());
                        let b =
                            keys::block_hash_v1(&parent, &tokens[i * block_tokens..end], extras);
                        assert_eq!(&b, h);
                        parent = b;
                    }
                }
                None => assert!(chain.is_empty()),
            }
        }
        _ => {
            // pattern_len:u8, pattern, namespace (both lossy UTF-8).
            let plen = take(&mut data, 1).first().copied().unwrap_or(0) as usize;
            let pattern = String::from_utf8_lossy(take(&mut data, plen)).into_owned();
            let ns = String::from_utf8_lossy(data).into_owned();
            let m = tenants::pattern_matches(&pattern, &ns);
            if pattern == ns && !pattern.contains(['*', '?']) {
                assert!(m, "a literal pattern matches itself");
            }
            let cfg = TenantConfig {
                name: "t".into(),
                token: "x".repeat(32),
                namespaces: vec![pattern],
                quota_bytes: 1 << 20,
            };
            let _ = tenants::check_tenants(std::slice::from_ref(&cfg));
            let t = Tenant::new(&cfg, 1 << 20, 1 << 20);
            match t.scope(&ns) {
                Ok(scoped) => {
                    assert!(m);
                    assert_eq!(&*scoped, format!("t{}{ns}", tenants::TENANT_SEP));
                }
                Err(_) => assert!(!m),
            }
        }
    }
}

/// One KV service on a small memory engine, driven without a network.
struct Service {
    rt: tokio::runtime::Runtime,
    svc: KvService,
}

fn service() -> &'static Service {
    static S: OnceLock<Service> = OnceLock::new();
    S.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let engine = rt.block_on(async {
            CacheEngine::builder()
                .tier(Arc::new(MemoryTier::new(8 << 20)))
                .build()
                .expect("engine builds")
        });
        let svc = rt.block_on(async { KvService::new(engine, ServerConfig::default()) });
        Service { rt, svc }
    })
}

/// Blocks the service holds in namespace `default` for [`grpc_request`]: a hash of 32
/// bytes `h` names a block of `size` bytes `h` (one small, one of several chunks).
pub const SEEDED: [(u8, usize); 2] = [(0x11, 4096), (0x22, 3 << 20)];

/// The gRPC requests of `strata.kv.v1`: the first byte picks a request type, the rest
/// is decoded as that protobuf message (`prost`, as tonic does); a request that decodes
/// is handled by the KV service's own handler (`KvService`'s `KvCache` implementation:
/// namespace, key and batch checks, lookups, removes, prefetches, load estimates) on an
/// in-memory engine, and its response re-encoded. Put (a client stream) is decoded only.
pub fn grpc_request(mut data: &[u8]) {
    let sel = take(&mut data, 1).first().copied().unwrap_or(0);
    let s = service();
    let svc = &s.svc;
    s.rt.block_on(async {
        // Blocks for the requests to find (a request may have removed them).
        let ctx = AccessContext::demand(JobId(1), 0);
        for (hash, size) in SEEDED {
            let key = CacheKey::kv("default", vec![hash; 32]);
            if !svc.engine().contains(&key) {
                let data = Bytes::from(vec![hash; size]);
                svc.engine().put(&key, data, &ctx).await.expect("seed put");
            }
        }
        match sel % 11 {
            0 => {
                if let Ok(m) = pb::PutRequest::decode(data) {
                    let _ = m.encode_to_vec();
                }
            }
            1 => {
                if let Ok(m) = pb::GetRequest::decode(data) {
                    if let Ok(r) = svc.get(tonic::Request::new(m)).await {
                        use futures::StreamExt;
                        let mut st = r.into_inner();
                        while let Some(x) = st.next().await {
                            if let Ok(x) = x {
                                let _ = x.encode_to_vec();
                            }
                        }
                    }
                }
            }
            2 => {
                if let Ok(m) = pb::BatchGetRequest::decode(data) {
                    if let Ok(r) = svc.batch_get(tonic::Request::new(m)).await {
                        use futures::StreamExt;
                        let mut st = r.into_inner();
                        let mut n = 0;
                        while let Some(x) = st.next().await {
                            if let Ok(x) = x {
                                let _ = x.encode_to_vec();
                            }
                            n += 1;
                            if n > 1 << 12 {
                                break;
                            }
                        }
                    }
                }
            }
            3 => {
                if let Ok(m) = pb::ExistsRequest::decode(data) {
                    if let Ok(r) = svc.exists(tonic::Request::new(m)).await {
                        let _ = r.into_inner().encode_to_vec();
                    }
                }
            }
            4 => {
                if let Ok(m) = pb::BatchExistsRequest::decode(data) {
                    let n = m.hashes.len();
                    if let Ok(r) = svc.batch_exists(tonic::Request::new(m)).await {
                        assert_eq!(r.get_ref().exists.len(), n);
                        let _ = r.into_inner().encode_to_vec();
                    }
                }
            }
            5 => {
                if let Ok(m) = pb::MatchPrefixRequest::decode(data) {
                    let n = m.hashes.len();
                    if let Ok(r) = svc.match_prefix(tonic::Request::new(m)).await {
                        assert!(r.get_ref().matched as usize <= n);
                    }
                }
            }
            6 => {
                if let Ok(m) = pb::RemoveRequest::decode(data) {
                    let n = m.hashes.len();
                    if let Ok(r) = svc.remove(tonic::Request::new(m)).await {
                        assert!(r.get_ref().removed as usize <= n);
                    }
                }
            }
            7 => {
                if let Ok(m) = pb::PrefetchRequest::decode(data) {
                    if let Ok(r) = svc.prefetch(tonic::Request::new(m)).await {
                        let _ = r.into_inner().encode_to_vec();
                    }
                }
            }
            8 => {
                if let Ok(m) = pb::EstimateLoadRequest::decode(data) {
                    let n = m.hashes.len();
                    if let Ok(r) = svc.estimate_load(tonic::Request::new(m)).await {
                        let r = r.into_inner();
                        assert!(r.blocks.len() <= n);
                        assert!(r.matched as usize <= n);
                        let _ = r.encode_to_vec();
                    }
                }
            }
            9 => {
                if let Ok(m) = pb::PingRequest::decode(data) {
                    if let Ok(r) = svc.ping(tonic::Request::new(m)).await {
                        let _ = r.into_inner().encode_to_vec();
                    }
                }
            }
            _ => {
                // Responses, as a client decodes them.
                let b = Bytes::copy_from_slice(data);
                let _ = pb::GetResponse::decode(b.clone());
                let _ = pb::BatchGetResponse::decode(b.clone());
                let _ = pb::ExistsResponse::decode(b.clone());
                let _ = pb::BatchExistsResponse::decode(b.clone());
                let _ = pb::EstimateLoadResponse::decode(b.clone());
                let _ = pb::PrefetchResponse::decode(b.clone());
                let _ = pb::PutResponse::decode(b.clone());
                let _ = pb::MatchPrefixResponse::decode(b.clone());
                let _ = pb::RemoveResponse::decode(b.clone());
                let _ = pb::PingResponse::decode(b);
            }
        }
    });
}
