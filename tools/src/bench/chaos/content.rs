//! Bytes the bench can check without keeping them: every file and every KV block is a
//! function of a seed, addressable by position, so any range read back is compared
//! against what it must be.

/// SplitMix64: a fast, well-mixed 64-bit hash of a counter.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the bytes at `offset..` of the stream named by `seed`.
pub fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut pos = offset;
    let mut i = 0;
    while i < buf.len() {
        let word = mix(seed ^ mix(pos / 8)).to_le_bytes();
        let start = (pos % 8) as usize;
        let n = (8 - start).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&word[start..start + n]);
        i += n;
        pos += n as u64;
    }
}

/// How many bytes of `got` differ from the stream `seed` at `offset`.
pub fn count_wrong(seed: u64, offset: u64, got: &[u8]) -> u64 {
    let mut want = vec![0u8; got.len()];
    fill(seed, offset, &mut want);
    want.iter().zip(got).filter(|(a, b)| a != b).count() as u64
}

/// The seed of dataset file `index`.
pub fn file_seed(bench_seed: u64, index: usize) -> u64 {
    mix(bench_seed ^ mix(0xF11E_0000 + index as u64))
}

/// The name of dataset file `index`.
pub fn file_name(index: usize) -> String {
    format!("shard-{index:04}.bin")
}

/// Name of writer `writer`'s `seq`-th file, written through the mount (at its root,
/// beside the dataset, whose names it never takes).
pub fn written_name(writer: u64, seq: u64) -> String {
    format!("written-w{writer}-{seq:06}.bin")
}

/// Seed of the bytes of a written file (its bytes are `fill(seed, ..)`).
pub fn written_seed(bench_seed: u64, writer: u64, seq: u64) -> u64 {
    mix(bench_seed ^ mix(0x3A17_0000 ^ (writer << 40) ^ seq))
}

/// A KV block's key: 32 bytes named by (bench seed, client, sequence number).
pub fn block_key(bench_seed: u64, client: usize, seq: u64) -> [u8; 32] {
    let mut key = [0u8; 32];
    let base = mix(bench_seed ^ mix(((client as u64) << 48) ^ seq));
    for (i, chunk) in key.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&mix(base ^ i as u64).to_le_bytes());
    }
    key
}

/// A block's content seed and size, both derived from its key alone, so a block read
/// back is checked knowing only its key.
pub fn block_shape(key: &[u8; 32], min: u64, max: u64) -> (u64, usize) {
    let mut first = [0u8; 8];
    first.copy_from_slice(&key[..8]);
    let seed = u64::from_le_bytes(first);
    let span = max.saturating_sub(min) + 1;
    (seed, (min + mix(seed) % span) as usize)
}

/// The full content of the block `key`.
pub fn block_bytes(key: &[u8; 32], min: u64, max: u64) -> Vec<u8> {
    let (seed, size) = block_shape(key, min, max);
    let mut v = vec![0u8; size];
    fill(seed, 0, &mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_equals_the_same_bytes_of_the_whole() {
        let mut whole = vec![0u8; 1000];
        fill(42, 0, &mut whole);
        for (off, len) in [(0, 1), (3, 17), (8, 8), (13, 500), (999, 1)] {
            let mut part = vec![0u8; len];
            fill(42, off as u64, &mut part);
            assert_eq!(part, whole[off..off + len], "{off}+{len}");
        }
        assert_eq!(count_wrong(42, 13, &whole[13..100]), 0);
        let mut bad = whole[13..100].to_vec();
        bad[5] ^= 1;
        bad[50] ^= 0x80;
        assert_eq!(count_wrong(42, 13, &bad), 2);
    }

    #[test]
    fn keys_differ_and_shapes_stay_in_bounds() {
        let a = block_key(1, 0, 0);
        assert_ne!(a, block_key(1, 0, 1));
        assert_ne!(a, block_key(1, 1, 0));
        assert_ne!(a, block_key(2, 0, 0));
        for seq in 0..200 {
            let (_, size) = block_shape(&block_key(9, 3, seq), 4096, 65536);
            assert!((4096..=65536).contains(&(size as u64)));
        }
    }
}
