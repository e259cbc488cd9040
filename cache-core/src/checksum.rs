//! crc32c (Castagnoli; CRC-32/ISCSI), the checksum of every cached block and of the
//! disk tier's headers, in one place so that every path computes it the same way.
//!
//! Computed with `crc-fast` (in the tree already through `object_store`): it picks
//! the widest carry-less-multiply folding the CPU has at run time (AVX-512
//! VPCLMULQDQ on current x86_64, PMULL on aarch64) instead of the `crc32` instruction
//! the `crc32c` crate interleaves three ways; a disk hit verifies every byte it serves,
//! so this is on the critical path of each hit. The values are the same crc32c
//! (checked against the `crc32c` crate below), so nothing stored changes.

use crc_fast::{CrcAlgorithm, Digest};

/// The crc32c of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// A crc32c computed over parts given in order (the I/O engine checksums a read's
/// parts as they arrive).
#[derive(Clone)]
pub struct Crc32c(Digest);

impl Crc32c {
    pub fn new() -> Self {
        Crc32c(Digest::new(CrcAlgorithm::Crc32Iscsi))
    }

    /// Appends `data`.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The crc32c of everything appended so far.
    pub fn value(&self) -> u32 {
        self.0.finalize() as u32
    }
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Crc32c {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Crc32c({:#010x})", self.value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length from 0 to 300 (the implementations' head/tail handling), larger
    /// odd lengths, every start alignment, and split points for the running form: the
    /// same values as the `crc32c` crate, which wrote every block stored before.
    #[test]
    fn same_values_as_the_crc32c_crate() {
        let data: Vec<u8> = (0..(1usize << 20) + 977)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let lens = (0..300).chain([1023, 4096, 4097, 65_537, 1 << 20]);
        for len in lens {
            for start in [0usize, 1, 3, 7, 8, 63] {
                let d = &data[start..start + len];
                let want = ::crc32c::crc32c(d);
                assert_eq!(crc32c(d), want, "len {len} at {start}");
                for cut in [0, len / 3, len / 2, len] {
                    let mut c = Crc32c::new();
                    c.update(&d[..cut]);
                    c.update(&d[cut..]);
                    assert_eq!(c.value(), want, "len {len} at {start} cut {cut}");
                }
            }
        }
        assert_eq!(
            crc32c(b"123456789"),
            0xe306_9283,
            "the CRC-32/ISCSI check value"
        );
    }
}
