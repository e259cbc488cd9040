//! On-disk formats of the disk tier: the block file header and the index value.
//! Pure encode/decode, no I/O, so every rule is unit-tested.
//!
//! Block file (all integers little-endian):
//!
//! ```text
//! offset  size  field
//!      0     8  magic "STRATAB\0"
//!      8     2  format version (1)
//!     10     2  flags (0; reserved)
//!     12     4  header_len: bytes before the data, a multiple of 4096
//!     16     4  key_len
//!     20     4  crc32c of the data
//!     24     8  data_len
//!     32     4  crc32c of bytes 0..32 followed by the key
//!     36     4  reserved (0)
//!     40  key_len  the key, `CacheKey::encode`
//!      …        zero padding up to header_len
//! header_len  data_len  the data
//!      …        zero padding up to a multiple of 4096 (the file's size)
//! ```
//!
//! The data starts on a 4096 boundary and the file is a whole number of 4096 units, so
//! one `O_DIRECT` read of the file's size fetches header and data into one aligned
//! buffer, and the data is served as a zero-copy slice of it.
//!
//! Index value (RocksDB, keyed by `CacheKey::encode`): `version:u8 (1), file_id:u64,
//! data_len:u64, crc:u32, header_len:u32` = 25 bytes, little-endian.

use crate::io::{align_up, is_aligned, ALIGN};

pub const MAGIC: [u8; 8] = *b"STRATAB\0";
pub const FORMAT_VERSION: u16 = 1;
/// Fixed part of the header, before the key.
pub const FIXED_HEADER: usize = 40;
pub const INDEX_VALUE_VERSION: u8 = 1;
pub const INDEX_VALUE_LEN: usize = 25;
/// Largest data length a header or index value may state (1 TiB, far above any block):
/// larger ones are corrupt, and would overflow the file size and data range computed
/// from them (found by fuzzing `check_header`: a header and index agreeing on a
/// `data_len` near 2^64 made the range wrap and the read panic slicing it).
pub const MAX_DATA_LEN: u64 = 1 << 40;

/// Where a block lives and what it must look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Names the file; never reused within a cache directory.
    pub file_id: u64,
    pub data_len: u64,
    pub crc: u32,
    pub header_len: u32,
}

/// The size of the file of a block of `data_len` bytes whose key encodes to `key_len`
/// bytes: its header, then the data padded to a whole page.
pub fn file_len(key_len: usize, data_len: u64) -> u64 {
    header_len(key_len) as u64 + data_len.div_ceil(ALIGN as u64) * ALIGN as u64
}

impl IndexEntry {
    /// The size the block file must have.
    pub fn file_len(&self) -> u64 {
        u64::from(self.header_len) + align_up(self.data_len as usize) as u64
    }

    pub fn encode(&self) -> [u8; INDEX_VALUE_LEN] {
        let mut out = [0u8; INDEX_VALUE_LEN];
        out[0] = INDEX_VALUE_VERSION;
        out[1..9].copy_from_slice(&self.file_id.to_le_bytes());
        out[9..17].copy_from_slice(&self.data_len.to_le_bytes());
        out[17..21].copy_from_slice(&self.crc.to_le_bytes());
        out[21..25].copy_from_slice(&self.header_len.to_le_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() != INDEX_VALUE_LEN {
            return Err(format!("index value of {} bytes", b.len()));
        }
        if b[0] != INDEX_VALUE_VERSION {
            return Err(format!("index value version {}", b[0]));
        }
        let e = IndexEntry {
            file_id: u64::from_le_bytes(arr(&b[1..9])),
            data_len: u64::from_le_bytes(arr(&b[9..17])),
            crc: u32::from_le_bytes(arr(&b[17..21])),
            header_len: u32::from_le_bytes(arr(&b[21..25])),
        };
        if !is_aligned(e.header_len as usize) || (e.header_len as usize) < ALIGN {
            return Err(format!("index header_len {}", e.header_len));
        }
        if e.data_len > MAX_DATA_LEN {
            return Err(format!("index data_len {}", e.data_len));
        }
        Ok(e)
    }
}

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[..N]);
    out
}

/// Header length for a key of `key_len` bytes.
pub fn header_len(key_len: usize) -> usize {
    align_up(FIXED_HEADER + key_len)
}

/// Writes the header into `out[..header_len(key.len())]`, its padding zeroed (so a
/// recycled buffer's stale bytes never reach the file).
pub fn write_header(out: &mut [u8], key: &[u8], data_len: u64, crc: u32) {
    let hlen = header_len(key.len());
    out[32..FIXED_HEADER].fill(0);
    out[FIXED_HEADER + key.len()..hlen].fill(0);
    out[0..8].copy_from_slice(&MAGIC);
    out[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[10..12].copy_from_slice(&0u16.to_le_bytes());
    out[12..16].copy_from_slice(&(hlen as u32).to_le_bytes());
    out[16..20].copy_from_slice(&(key.len() as u32).to_le_bytes());
    out[20..24].copy_from_slice(&crc.to_le_bytes());
    out[24..32].copy_from_slice(&data_len.to_le_bytes());
    out[FIXED_HEADER..FIXED_HEADER + key.len()].copy_from_slice(key);
    let hcrc = header_crc(&out[0..32], key);
    out[32..36].copy_from_slice(&hcrc.to_le_bytes());
}

fn header_crc(fixed: &[u8], key: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(fixed), key)
}

