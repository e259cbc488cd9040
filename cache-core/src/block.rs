//! Checksummed block values.

use bytes::Bytes;

use crate::error::CacheError;

/// An immutable cached value with its crc32c. Tiers store the checksum next to the
/// bytes and verify it on every read from a medium that can corrupt (disk, device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    data: Bytes,
    crc: u32,
}

impl Block {
    /// Wraps bytes, computing their checksum.
    pub fn new(data: Bytes) -> Self {
        let crc = crate::checksum::crc32c(&data);
        Block { data, crc }
    }

    /// Rebuilds a block read back from a medium, checking it against the stored crc.
    pub fn from_stored(data: Bytes, crc: u32) -> Result<Self, CacheError> {
        let actual = crate::checksum::crc32c(&data);
        Self::from_checked(data, crc, actual)
    }

    /// [`Self::from_stored`] for `data` whose crc32c was already computed as `actual`
    /// (by the I/O engine, as the bytes arrived).
    pub fn from_checked(data: Bytes, crc: u32, actual: u32) -> Result<Self, CacheError> {
        if actual != crc {
            return Err(CacheError::Corrupt(format!(
                "crc32c mismatch: stored {crc:#010x}, computed {actual:#010x}"
            )));
        }
        Ok(Block { data, crc })
    }

    pub fn data(&self) -> &Bytes {
        &self.data
    }

    pub fn into_data(self) -> Bytes {
        self.data
    }

    pub fn crc(&self) -> u32 {
        self.crc
    }

    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_bytes_are_rejected() {
        let b = Block::new(Bytes::from_static(b"hello"));
        assert!(Block::from_stored(Bytes::from_static(b"hello"), b.crc()).is_ok());
        assert!(matches!(
            Block::from_stored(Bytes::from_static(b"hellp"), b.crc()),
            Err(CacheError::Corrupt(_))
        ));
    }
}
