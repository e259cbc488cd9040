//! Granularity that follows the pattern (issue 13, item 3): a stream of small random
//! reads is fetched and cached in units smaller than a block, so a 4 KiB page lookup
//! does not pull (20 ms + 5 ms at 200 MB/s) and pin a whole 1 MiB block of which it
//! reads 0.4%; the cache then holds hundreds of such pages where it held one block.
//! Sequential streams (and reads of unknown pattern) keep whole blocks: their
//! neighbours are read next, and readahead works in blocks. Pure logic: the replay
//! uses it for every demand miss, with the tracker's block-level pattern of the read;
//! the daemon's [`crate::reader::ObjectReader`] asks the same
//! [`Granularity::demand_unit`] for every demand read of a block it does not hold, so a
//! `strata` replay figure is a statement about the daemon with `[cache]
//! read_units = "auto"`.
//!
//! ## How units are stored: as their own keys
//!
//! Unit `i` of `u` bytes of an object version is cached under the key of block `i` of
//! the same version cut into `u`-byte blocks ([`crate::CacheKey::file_block`] with
//! `block_size = u`). That key already means "raw bytes `i*u .. (i+1)*u`" (the key's
//! format rule), so a unit is a complete cache item: every tier stores, checksums,
//! evicts and recovers it as it does a block, and no tier ever holds a partially filled
//! block. The costs are explicit: a block and units of it may both be cached (the block
//! is always preferred, and the units age out), and a read outside the cached units of
//! a block fetches the whole block, never a second unit next to the first (see
//! [`Granularity::dense_units`]). Partial blocks with a per-block bitmap of valid ranges
//! would save that overlap but would need range-aware checksums, a recovery that
//! rebuilds the bitmaps, and single-flight per range: more ways to return short bytes.
//!
//! A cached unit holding a read serves it whatever the stream's pattern (a stream not
//! classified yet, as after a restart, finds the units an earlier one cached); only
//! fetching in units needs the pattern.

use strata_types::Pattern;

use crate::stream::Observation;

/// Reads up to this many bytes are small: 64 KiB (a database page is 4-64 KiB; the
/// recorded traces' array chunks, 256 KiB, and shard reads are larger). The tracker
/// counts a stream's small reads with the same bound.
pub const SMALL_READ_BYTES: u64 = 64 << 10;