/// Checks a block file's header against what the index expects for `key`; returns
/// the data's byte range within the file. The data's own crc is checked by the caller
/// (`Block::from_stored`).
pub fn check_header(
    file: &[u8],
    key: &[u8],
    expect: &IndexEntry,
) -> Result<std::ops::Range<usize>, String> {
    if file.len() < FIXED_HEADER {
        return Err(format!("file of {} bytes has no header", file.len()));
    }
    if file[0..8] != MAGIC {
        return Err("bad magic".into());
    }
    let version = u16::from_le_bytes(arr(&file[8..10]));
    if version != FORMAT_VERSION {
        return Err(format!("unknown format version {version}"));
    }
    let hlen = u32::from_le_bytes(arr(&file[12..16]));
    let klen = u32::from_le_bytes(arr(&file[16..20])) as usize;
    let crc = u32::from_le_bytes(arr(&file[20..24]));
    let dlen = u64::from_le_bytes(arr(&file[24..32]));
    let hcrc = u32::from_le_bytes(arr(&file[32..36]));
    let stored_key = file
        .get(FIXED_HEADER..FIXED_HEADER + klen)
        .ok_or_else(|| format!("key of {klen} bytes past end of file"))?;
    if header_crc(&file[0..32], stored_key) != hcrc {
        return Err("header checksum mismatch".into());
    }
    if stored_key != key {
        return Err("block file holds another key".into());
    }
    if hlen != expect.header_len || dlen != expect.data_len || crc != expect.crc {
        return Err("header disagrees with the index".into());
    }
    if dlen > MAX_DATA_LEN {
        return Err(format!("data_len {dlen} in header"));
    }
    let start = hlen as usize;
    let end = start
        .checked_add(dlen as usize)
        .ok_or_else(|| format!("data_len {dlen} in header"))?;
    if file.len() < end {
        return Err(format!("truncated: {} of {end} bytes present", file.len()));
    }
    Ok(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(key: &[u8], data: &[u8]) -> (Vec<u8>, IndexEntry) {
        let crc = crc32c::crc32c(data);
        let hlen = header_len(key.len());
        let e = IndexEntry {
            file_id: 7,
            data_len: data.len() as u64,
            crc,
            header_len: hlen as u32,
        };
        let mut file = vec![0u8; e.file_len() as usize];
        write_header(&mut file, key, data.len() as u64, crc);
        file[hlen..hlen + data.len()].copy_from_slice(data);
        (file, e)
    }

    #[test]
    fn header_round_trips() {
        let (file, e) = sample(b"key", b"hello world");
        assert!(is_aligned(file.len()));
        let r = check_header(&file, b"key", &e).expect("valid");
        assert_eq!(&file[r], b"hello world");
        assert_eq!(IndexEntry::decode(&e.encode()), Ok(e));
    }

    #[test]
    fn every_header_byte_is_checked() {
        let (file, e) = sample(b"some key", b"data");
        // Flipping any byte of the fixed header or the key is detected.
        for i in 0..FIXED_HEADER + 8 {
            if (36..40).contains(&i) {
                continue; // reserved, outside the header crc
            }
            let mut bad = file.clone();
            bad[i] ^= 0x40;
            assert!(check_header(&bad, b"some key", &e).is_err(), "byte {i}");
        }
    }

    #[test]
    fn wrong_key_and_truncation_are_detected() {
        let (file, e) = sample(b"k1", &[5u8; 5000]);
        assert!(check_header(&file, b"k2", &e).is_err());
        let cut = e.header_len as usize + 4999;
        assert!(check_header(&file[..cut], b"k1", &e).is_err());
        assert!(check_header(&file[..20], b"k1", &e).is_err());
    }

    #[test]
    fn a_data_len_near_2_pow_64_is_refused_not_wrapped() {
        // Header and index agree on a data_len whose range from header_len wraps: it
        // must be an error, not an inverted range that panics the read slicing it.
        let key = b"k";
        let dlen = u64::MAX - 100;
        let hlen = header_len(key.len());
        let mut file = vec![0u8; hlen];
        write_header(&mut file, key, dlen, 9);
        let e = IndexEntry {
            file_id: 1,
            data_len: dlen,
            crc: 9,
            header_len: hlen as u32,
        };
        assert!(check_header(&file, key, &e).is_err());
        // Nor does such an index value decode (its file_len would overflow too).
        assert!(IndexEntry::decode(&e.encode()).is_err());
        let e = IndexEntry {
            data_len: MAX_DATA_LEN,
            ..e
        };
        assert_eq!(IndexEntry::decode(&e.encode()), Ok(e));
    }

    #[test]
    fn bad_index_values_are_rejected() {
        let e = IndexEntry {
            file_id: 1,
            data_len: 2,
            crc: 3,
            header_len: 4096,
        };
        let mut v = e.encode().to_vec();
        assert!(IndexEntry::decode(&v[..24]).is_err());
        v[0] = 9;
        assert!(IndexEntry::decode(&v).is_err());
        let mut v = e.encode();
        v[21] = 1; // header_len 4097
        assert!(IndexEntry::decode(&v).is_err());
    }
}
