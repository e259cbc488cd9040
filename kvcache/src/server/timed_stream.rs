//! A Get's response stream that reports to the load model when it ends.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use super::KvService;
use futures::{Stream, StreamExt};
use strata_cache_core::TierKind;

/// A Get's response stream; tells the load model when the last chunk left.
pub(super) struct TimedStream<S> {
    inner: S,
    service: KvService,
    tier: Option<TierKind>,
    bytes: u64,
    start: Instant,
    done: bool,
}

impl<S> TimedStream<S> {
    pub(super) fn new(inner: S, service: KvService, tier: Option<TierKind>, bytes: u64) -> Self {
        if let Some(t) = tier {
            service.inner.stats.load.started(t, bytes);
        }
        TimedStream {
            inner,
            service,
            tier,
            bytes,
            start: Instant::now(),
            done: false,
        }
    }

    /// Times the Get from `start`, when its block was read before the stream was made
    /// (black-box finding: timed from the stream alone, a disk-tier Get left out the
    /// disk read, and the model rated the disk 200-470x faster than it is, faster than
    /// memory, so `EstimateLoad` answered 32 ms for reads that took a second).
    pub(super) fn timed_from(mut self, start: Instant) -> Self {
        self.start = start;
        self
    }

    fn finish(&mut self, completed: bool) {
        if self.done {
            return;
        }
        self.done = true;
        if let Some(t) = self.tier {
            // A cancelled Get only releases its queued bytes: no timing sample.
            let elapsed = completed.then(|| self.start.elapsed());
            self.service
                .inner
                .stats
                .load
                .finished(t, self.bytes, elapsed);
        }
    }
}

impl<S: Stream + Unpin> Stream for TimedStream<S> {
    type Item = S::Item;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let r = self.inner.poll_next_unpin(cx);
        if let Poll::Ready(None) = r {
            self.finish(true);
        }
        r
    }
}

impl<S> Drop for TimedStream<S> {
    fn drop(&mut self) {
        self.finish(false);
    }
}
