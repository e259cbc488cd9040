//! A ranged read's body assembled into pieces (page-aligned and prefaulted when
//! large, so the disk tier writes them with `O_DIRECT`), and why a body ended early.

use bytes::Bytes;

use crate::io::{AlignedBuf, AlignedFill};

use super::retry::transient;

/// What a ranged read hands each whole piece to (its index, its bytes).
pub(super) type PieceSink<'a> = dyn Fn(usize, &Bytes) + Sync + 'a;

/// Why the body of one response of a ranged read ended early.
pub(super) struct BodyError {
    pub(super) error: object_store::Error,
    /// Worth asking again (a reset, a short body, a deadline): [`transient`].
    pub(super) transient: bool,
    /// The store answered with an error (not a deadline or a short body of ours):
    /// asked again at most as many times as any request ([`RetryPolicy::attempts`]).
    pub(super) answered: bool,
}

impl BodyError {
    pub(super) fn of(error: object_store::Error) -> Self {
        BodyError {
            transient: transient(&error),
            error,
            answered: true,
        }
    }

    pub(super) fn transient(message: String) -> Self {
        BodyError {
            error: object_store::Error::Generic {
                store: "strata",
                source: message.into(),
            },
            transient: true,
            answered: false,
        }
    }
}

/// Pieces at least this large are page-aligned and prefaulted (see [`Piece`] and
/// [`prefault`]); smaller ones come from memory the allocator already has mapped.
pub(super) const PREFAULT_MIN: usize = 64 << 10;

/// A piece of a ranged GET's body being assembled. One of `PREFAULT_MIN` or more is a
/// page-aligned buffer ([`AlignedBuf::filler`]: no zeroing, one copy per byte as
/// before), so that its `Bytes` start on a 4096 boundary and the disk tier writes the
/// block from them with `O_DIRECT` instead of copying it behind its header first
/// (`DiskTier::file_parts`); the price is up to one page of address space per piece.
/// Smaller pieces are plain buffers (a page of slack would be a large share of them).
pub(super) enum Piece {
    Aligned(AlignedFill),
    Plain(bytes::BytesMut),
}

impl Piece {
    pub(super) fn new(len: usize) -> Piece {
        if len >= PREFAULT_MIN {
            let mut fill = AlignedBuf::filler(len);
            prefault(fill.spare_mut());
            Piece::Aligned(fill)
        } else {
            Piece::Plain(bytes::BytesMut::with_capacity(len))
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Piece::Aligned(f) => f.filled(),
            Piece::Plain(b) => b.len(),
        }
    }

    /// Appends `bytes` (the caller never appends past the piece's length).
    pub(super) fn extend(&mut self, bytes: &[u8]) {
        match self {
            Piece::Aligned(f) => {
                let took = f.extend(bytes);
                debug_assert_eq!(took, bytes.len(), "appended past the piece");
            }
            Piece::Plain(b) => b.extend_from_slice(bytes),
        }
    }

    pub(super) fn freeze(self) -> Bytes {
        match self {
            Piece::Aligned(f) => f.finish().into_bytes(),
            Piece::Plain(b) => b.freeze(),
        }
    }
}

/// Maps the pages of a fresh piece's buffer in one `madvise(MADV_POPULATE_WRITE)`
/// instead of one page fault per 4 KiB as the body is copied in. A cold read keeps its
/// pieces in the memory tier, so their pages are new ones: on a cold 1 GiB read through
/// the mount those faults were ~20% of the daemon's CPU, and a C loop on the same VM
/// filled a fresh MiB in ~300 us faulting page by page against ~150 us populated first.
/// Only an optimisation: a kernel before 5.14 answers `EINVAL` and the pages fault as
/// before; pages already mapped are left as they are.
pub(super) fn prefault(spare: &mut [std::mem::MaybeUninit<u8>]) {
    const PAGE: usize = 4096;
    if spare.len() < PREFAULT_MIN {
        return;
    }
    let start = (spare.as_mut_ptr() as usize).next_multiple_of(PAGE);
    let end = (spare.as_mut_ptr() as usize + spare.len()) / PAGE * PAGE;
    if end <= start {
        return;
    }
    // SAFETY: `start..end` lies inside `spare`, memory this buffer owns and nothing
    // else references; MADV_POPULATE_WRITE only maps the pages (as a write fault would)
    // and never changes the contents of a mapped page, and its result is ignored.
    unsafe {
        libc::madvise(
            start as *mut libc::c_void,
            end - start,
            libc::MADV_POPULATE_WRITE,
        );
    }
}