/// See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granularity {
    /// Reads up to this many bytes are small: [`SMALL_READ_BYTES`].
    pub small_read: u64,
    /// The smallest unit fetched: 4 KiB, one database page. The transfer a larger unit
    /// adds is nothing next to a GET's latency, but its cache space is not: the recorded
    /// SQLite lookups (skewed keys spread over every page) never read a page's
    /// neighbours, so a 16 KiB unit holds one useful page in four. Replayed at 10 / 20
    /// / 40% of the file: byte hit ratio 0.171 / 0.315 / 0.536 with 4 KiB units against
    /// 0.134 / 0.269 / 0.450 with 16 KiB (the best baseline: 0.113 / 0.206 / 0.404), JCT
    /// 134 / 112 / 77 s against 140 / 119 / 91 s. Its cost: the disk tier's 4 KiB
    /// header per item doubles a 4 KiB unit's footprint there.
    pub min_unit: u64,
    /// Files of fewer blocks keep whole blocks: 16. A reader of a small file (an
    /// array's header, then its data) reads the rest of the block next, and holding the
    /// whole file costs at most 16 GETs; sparse reads of a large file are where units
    /// pay (a 43 MB SQLite database: a 4 KiB page per 1 MiB block fetched).
    pub min_file_blocks: u64,
    /// Units of one block cached at once that make it dense: 1. A miss in a block
    /// with a unit of it still cached fetches the whole block: the reader comes back
    /// to this block while the cache holds its earlier unit, so the block is worth
    /// holding whole (one GET for what would be many). Under pressure units are
    /// evicted before the reader returns and stay small; with room to spare blocks are
    /// cached whole, as LRU would. Measured on the corpus against 2: the same 23 of 51
    /// pairs behind, `mix` 0.915 / 1.103 / 1.418x the best baseline at 10 / 20 / 40%
    /// (2: 0.926 / 1.117 / 1.429x), SQLite 0.83-0.86x (2: 0.83-0.84x); measured before
    /// d95e18b (a cached unit's re-read then fetched its dense block; after it: 0.913 /
    /// 1.103 / 1.423x and 0.83-0.86x).
    pub dense_units: u32,
    /// A file more than this many times the cache's bytes is read in units even where
    /// its blocks look dense: 2. A reader returning to a block of such a file finds the
    /// earlier unit still cached (what [`Self::dense_units`] takes as "worth the whole
    /// block") only because units are small; a whole block would be evicted before the
    /// next read of it, as LRU holds about `cache / file` of a uniformly read file's
    /// blocks. Where the cache can hold half the file or more, whole blocks pay: one GET
    /// for what would be hundreds of page GETs. Measured on the recorded SQLite lookups
    /// (an LRU model with 4 KiB units, JCT of the replay's link): units win at 10-40% of
    /// the file (124 / 98 / 84 s against 149 / 137 / 106 s for the dense rule), the
    /// dense rule from 50% on (89 against 84, then 74 against 84 at 60%). Only for a
    /// stream the tracker saw reading in small pieces ([`Observation::small_reads`]):
    /// the small reads of a stream of large ones are the ends of larger reads (an HDF5
    /// slice split at a chunk boundary) that the block serves next.
    pub sparse_file_ratio: u64,
    /// Files of at most this share of the cache's bytes (all levels), in percent, keep
    /// whole blocks (a skewed stream's: `fits_whole_skewed_percent`): 75 (see
    /// [`FITS_WHOLE_PERCENT`]).
    pub fits_whole_percent: u64,
    /// The same for a stream whose blocks are skewed (re-read): 100 (see
    /// [`FITS_WHOLE_SKEWED_PERCENT`]).
    pub fits_whole_skewed_percent: u64,
}

/// What the cache holds (or is fetching) around a candidate unit: see
/// [`Granularity::demand_unit`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnitsHeld {
    /// The unit itself (served from the cache, or joining its fetch).
    pub unit: bool,
    /// Units of any size of the same block (a caller may stop counting at
    /// [`Granularity::dense_units`], all the decision compares it with).
    pub in_block: u32,
}

/// Share of the cache a file may take and still be fetched in whole blocks: 75%, so a
/// file that fits beside a quarter of the cache for everything else keeps blocks.
/// Measured on the replay corpus (docs/BENCHMARKS.md, "Multi-tenant mixes"): the 43.5 MB
/// SQLite database in the `mix` / `mix4` traces at 40% (66 / 83 MiB) took 1.25 / 1.15x
/// its LRU JCT in units (`mix`: 101 demand misses against LRU's 42) and 1.07 / 1.00x
/// with this (56 / 42 misses). 0.6 is below that file's share at 40% of `mix` (no change); 1.0 and 1.5
/// also cover `mix4` / `mix` at 20% (the file about the cache's size), where units are
/// the better choice (+1.4% / +4.7% total JCT); the SQLite trace alone (17 MB at 40%)
/// keeps its units at every share tried. (Measured with 16 KiB units, before
/// [`Granularity::sparse_file_ratio`].)
pub const FITS_WHOLE_PERCENT: u64 = 75;

