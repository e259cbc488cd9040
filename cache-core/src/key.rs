//! Typed cache keys.
//!
//! Every item the cache holds is named by one [`CacheKey`]: either a block of an
//! object-store file or an opaque KV-cache block. Keys have a stable byte encoding
//! ([`CacheKey::encode`]) used by the persistent disk index, so it is versioned and must
//! not change without a bump of [`KEY_ENCODING_VERSION`].
//!
//! Hashing: every key carries a 64-bit hash of its content, computed once when it is
//! built ([`CacheKey::content_hash`]); `Hash` writes only that word, and `Eq` compares it
//! (and the block) before the strings, whose `Arc`s are compared by pointer before by
//! content. A key is built once and looked up many times (a replay builds one per block
//! and then probes the tier, the policy and its own index with it on every access), so
//! hashing ~50 bytes of path per lookup, and following two `Arc`s into cold memory per
//! comparison, was most of a lookup's cost. The hash is deterministic (no per-process
//! seed) so that replays and iteration orders are reproducible; it is not meant to
//! withstand keys crafted to collide, which only the cluster's own clients could send.
//! It is never persisted (the disk index and file names use the encoding).
//!
//! ## Which hash of a key is for what
//!
//! | what | value | used for |
//! |---|---|---|
//! | [`CacheKey::encode`] | bytes, versioned ([`KEY_ENCODING_VERSION`]) | the only persistent form: the disk index's key and each block file's header (files are named by sequence number) |
//! | [`CacheKey::content_hash`] | all fields, tagged by kind; cached in the key | `Hash`/`Eq` of every in-memory map of keys, LRU's slot index, the replay's key ids |
//! | [`crate::stream::key_hash`] | location + block (the version left out) or namespace + hash; computed per call | the pattern-aware policy's frequency sketch, ghost lists and stable-subset sampling |
//! | `MokaKey`'s `Hash` (`policy/tinylfu.rs`) | std `DefaultHasher`, field by field | moka's frequency sketch (TinyLFU) |
//!
//! The last two differ from `content_hash` in value, and the policies' decisions (so
//! every replay result) depend on those values: they are kept bit-identical rather
//! than folded into `content_hash`, and changing one is a measured change (re-run
//! `strata bench replay`), not a refactor. All three 64-bit hashes are built from the
//! one Fx hasher and splitmix64 finaliser in `strata-types`.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use strata_types::{hash_bytes, mix64};

use crate::error::CacheError;

/// Version byte leading every encoded key. 2: file keys carry their block size and
/// cache format ([`FILE_FORMAT_VERSION`]). Keys of another version do not decode, so
/// the disk tier drops entries an older build wrote (never serves them).
pub const KEY_ENCODING_VERSION: u8 = 2;

/// Version of how a file block's bytes are derived from its object (which bytes, in
/// what form). Part of every file key, so blocks cut or transformed by another rule
/// are never mistaken for this build's; bump it when that rule changes. 1: block `b`
/// is the raw bytes `b * block_size .. (b + 1) * block_size` of the object version.
pub const FILE_FORMAT_VERSION: u16 = 1;

/// Default file block size (1 MiB, reasons in `strata-types`, where it is defined so
/// the prefetch predictors share it without linking the core).
pub use strata_types::DEFAULT_BLOCK_SIZE;

/// Smallest and largest KV block the cache accepts (1 KiB .. 64 MiB).
pub const KV_BLOCK_MIN: usize = 1 << 10;
pub const KV_BLOCK_MAX: usize = 64 << 20;

/// A block of one version of an object-store file.
///
/// Fields are read-only in practice: build keys with [`CacheKey::file`], which computes
/// the content hash the `Hash`/`Eq` impls rely on.
#[derive(Clone, PartialOrd, Ord)]
pub struct FileBlockKey {
    /// Object location relative to the store root (e.g. `train/shard-0001.tar`).
    pub location: Arc<str>,
    /// ETag or other version tag of the object; a changed object has a new key, so
    /// two versions are never mixed.
    pub version: Arc<str>,
    /// Cache format the block was made under ([`FILE_FORMAT_VERSION`]).
    pub format: u16,
    /// Bytes per block of the layout this block belongs to: block 1 of a 1 MiB layout
    /// and block 1 of a 4 MiB layout are different bytes, so different keys (a restart
    /// with another `block_size` on the same cache directory never serves the old
    /// layout's blocks).
    pub block_size: u64,
    /// Block index within the object (offset / block size).
    pub block: u64,
    /// Hash of the fields above (last; with one format and block size, as in any one
    /// run, the derived order is (location, version, block) as before they existed).
    content_hash: u64,
}

