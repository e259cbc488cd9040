//! Deterministic, incompressible bytes for tests, benchmarks and the demo: the same
//! `(len, seed)` gives the same bytes on every run, different seeds give different
//! bytes (so a mixed-up block is detected), and no layer can shortcut them.

/// Fills `buf` from a xorshift64 generator seeded by `seed`: each step's state,
/// little-endian, fills the next 8 bytes (the last chunk takes the leading bytes).
pub fn fill_xorshift(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for w in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
    }
}

/// `len` bytes of [`fill_xorshift`] with `seed`.
pub fn xorshift_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_xorshift(&mut v, seed);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_seeded_and_prefix_stable() {
        assert_eq!(xorshift_bytes(1000, 7), xorshift_bytes(1000, 7));
        assert_ne!(xorshift_bytes(1000, 7), xorshift_bytes(1000, 8));
        assert_eq!(xorshift_bytes(13, 7)[..], xorshift_bytes(1000, 7)[..13]);
        assert!(xorshift_bytes(0, 1).is_empty());
    }
}
