//! Readahead for open files: a small trait, so the policy can be swapped (for the
//! prefetch crate's predictors), and a window-doubling default.
//!
//! [`WindowDoubling`] is mountpoint-s3's policy, sized for a cache: a read that
//! continues where the previous one ended (or starts a file at offset 0) is sequential;
//! each sequential read doubles the window ahead of the reader, from `initial` up to
//! `max`; any other read resets it and prefetches nothing (readahead on random reads is
//! pure waste: JuiceFS #6363/#5134). Only the part of the window not asked for before
//! is returned, so a stream issues each block once.
//!
//! The kernel's own page-cache readahead may deliver a stream's reads slightly out of
//! order with several FUSE threads; a read that starts inside the range already
//! prefetched still counts as sequential.

use std::ops::Range;

/// Decides what to fetch ahead of one open file's reader. Pure logic: no I/O.
pub trait Readahead: Send {
    /// Observes a demand read of `offset..offset+len` of a file of `file_size` bytes and
    /// returns the byte range to prefetch now, if any.
    fn on_read(&mut self, offset: u64, len: u64, file_size: u64) -> Option<Range<u64>>;
}

/// Tunables of [`WindowDoubling`].
#[derive(Clone, Debug)]
pub struct WindowConfig {
    /// First window: 2 MiB (two default blocks), so even the second read of a file
    /// overlaps one block fetch with the reader.
    pub initial: u64,
    /// Largest window: 32 MiB. At 20 ms time-to-first-byte and 200 MB/s-1 GB/s per
    /// stream this keeps 4-30 blocks in flight, enough to fill the link, while one
    /// stream's readahead holds a bounded share of the memory tier.
    pub max: u64,
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig {
            initial: 2 << 20,
            max: 32 << 20,
        }
    }
}

/// See the module doc.
#[derive(Clone, Debug)]
pub struct WindowDoubling {
    cfg: WindowConfig,
    /// Where the previous read ended.
    next: u64,
    /// Current window (0 until a sequential read is seen).
    window: u64,
    /// End of what has been requested so far.
    requested_to: u64,
}

impl WindowDoubling {
    pub fn new(cfg: WindowConfig) -> Self {
        WindowDoubling {
            cfg,
            next: 0,
            window: 0,
            requested_to: 0,
        }
    }

    /// The current window in bytes (0: no readahead active).
    pub fn window(&self) -> u64 {
        self.window
    }
}

impl Default for WindowDoubling {
    fn default() -> Self {
        WindowDoubling::new(WindowConfig::default())
    }
}

impl Readahead for WindowDoubling {
    fn on_read(&mut self, offset: u64, len: u64, file_size: u64) -> Option<Range<u64>> {
        let end = offset.saturating_add(len).min(file_size);
        let sequential = offset == self.next
            || offset == 0
            || (self.window > 0 && offset > self.next && offset < self.requested_to);
        if !sequential {
            self.window = 0;
            self.requested_to = end;
            self.next = end;
            return None;
        }
        self.window = if self.window == 0 {
            self.cfg.initial
        } else {
            self.window.saturating_mul(2)
        }
        .min(self.cfg.max);
        self.next = self.next.max(end);
        let target = end.saturating_add(self.window).min(file_size);
        let from = self.requested_to.max(end);
        if target <= from {
            return None;
        }
        self.requested_to = target;
        Some(from..target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn sequential_reads_double_the_window_up_to_the_max() {
        let mut ra = WindowDoubling::default();
        let size = 1 << 30;
        let mut windows = Vec::new();
        let mut off = 0;
        for _ in 0..8 {
            let r = ra
                .on_read(off, MIB, size)
                .expect("sequential read prefetches");
            assert!(r.start >= off + MIB, "never re-requests what is being read");
            windows.push(ra.window());
            off += MIB;
        }
        assert_eq!(
            windows,
            vec![
                2 * MIB,
                4 * MIB,
                8 * MIB,
                16 * MIB,
                32 * MIB,
                32 * MIB,
                32 * MIB,
                32 * MIB
            ]
        );
    }

    #[test]
    fn each_byte_is_requested_once() {
        let mut ra = WindowDoubling::default();
        let size = 100 * MIB;
        let mut covered = 0u64;
        let mut last_end = MIB; // the first demand read covers 0..1 MiB
        for i in 0..100 {
            if let Some(r) = ra.on_read(i * MIB, MIB, size) {
                assert_eq!(r.start, last_end.max((i + 1) * MIB), "contiguous requests");
                assert!(r.end <= size);
                covered += r.end - r.start;
                last_end = r.end;
            }
        }
        assert_eq!(covered, size - MIB);
    }

    #[test]
    fn random_reads_prefetch_nothing_and_reset() {
        let mut ra = WindowDoubling::default();
        let size = 1 << 30;
        assert!(ra.on_read(0, MIB, size).is_some());
        assert!(ra.on_read(MIB, MIB, size).is_some());
        assert!(ra.on_read(500 * MIB, 4096, size).is_none());
        assert_eq!(ra.window(), 0);
        assert!(ra.on_read(7 * MIB + 3, 4096, size).is_none());
        // A new sequential run restarts from the initial window.
        assert!(ra.on_read(7 * MIB + 3 + 4096, 4096, size).is_some());
        assert_eq!(ra.window(), 2 * MIB);
    }

    #[test]
    fn window_is_clamped_to_the_file() {
        let mut ra = WindowDoubling::default();
        let r = ra.on_read(0, 4096, 10_000).expect("start of file");
        assert_eq!(r, 4096..10_000);
        assert!(
            ra.on_read(4096, 4096, 10_000).is_none(),
            "all requested already"
        );
    }
}