/// An opaque KV-cache block, content-addressed by the client.
///
/// Build with [`CacheKey::kv`] (see [`FileBlockKey`]).
#[derive(Clone, PartialOrd, Ord)]
pub struct KvBlockKey {
    /// Namespace (model + tenant); keeps tenants apart.
    pub namespace: Arc<str>,
    /// Content hash given by the client (at most 64 bytes).
    pub hash: Arc<[u8]>,
    /// Hash of the two fields above (last, so the derived order is unchanged).
    content_hash: u64,
}

/// The key of any cached item.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum CacheKey {
    File(FileBlockKey),
    Kv(KvBlockKey),
}

/// Kind tags mixed into the content hash, so a file key and a KV key never share it
/// by construction of their fields alone.
const FILE_TAG: u64 = 0x4649_4c45;
const KV_TAG: u64 = 0x4b56;

fn file_hash(location: &str, version: &str, format: u16, block_size: u64, block: u64) -> u64 {
    let h = mix64(FILE_TAG ^ hash_bytes(location.as_bytes()));
    let mut h = mix64(h ^ hash_bytes(version.as_bytes()));
    // Mixed in only when not the defaults, so keys of the default layout keep the hash
    // they always had: map iteration orders, and so replay results, are unchanged.
    if format != FILE_FORMAT_VERSION || block_size != DEFAULT_BLOCK_SIZE {
        h = mix64(h ^ (u64::from(format) << 48) ^ block_size);
    }
    mix64(h ^ block)
}

fn kv_hash(namespace: &str, hash: &[u8]) -> u64 {
    let h = mix64(KV_TAG ^ hash_bytes(namespace.as_bytes()));
    mix64(h ^ hash_bytes(hash))
}

/// Same string: same `Arc` (the common case: keys of one file share its path), or
/// equal content.
#[inline]
fn same_str(a: &Arc<str>, b: &Arc<str>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

impl PartialEq for FileBlockKey {
    #[inline]
    fn eq(&self, o: &Self) -> bool {
        self.content_hash == o.content_hash
            && self.block == o.block
            && self.block_size == o.block_size
            && self.format == o.format
            && same_str(&self.location, &o.location)
            && same_str(&self.version, &o.version)
    }
}
impl Eq for FileBlockKey {}

impl Hash for FileBlockKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.content_hash);
    }
}

impl PartialEq for KvBlockKey {
    #[inline]
    fn eq(&self, o: &Self) -> bool {
        self.content_hash == o.content_hash
            && same_str(&self.namespace, &o.namespace)
            && (Arc::ptr_eq(&self.hash, &o.hash) || *self.hash == *o.hash)
    }
}
impl Eq for KvBlockKey {}

impl Hash for KvBlockKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.content_hash);
    }
}

/// One word per key (the variant is already in the content hash's tag).
impl Hash for CacheKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.content_hash());
    }
}

impl CacheKey {
    /// Block `block` of an object version cut into [`DEFAULT_BLOCK_SIZE`] blocks (tests,
    /// benchmarks, replays). Readers name their own block size: [`CacheKey::file_block`].
    pub fn file(location: impl Into<Arc<str>>, version: impl Into<Arc<str>>, block: u64) -> Self {
        Self::file_block(location, version, DEFAULT_BLOCK_SIZE, block)
    }

    /// Block `block` of an object version cut into `block_size`-byte blocks, under this
    /// build's [`FILE_FORMAT_VERSION`].
    pub fn file_block(
        location: impl Into<Arc<str>>,
        version: impl Into<Arc<str>>,
        block_size: u64,
        block: u64,
    ) -> Self {
        Self::file_with_format(location, version, FILE_FORMAT_VERSION, block_size, block)
    }

    fn file_with_format(
        location: impl Into<Arc<str>>,
        version: impl Into<Arc<str>>,
        format: u16,
        block_size: u64,
        block: u64,
    ) -> Self {
        let location = location.into();
        let version = version.into();
        CacheKey::File(FileBlockKey {
            content_hash: file_hash(&location, &version, format, block_size, block),
            location,
            version,
            format,
            block_size,
            block,
        })
    }

    /// Whether the object store holds these bytes too (a file block), so a cached copy
    /// can be fetched again; a KV block's only copies are the cache's. What the tiers
    /// keep first, and which writes may skip the disk's syncs, follow from it.
    pub fn refetchable(&self) -> bool {
        matches!(self, CacheKey::File(_))
    }

    /// Whether this build can serve the bytes a key names: KV keys always, file keys
    /// of this build's [`FILE_FORMAT_VERSION`] (a persistent tier drops the others).
    pub fn is_current_format(&self) -> bool {
        match self {
            CacheKey::File(k) => k.format == FILE_FORMAT_VERSION,
            CacheKey::Kv(_) => true,
        }
    }