/// Share of the cache a file read by a *skewed* stream (blocks re-read) may take and still
/// be fetched in whole blocks: 100, a file the cache can hold. Its blocks are re-read, so
/// once cached they stay worth holding, and each whole block is one GET for what would be
/// up to 256 page GETs: fetched in units, a reader whose skew reaches across the file
/// pays a GET per page it touches before the cache warms. Held-out `mixh8` at 20% (a
/// 51 MB SQLite join database beside a tile server and a backup restore, in a 64 MB
/// cache: 80%): 164.8 s in units against 98.1 s with this (ARC 93.8 s), the SQLite tenant
/// 81 -> 27 s. A random stream keeps [`FITS_WHOLE_PERCENT`]: `mixh5` at 40% reads a
/// 101 MB token file (98% of the cache) at uniformly random 2 KiB windows, and whole
/// blocks took its tenant from 83 to 130 s. 150 was measured too: `mixh` 40% +28%,
/// `mixh11` 40% +10%, `mixh12` 20% +9% (SQLite files 1-1.5x the cache, shared). Over
/// every trace (docs/BENCHMARKS.md "Whole blocks for a skewed stream over a file the
/// cache can hold"): held-out 0.8374 -> 0.8353, corpus `mix4` 20% +2.4% (its SQLite
/// file is 99.7% of the cache; still 0.81x LRU).
pub const FITS_WHOLE_SKEWED_PERCENT: u64 = 100;

impl Default for Granularity {
    fn default() -> Self {
        Granularity {
            small_read: SMALL_READ_BYTES,
            min_unit: 4 << 10,
            min_file_blocks: 16,
            dense_units: 1,
            sparse_file_ratio: 2,
            fits_whole_percent: FITS_WHOLE_PERCENT,
            fits_whole_skewed_percent: FITS_WHOLE_SKEWED_PERCENT,
        }
    }
}

impl Granularity {
    /// Whole blocks always (the layout before this module).
    pub const BLOCKS: Granularity = Granularity {
        small_read: 0,
        min_unit: u64::MAX,
        min_file_blocks: u64::MAX,
        dense_units: 0,
        sparse_file_ratio: u64::MAX,
        fits_whole_percent: 0,
        fits_whole_skewed_percent: 0,
    };

    /// Whether a file of `file_size` bytes is too large for a cache of `cache_bytes` (all
    /// levels) to keep its blocks whole ([`Self::sparse_file_ratio`]).
    pub fn beyond_cache(&self, file_size: u64, cache_bytes: u64) -> bool {
        file_size > cache_bytes.saturating_mul(self.sparse_file_ratio)
    }

    /// Whether misses in a block of a file of `file_blocks` blocks, `cached_units` of
    /// whose units are cached, may fetch units at all ([`Self::unit`] then decides):
    /// `beyond_cache` (see [`Self::beyond_cache`]) overrides the dense rule.
    pub fn sparse(&self, file_blocks: u64, cached_units: u32, beyond_cache: bool) -> bool {
        file_blocks >= self.min_file_blocks && (cached_units < self.dense_units || beyond_cache)
    }

