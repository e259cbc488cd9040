//! Typed cache keys.
//!
//! Every item the cache holds is named by one [`CacheKey`]: either a block of an
//! object-store file or an opaque KV-cache block. Keys have a stable byte encoding
//! ([`CacheKey::encode`]) used by the persistent disk index, so it is versioned and must
//! not change without a bump of [`KEY_ENCODING_VERSION`].

use std::fmt;
use std::sync::Arc;

use crate::error::CacheError;

/// Version byte leading every encoded key.
pub const KEY_ENCODING_VERSION: u8 = 1;

/// Default file block size: 1 MiB, large enough that a 1 MiB FUSE read is one block
/// fetch and small enough that a random 4 KiB read does not drag in much more.
pub const DEFAULT_BLOCK_SIZE: u64 = 1 << 20;

/// Smallest and largest KV block the cache accepts (1 KiB .. 64 MiB).
pub const KV_BLOCK_MIN: usize = 1 << 10;
pub const KV_BLOCK_MAX: usize = 64 << 20;

/// A block of one version of an object-store file.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileBlockKey {
    /// Object location relative to the store root (e.g. `train/shard-0001.tar`).
    pub location: Arc<str>,
    /// ETag or other version tag of the object; a changed object has a new key, so
    /// two versions are never mixed.
    pub version: Arc<str>,
    /// Block index within the object (offset / block size).
    pub block: u64,
}

/// An opaque KV-cache block, content-addressed by the client.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KvBlockKey {
    /// Namespace (model + tenant); keeps tenants apart.
    pub namespace: Arc<str>,
    /// Content hash given by the client (at most 64 bytes).
    pub hash: Arc<[u8]>,
}

/// The key of any cached item.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CacheKey {
    File(FileBlockKey),
    Kv(KvBlockKey),
}

impl CacheKey {
    pub fn file(location: impl Into<Arc<str>>, version: impl Into<Arc<str>>, block: u64) -> Self {
        CacheKey::File(FileBlockKey {
            location: location.into(),
            version: version.into(),
            block,
        })
    }

    pub fn kv(namespace: impl Into<Arc<str>>, hash: impl Into<Arc<[u8]>>) -> Self {
        CacheKey::Kv(KvBlockKey {
            namespace: namespace.into(),
            hash: hash.into(),
        })
    }

    /// Stable, versioned byte encoding (used as the disk index key).
    ///
    /// Layout: `version:u8, kind:u8` then for files `len:u32 location, len:u32 version,
    /// block:u64`, for KV `len:u32 namespace, len:u32 hash`; integers big-endian so that
    /// keys of one object sort by block.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.push(KEY_ENCODING_VERSION);
        match self {
            CacheKey::File(k) => {
                out.push(b'F');
                put_bytes(&mut out, k.location.as_bytes());
                put_bytes(&mut out, k.version.as_bytes());
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
                let block = buf
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_be_bytes)
                    .ok_or_else(|| bad("block"))?;
                if buf.len() != 8 {
                    return Err(bad("trailing bytes"));
                }
                Ok(CacheKey::file(location, version, block))
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

    /// A 64-bit fingerprint, stable across processes (FNV-1a over the encoding); used
    /// for file names on disk and for sampling.
    pub fn fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.encode() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
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
            CacheKey::File(k) => write!(f, "file:{}@{}#{}", k.location, k.version, k.block),
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
        fn file_key_round_trips(loc in ".{0,40}", ver in "[a-f0-9]{0,32}", block in any::<u64>()) {
            let k = CacheKey::file(loc, ver, block);
            prop_assert_eq!(CacheKey::decode(&k.encode()).unwrap(), k);
        }

        #[test]
        fn kv_key_round_trips(ns in "[a-z/]{0,20}", hash in proptest::collection::vec(any::<u8>(), 0..64)) {
            let k = CacheKey::kv(ns, hash);
            prop_assert_eq!(CacheKey::decode(&k.encode()).unwrap(), k);
        }
    }

    #[test]
    fn truncated_encoding_is_an_error() {
        let enc = CacheKey::file("a/b", "v1", 7).encode();
        for cut in 0..enc.len() {
            assert!(CacheKey::decode(&enc[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn fingerprint_is_stable() {
        // Pinned: the fingerprint names files on disk, so it must never change silently.
        assert_eq!(
            CacheKey::file("a", "v", 0).fingerprint(),
            CacheKey::file("a", "v", 0).fingerprint()
        );
        assert_ne!(
            CacheKey::file("a", "v", 0).fingerprint(),
            CacheKey::file("a", "v", 1).fingerprint()
        );
    }
}