    pub fn kv(namespace: impl Into<Arc<str>>, hash: impl Into<Arc<[u8]>>) -> Self {
        let namespace = namespace.into();
        let hash = hash.into();
        CacheKey::Kv(KvBlockKey {
            content_hash: kv_hash(&namespace, &hash),
            namespace,
            hash,
        })
    }

    /// 64-bit hash of the key's content, computed when the key was built: what `Hash`
    /// writes. Deterministic across processes of one build, but not a persistent
    /// format (persist [`CacheKey::encode`]).
    #[inline]
    pub fn content_hash(&self) -> u64 {
        match self {
            CacheKey::File(k) => k.content_hash,
            CacheKey::Kv(k) => k.content_hash,
        }
    }

    /// Stable, versioned byte encoding (used as the disk index key).
    ///
    /// Layout: `version:u8, kind:u8` then for files `len:u32 location, len:u32 version,
    /// format:u16, block_size:u64, block:u64`, for KV `len:u32 namespace, len:u32 hash`;
    /// integers big-endian so that keys of one object (and layout) sort by block.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.push(KEY_ENCODING_VERSION);
        match self {
            CacheKey::File(k) => {
                out.push(b'F');
                put_bytes(&mut out, k.location.as_bytes());
                put_bytes(&mut out, k.version.as_bytes());
                out.extend_from_slice(&k.format.to_be_bytes());
                out.extend_from_slice(&k.block_size.to_be_bytes());
                out.extend_from_slice(&k.block.to_be_bytes());
            }
            CacheKey::Kv(k) => {
                out.push(b'K');
                put_bytes(&mut out, k.namespace.as_bytes());
                put_bytes(&mut out, &k.hash);
            }
        }
        out
    }

    /// The length of [`CacheKey::encode`]'s bytes, without making them.
    pub fn encoded_len(&self) -> usize {
        2 + match self {
            CacheKey::File(k) => 4 + k.location.len() + 4 + k.version.len() + 2 + 8 + 8,
            CacheKey::Kv(k) => 4 + k.namespace.len() + 4 + k.hash.len(),
        }
    }

    /// Inverse of [`CacheKey::encode`].
    pub fn decode(mut buf: &[u8]) -> Result<Self, CacheError> {
        let bad = |why: &str| CacheError::Corrupt(format!("bad key encoding: {why}"));
        if buf.len() < 2 {
            return Err(bad("too short"));
        }
        if buf[0] != KEY_ENCODING_VERSION {
            return Err(bad("unknown version"));
        }
        let kind = buf[1];
        buf = &buf[2..];
        match kind {
            b'F' => {
                let location = take_str(&mut buf).ok_or_else(|| bad("location"))?;
                let version = take_str(&mut buf).ok_or_else(|| bad("version"))?;
                let format = take_array(&mut buf)
                    .map(u16::from_be_bytes)
                    .ok_or_else(|| bad("format"))?;
                let block_size = take_array(&mut buf)
                    .map(u64::from_be_bytes)
                    .ok_or_else(|| bad("block size"))?;
                let block = take_array(&mut buf)
                    .map(u64::from_be_bytes)
                    .ok_or_else(|| bad("block"))?;
                if !buf.is_empty() {
                    return Err(bad("trailing bytes"));
                }
                if block_size == 0 {
                    return Err(bad("block size 0"));
                }
                Ok(CacheKey::file_with_format(
                    location, version, format, block_size, block,
                ))
            }
            b'K' => {
                let ns = take_str(&mut buf).ok_or_else(|| bad("namespace"))?;
                let hash = take_bytes(&mut buf).ok_or_else(|| bad("hash"))?.to_vec();
                if !buf.is_empty() {
                    return Err(bad("trailing bytes"));
                }
                Ok(CacheKey::kv(ns, hash))
            }
            _ => Err(bad("unknown kind")),
        }
    }

    /// The replay/trace path of this key: the file location, or `kv/<ns>/<hex hash>`.
    pub fn path(&self) -> String {
        match self {
            CacheKey::File(k) => k.location.to_string(),
            CacheKey::Kv(k) => format!("kv/{}/{}", k.namespace, hex::encode(&k.hash)),
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&b[..len as usize]);
}

fn take_bytes<'a>(buf: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = u32::from_be_bytes(buf.get(..4)?.try_into().ok()?) as usize;
    let rest = buf.get(4..)?;
    let (head, tail) = (rest.get(..len)?, rest.get(len..)?);
    *buf = tail;
    Some(head)
}

fn take_array<const N: usize>(buf: &mut &[u8]) -> Option<[u8; N]> {
    let head: [u8; N] = buf.get(..N)?.try_into().ok()?;
    *buf = buf.get(N..)?;
    Some(head)
}