    /// The unit a demand read of `len` bytes at `offset` within block-sized `block` of a
    /// file of `file_size` bytes reads through, when that block is neither cached nor in
    /// flight: `Some(unit)` (smaller than the block) to read, and on a miss fetch and
    /// cache, only the aligned unit around the read; `None` for the whole block. `held`
    /// says what the cache holds around a unit of the given size: asked for the unit
    /// [`Self::unit`] gives (`candidate` true) for the stream's block pattern `obs.blocks`,
    /// else, for a read that is not a unit read
    /// by its pattern (a stream not classified yet, as after a restart), for each unit
    /// size that holds the read (`candidate` false; only `unit` is read): a cached unit
    /// holding the read serves it rather than a fetch of its block. `cache_bytes` is the
    /// cache's size, all levels (see [`Self::sparse_file_ratio`]). The one decision the
    /// replay and the daemon's reader share.
    #[allow(clippy::too_many_arguments)]
    pub fn demand_unit(
        &self,
        obs: &Observation,
        offset: u64,
        len: u64,
        block: u64,
        file_size: u64,
        cache_bytes: u64,
        mut held: impl FnMut(u64, bool) -> UnitsHeld,
    ) -> Option<u64> {
        let file_blocks = file_size.div_ceil(block.max(1));
        let whole_percent = if obs.blocks == Pattern::Skewed {
            self.fits_whole_skewed_percent
        } else {
            self.fits_whole_percent
        };
        let fits_whole =
            u128::from(file_size) * 100 <= u128::from(cache_bytes) * u128::from(whole_percent);
        if len == 0 || file_blocks < self.min_file_blocks || fits_whole {
            return None;
        }
        // Runs are read ahead only for a stream of small pieces: the small reads of a
        // stream of large ones are the ends of larger reads, not records.
        let ahead = if obs.small_reads { obs.run_ahead } else { len };
        // A stream sweeping forward in small pieces reads all of the block: fetch it.
        let unit = if obs.small_reads && (obs.sweeping || obs.block_local) {
            block
        } else {
            self.unit_ahead(obs.blocks, offset, len, ahead, block)
        };
        let held_other = |held: &mut dyn FnMut(u64, bool) -> UnitsHeld| {
            self.unit_size_iter(block)
                .filter(|&u| u != unit && offset / u == (offset + len - 1) / u)
                .find(|&u| held(u, false).unit)
        };
        if unit < block {
            let h = held(unit, true);
            if h.unit {
                return Some(unit);
            }
            // A unit of another size holding the read serves it (the unit a run's
            // first read fetched, sized for the whole run, holds the reads after it).
            if let Some(u) = held_other(&mut held) {
                return Some(u);
            }
            // Only a stream that reads in small pieces is kept sparse in a large file: a
            // stream of mostly large reads whose small ones are the ends of larger reads
            // (an HDF5 slice split at a chunk boundary) is served by the block next.
            let beyond_cache = obs.small_reads && self.beyond_cache(file_size, cache_bytes);
            return self
                .sparse(file_blocks, h.in_block, beyond_cache)
                .then_some(unit);
        }
        held_other(&mut held)
    }

    /// Every unit size [`Self::unit`] can give in a block of `block` bytes, smallest
    /// first (none for [`Self::BLOCKS`]): where a reader looks for units of a block.
    pub fn unit_sizes(&self, block: u64) -> Vec<u64> {
        self.unit_size_iter(block).collect()
    }

    /// [`Self::unit_sizes`] without the allocation: [`Self::demand_unit`] walks them on
    /// every miss of a unit read (replay speed: a `Vec` per miss was 3% of a `strata`
    /// replay's instructions on the held-out `mixh` trace).
    fn unit_size_iter(&self, block: u64) -> impl Iterator<Item = u64> {
        let first = if self.small_read == 0 || self.min_unit >= block {
            None
        } else {
            Some(self.min_unit.max(1).next_power_of_two())
        };
        std::iter::successors(first, |&u| u.checked_mul(2))
            .take_while(move |&u| u < block && block.is_multiple_of(u))
    }

    /// The unit to fetch and cache for a demand read of `len` bytes at `offset` within a
    /// block of `block` bytes, by a stream whose blocks the tracker classified
    /// `pattern`: `block`, unless the stream is random or skewed and the read small;
    /// then the smallest power of two of at least `min_unit` and `len` whose aligned
    /// unit holds the whole read. Units divide the block, so a unit never straddles two
    /// blocks.
    pub fn unit(&self, pattern: Pattern, offset: u64, len: u64, block: u64) -> u64 {
        self.unit_ahead(pattern, offset, len, len, block)
    }