fn take_str(buf: &mut &[u8]) -> Option<String> {
    take_bytes(buf).and_then(|b| String::from_utf8(b.to_vec()).ok())
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheKey::File(k) if k.block_size == DEFAULT_BLOCK_SIZE => {
                write!(f, "file:{}@{}#{}", k.location, k.version, k.block)
            }
            CacheKey::File(k) => write!(
                f,
                "file:{}@{}#{}/{}",
                k.location, k.version, k.block, k.block_size
            ),
            CacheKey::Kv(k) => write!(f, "kv:{}/{}", k.namespace, hex::encode(&k.hash)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn file_key_round_trips(
            loc in ".{0,40}",
            ver in "[a-f0-9]{0,32}",
            bs in 1u64..(1 << 30),
            block in any::<u64>(),
        ) {
            let k = CacheKey::file_block(loc, ver, bs, block);
            prop_assert_eq!(k.encoded_len(), k.encode().len());
            prop_assert_eq!(CacheKey::decode(&k.encode()).unwrap(), k);
        }

        #[test]
        fn kv_key_round_trips(ns in "[a-z/]{0,20}", hash in proptest::collection::vec(any::<u8>(), 0..64)) {
            let k = CacheKey::kv(ns, hash);
            prop_assert_eq!(k.encoded_len(), k.encode().len());
            prop_assert_eq!(CacheKey::decode(&k.encode()).unwrap(), k);
        }
    }

    proptest! {
        /// `Eq`, `Hash` and `Ord` agree with the fields: keys built from separate
        /// allocations of equal text are equal and hash alike; the order is the fields'
        /// order (location, version, block), as before the content hash was added.
        #[test]
        fn eq_hash_and_order_follow_the_fields(
            a in ("[ab/]{0,6}", "[xy]{0,2}", 0u64..4),
            b in ("[ab/]{0,6}", "[xy]{0,2}", 0u64..4),
        ) {
            let ka = CacheKey::file(a.0.as_str(), a.1.as_str(), a.2);
            let kb = CacheKey::file(b.0.as_str(), b.1.as_str(), b.2);
            let ka2 = CacheKey::file(String::from(a.0.as_str()), String::from(a.1.as_str()), a.2);
            prop_assert!(ka == ka2);
            prop_assert_eq!(ka.content_hash(), ka2.content_hash());
            prop_assert_eq!(ka == kb, a == b);
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            if a != b {
                prop_assert_ne!(ka.content_hash(), kb.content_hash());
            }
        }

        #[test]
        fn kv_eq_and_hash_follow_the_fields(
            a in ("[ab]{0,3}", proptest::collection::vec(0u8..3, 0..3)),
            b in ("[ab]{0,3}", proptest::collection::vec(0u8..3, 0..3)),
        ) {
            let ka = CacheKey::kv(a.0.as_str(), a.1.clone());
            let kb = CacheKey::kv(b.0.as_str(), b.1.clone());
            prop_assert_eq!(ka == kb, a == b);
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            if a == b {
                prop_assert_eq!(ka.content_hash(), kb.content_hash());
            } else {
                prop_assert_ne!(ka.content_hash(), kb.content_hash());
            }
        }
    }

    #[test]
    fn file_and_kv_keys_never_compare_equal() {
        let f = CacheKey::file("a", "b", 0);
        let k = CacheKey::kv("a", b"b".to_vec());
        assert_ne!(f, k);
        assert_ne!(f.content_hash(), k.content_hash());
    }

    /// Finding 1 of issue 12: the block size and the format are part of a file key.
    #[test]
    fn block_size_and_format_tell_file_keys_apart() {
        let a = CacheKey::file_block("d/f", "v", 1 << 20, 1);
        let b = CacheKey::file_block("d/f", "v", 4 << 20, 1);
        assert_ne!(a, b);
        assert_ne!(a.encode(), b.encode());
        assert_ne!(a.content_hash(), b.content_hash());
        assert_eq!(a, CacheKey::file("d/f", "v", 1), "the default layout");
        let old = CacheKey::file_with_format("d/f", "v", FILE_FORMAT_VERSION + 1, 1 << 20, 1);
        assert_ne!(old, a);
        assert!(!old.is_current_format() && a.is_current_format());
        assert_eq!(CacheKey::decode(&old.encode()).unwrap(), old);
        // A version-1 encoding (no format, no block size) is refused, not misread.
        let mut v1 = vec![1u8, b'F'];
        for s in [&b"d/f"[..], &b"v"[..]] {
            v1.extend_from_slice(&(s.len() as u32).to_be_bytes());
            v1.extend_from_slice(s);
        }
        v1.extend_from_slice(&1u64.to_be_bytes());
        assert!(CacheKey::decode(&v1).is_err());
    }

    #[test]
    fn truncated_encoding_is_an_error() {
        let enc = CacheKey::file("a/b", "v1", 7).encode();
        for cut in 0..enc.len() {
            assert!(CacheKey::decode(&enc[..cut]).is_err(), "cut at {cut}");
        }
    }
}