    /// [`Self::unit`] for a read the stream is expected to read on from, `ahead` bytes
    /// from `offset` in all ([`Observation::run_ahead`]; at most to the block's end):
    /// the unit holds them all where one smaller than the block can, so a record read
    /// in 4 KiB pieces (a zip member) is one fetch, not one per piece. Whether the read
    /// is small, and so fetched in units at all, is still its own length.
    pub fn unit_ahead(
        &self,
        pattern: Pattern,
        offset: u64,
        len: u64,
        ahead: u64,
        block: u64,
    ) -> u64 {
        if !matches!(pattern, Pattern::Random | Pattern::Skewed)
            || len == 0
            || len > self.small_read
        {
            return block;
        }
        // The whole run in one unit, however large its aligned unit must be (a run just
        // past a 64 KiB boundary takes 128 KiB): at most the block, which a block cache
        // fetches for every read. Measured on the held-out zip archive: capping the
        // unit at twice the run (the rest fetched as the reader gets there) lost
        // 0.91 / 0.93 / 1.01 -> 1.06 / 1.08 / 1.16x the best baseline's JCT.
        let to_block_end = block.saturating_sub(offset.checked_rem(block).unwrap_or(0));
        let span = ahead.min(to_block_end).max(len);
        let mut unit = self.min_unit.max(span).next_power_of_two();
        while unit < block {
            if !block.is_multiple_of(unit) {
                return block;
            }
            if offset / unit == (offset + span - 1) / unit {
                return unit;
            }
            unit *= 2;
        }
        block
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    /// A cache the 42 MiB test files neither fit 3/4 of nor exceed twice (so the dense
    /// rule applies).
    const CACHE: u64 = 32 * MIB;

    /// A stream of small reads with block pattern `p`.
    fn obs(p: Pattern) -> Observation {
        Observation {
            blocks: p,
            small_reads: true,
            ..Observation::default()
        }
    }

    #[test]
    fn small_random_reads_get_small_units() {
        let g = Granularity::default();
        assert_eq!(g.unit(Pattern::Random, 8192, 4096, MIB), 4 << 10);
        assert_eq!(g.unit(Pattern::Skewed, 24, 16, MIB), 4 << 10);
        assert_eq!(g.unit(Pattern::Random, 6144, 4096, MIB), 16 << 10);
        assert_eq!(g.unit(Pattern::Random, 0, 40 << 10, MIB), 64 << 10);
    }

    #[test]
    fn sequential_unknown_and_large_reads_keep_whole_blocks() {
        let g = Granularity::default();
        assert_eq!(g.unit(Pattern::Sequential, 0, 4096, MIB), MIB);
        assert_eq!(g.unit(Pattern::Unknown, 0, 4096, MIB), MIB);
        assert_eq!(g.unit(Pattern::Random, 0, 256 << 10, MIB), MIB);
        assert_eq!(Granularity::BLOCKS.unit(Pattern::Random, 0, 4096, MIB), MIB);
    }

    #[test]
    fn files_the_cache_can_hold_keep_whole_blocks() {
        let g = Granularity::default();
        let none = |_: u64, _: bool| UnitsHeld::default();
        let file = 43 * MIB;
        let random = obs(Pattern::Random);
        // A page of a 43 MiB file: a unit in a 20 MiB cache, the block in a 64 MiB one
        // (the file is at most 3/4 of it).
        assert_eq!(
            g.demand_unit(&random, 8192, 4096, MIB, file, 20 * MIB, none),
            Some(4 << 10)
        );
        assert_eq!(
            g.demand_unit(&random, 8192, 4096, MIB, file, 64 * MIB, none),
            None
        );
        assert_eq!(
            g.demand_unit(&random, 8192, 4096, MIB, 48 * MIB, 64 * MIB, none),
            None,
            "exactly 3/4"
        );
    }

    #[test]
    fn a_skewed_stream_keeps_whole_blocks_of_a_file_the_cache_can_hold() {
        let g = Granularity::default();
        let none = |_: u64, _: bool| UnitsHeld::default();
        let file = 43 * MIB;
        // 43 MiB in a 48 MiB cache: past 3/4, within the whole cache.
        assert_eq!(
            g.demand_unit(&obs(Pattern::Skewed), 8192, 4096, MIB, file, 48 * MIB, none),
            None,
            "re-read blocks of a file the cache can hold are fetched whole"
        );
        assert_eq!(
            g.demand_unit(&obs(Pattern::Random), 8192, 4096, MIB, file, 48 * MIB, none),
            Some(4 << 10),
            "a random stream keeps units past 3/4 of the cache"
        );
        assert_eq!(
            g.demand_unit(&obs(Pattern::Skewed), 8192, 4096, MIB, file, 40 * MIB, none),
            Some(4 << 10),
            "a file larger than the cache is read in units"
        );
        assert_eq!(
            g.demand_unit(&obs(Pattern::Skewed), 8192, 4096, MIB, file, file, none),
            None,
            "exactly the cache's size"
        );
    }

    #[test]
    fn small_files_and_dense_blocks_stay_whole() {
        let g = Granularity::default();
        let file = 42 * MIB;
        assert!(g.sparse(42, 0, g.beyond_cache(file, CACHE)));
        assert!(
            !g.sparse(42, 1, g.beyond_cache(file, CACHE)),
            "a unit of the block cached: fetch it whole"
        );
        assert!(
            !g.sparse(8, 0, g.beyond_cache(8 * MIB, CACHE)),
            "an 8-block file is read whole"
        );
        let blocks = Granularity::BLOCKS;
        assert!(!blocks.sparse(u64::MAX - 1, 0, blocks.beyond_cache(u64::MAX - 1, 0)));
    }

    #[test]
    fn a_file_far_larger_than_the_cache_stays_in_units() {
        let g = Granularity::default();
        let file = 42 * MIB;
        // The cache holds half the file: a block read again is worth holding whole.
        assert!(!g.sparse(42, 1, g.beyond_cache(file, file / 2)));
        // It holds a tenth: the block would be gone before the next read of it.
        assert!(g.sparse(42, 1, g.beyond_cache(file, file / 10)));
        assert!(g.sparse(42, 200, g.beyond_cache(file, file / 10)));
        let one = |_, _| UnitsHeld {
            unit: false,
            in_block: 1,
        };
        assert_eq!(
            g.demand_unit(&obs(Pattern::Skewed), 8192, 4096, MIB, file, file / 10, one),
            Some(g.unit(Pattern::Skewed, 8192, 4096, MIB))
        );
        assert_eq!(
            g.demand_unit(&obs(Pattern::Skewed), 8192, 4096, MIB, file, file / 2, one),
            None
        );
        // Uniformly random page lookups too: what counts is that the stream reads in
        // small pieces...
        assert_eq!(
            g.demand_unit(&obs(Pattern::Random), 8192, 4096, MIB, file, file / 10, one),
            Some(g.unit(Pattern::Random, 8192, 4096, MIB))
        );
        // ...not a small piece of a stream of large reads: the block serves the rest.
        let large_reads = Observation {
            small_reads: false,
            ..obs(Pattern::Random)
        };
        assert_eq!(
            g.demand_unit(&large_reads, 8192, 4096, MIB, file, file / 10, one),
            None
        );
        // Whole blocks always.
        let blocks = Granularity::BLOCKS;
        assert!(!blocks.sparse(42, 0, blocks.beyond_cache(file, 0)));
    }

    #[test]
    fn a_stream_sweeping_in_small_pieces_fetches_whole_blocks() {
        let g = Granularity::default();
        let file = 42 * MIB;
        let none = |_, _| UnitsHeld::default();
        let sweeping = Observation {
            sweeping: true,
            ..obs(Pattern::Skewed)
        };
        assert_eq!(
            g.demand_unit(
                &obs(Pattern::Skewed),
                8192,
                1024,
                MIB,
                file,
                file / 10,
                none
            ),
            Some(4 << 10)
        );
        assert_eq!(
            g.demand_unit(&sweeping, 8192, 1024, MIB, file, file / 10, none),
            None
        );
        // A cached unit holding the read still serves it.
        let held_4k = |u: u64, _| UnitsHeld {
            unit: u == 4 << 10,
            in_block: 1,
        };
        assert_eq!(
            g.demand_unit(&sweeping, 8192, 1024, MIB, file, file / 10, held_4k),
            Some(4 << 10)
        );
    }

    /// Small reads that come back to the blocks of the last few reads (a graph search
    /// expanding one region's nodes page by page) fetch whole blocks, even in a file many
    /// times the cache (where page lookups keep units).
    #[test]
    fn a_stream_of_small_reads_within_recent_blocks_fetches_whole_blocks() {
        let g = Granularity::default();
        let file = 42 * MIB;
        let none = |_, _| UnitsHeld::default();
        let local = Observation {
            block_local: true,
            ..obs(Pattern::Skewed)
        };
        assert_eq!(
            g.demand_unit(&local, 8192, 4096, MIB, file, file / 10, none),
            None
        );
        let lookups = obs(Pattern::Skewed);
        assert_eq!(
            g.demand_unit(&lookups, 8192, 4096, MIB, file, file / 10, none),
            Some(4 << 10)
        );
    }

    #[test]
    fn demand_unit_asks_what_is_held_only_for_a_candidate() {
        let g = Granularity::default();
        let big = 42 * MIB;
        let none = |_, _| UnitsHeld::default();
        assert_eq!(
            g.demand_unit(&obs(Pattern::Random), 8192, 4096, MIB, big, CACHE, none),
            Some(4 << 10)
        );
        // A unit of the block cached already: the block is dense, read it whole...
        let one = |_, _| UnitsHeld {
            unit: false,
            in_block: 1,
        };
        assert_eq!(
            g.demand_unit(&obs(Pattern::Random), 8192, 4096, MIB, big, CACHE, one),
            None
        );
        // ...unless the unit the read needs is that one.
        let it = |_, _| UnitsHeld {
            unit: true,
            in_block: 1,
        };
        assert_eq!(
            g.demand_unit(&obs(Pattern::Random), 8192, 4096, MIB, big, CACHE, it),
            Some(4 << 10)
        );
        let never = |_: u64, _: bool| -> UnitsHeld { panic!("small file: nothing to ask") };
        assert_eq!(
            g.demand_unit(&obs(Pattern::Random), 0, 4096, MIB, 8 * MIB, CACHE, never),
            None
        );
        // Not a unit read by its pattern: a cached unit holding the read serves it, the
        // smallest first; none cached, the block.
        let mut asked = Vec::new();
        let held_32k = |u: u64, candidate: bool| {
            asked.push((u, candidate));
            UnitsHeld {
                unit: u == 32 << 10,
                in_block: 1,
            }
        };
        assert_eq!(
            g.demand_unit(
                &obs(Pattern::Sequential),
                40 << 10,
                4096,
                MIB,
                big,
                CACHE,
                held_32k
            ),
            Some(32 << 10)
        );
        assert_eq!(
            asked,
            vec![
                (4 << 10, false),
                (8 << 10, false),
                (16 << 10, false),
                (32 << 10, false)
            ]
        );
        assert_eq!(
            g.demand_unit(&obs(Pattern::Unknown), 0, 4096, MIB, big, CACHE, none),
            None
        );
        let blocks = Granularity::BLOCKS;
        assert_eq!(
            blocks.demand_unit(&obs(Pattern::Random), 0, 4096, MIB, big, CACHE, never),
            None
        );
    }

    #[test]
    fn a_run_is_fetched_in_one_unit_and_its_next_pieces_are_served_by_it() {
        let g = Granularity::default();
        let big = 42 * MIB;
        // A record of 20 KiB from 8 KiB on, read in 4 KiB pieces: the first piece's
        // unit holds all of it.
        assert_eq!(
            g.unit_ahead(Pattern::Random, 8 << 10, 4096, 20 << 10, MIB),
            32 << 10
        );
        // Just before an aligned boundary: the unit that holds the run, however large.
        assert_eq!(
            g.unit_ahead(Pattern::Random, (64 << 10) - 4096, 4096, 8 << 10, MIB),
            128 << 10
        );
        // The run is cut at the block's end; a large read is no unit read at all.
        assert_eq!(
            g.unit_ahead(Pattern::Random, MIB - 4096, 4096, 64 << 10, MIB),
            4 << 10
        );
        assert_eq!(
            g.unit_ahead(Pattern::Random, 0, 128 << 10, 256 << 10, MIB),
            MIB
        );
        // demand_unit sizes the unit by the run for a stream of small reads...
        let run = Observation {
            run_ahead: 20 << 10,
            ..obs(Pattern::Random)
        };
        let none = |_, _| UnitsHeld::default();
        assert_eq!(
            g.demand_unit(&run, 8 << 10, 4096, MIB, big, CACHE, none),
            Some(32 << 10)
        );
        // ...not for one of large reads, whose small reads are the ends of larger ones.
        let large = Observation {
            small_reads: false,
            ..run
        };
        assert_eq!(
            g.demand_unit(&large, 8 << 10, 4096, MIB, big, CACHE, none),
            Some(4 << 10)
        );
        // A later piece (at 16 KiB, 8 KiB of the record left) would fetch an 8 KiB unit;
        // the 32 KiB unit the first piece fetched serves it, though with a unit of the
        // block cached the dense rule would have fetched the whole block.
        let next = Observation {
            run_ahead: 8 << 10,
            ..obs(Pattern::Random)
        };
        let held_32k = |u: u64, _| UnitsHeld {
            unit: u == 32 << 10,
            in_block: 1,
        };
        assert_eq!(
            g.demand_unit(&next, 16 << 10, 4096, MIB, big, CACHE, held_32k),
            Some(32 << 10)
        );
        let held_none = |_, _| UnitsHeld {
            unit: false,
            in_block: 1,
        };
        assert_eq!(
            g.demand_unit(&next, 16 << 10, 4096, MIB, big, CACHE, held_none),
            None
        );
    }

    #[test]
    fn unit_sizes_are_every_size_unit_can_give() {
        let g = Granularity::default();
        let sizes = g.unit_sizes(MIB);
        assert_eq!(sizes, (12..20).map(|s| 1u64 << s).collect::<Vec<_>>());
        for (off, len) in [
            (0, 1),
            (8192, 4096),
            (MIB - 5, 5),
            (100_000, 60_000),
            (0, 64 << 10),
        ] {
            let u = g.unit(Pattern::Random, off, len, MIB);
            assert!(u == MIB || sizes.contains(&u), "{off}+{len}: {u}");
        }
        assert!(Granularity::BLOCKS.unit_sizes(MIB).is_empty());
        assert!(g.unit_sizes(1_000_000).is_empty());
    }

    #[test]
    fn a_unit_holds_the_whole_read() {
        let g = Granularity::default();
        // 4 KiB across a 16 KiB boundary: the 32 KiB unit holding both halves.
        assert_eq!(
            g.unit(Pattern::Random, (16 << 10) - 2048, 4096, MIB),
            32 << 10
        );
        // Across the block's middle: only the block holds it.
        assert_eq!(g.unit(Pattern::Random, MIB / 2 - 10, 20, MIB), MIB);
        // A block size no power of two divides: whole blocks.
        assert_eq!(g.unit(Pattern::Random, 0, 4096, 1_000_000), 1_000_000);
        assert_eq!(
            g.unit_ahead(Pattern::Random, 0, 4096, 0, 0),
            0,
            "no block size"
        );
    }

    proptest::proptest! {
        /// Whatever the run expected, the unit is one `unit_sizes` gives (or the block),
        /// it holds the read, and it holds the run up to the block's end where a unit can.
        #[test]
        fn a_unit_for_a_run_holds_the_read(
            off in 0u64..MIB,
            len in 1u64..(80 << 10),
            ahead in 0u64..(4 * MIB),
            block_shift in 16u32..22,
        ) {
            let g = Granularity::default();
            let block = 1u64 << block_shift;
            let off = off % block;
            let u = g.unit_ahead(Pattern::Random, off, len, ahead, block);
            proptest::prop_assert!(u == block || g.unit_sizes(block).contains(&u), "{u}");
            if u < block {
                proptest::prop_assert_eq!(off / u, (off + len - 1) / u, "holds the read");
                let run_end = (off + ahead.max(len)).min(block);
                proptest::prop_assert_eq!(off / u, (run_end - 1) / u, "holds the run");
            }
        }
    }
}
