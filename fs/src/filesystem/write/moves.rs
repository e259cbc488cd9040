//! Folder renames in progress, and what waits for them.
//!
//! Object storage renames a folder object by object (copies, then deletes), so a file
//! created, opened to change or renamed into the folder meanwhile would land under the
//! old name (black-box findings: 99-212 files created during `mv` of a 3,000-object
//! folder stayed under the old name, which came back; appends during `mv x y` were
//! uploaded under `y/...` after the folder went back to `x`). While a folder rename
//! runs, those wait ([`FolderMoves::wait_while_covers`]) and then resolve their path
//! from the folder's inode, its new name. Two folder renames that involve each other's
//! folders (one inside or around the other) take turns ([`FolderMoves::start`];
//! black-box finding: `mv T Z` beside `mv T/b T/c` both returned 0 and duplicated the
//! files of `b`). A rename lets those that waited for the one before it in first, for
//! at most [`WAITERS_FIRST`] (black-box finding: `tar -x` in a folder renamed back and
//! forth without pause was starved, 680 of 1,500 files in 100 s).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::error::Result;

/// How long a folder rename lets creates and opens that waited for the one before it
/// in first (see the module doc): 200 ms.
const WAITERS_FIRST: std::time::Duration = std::time::Duration::from_millis(200);

/// The folder renames of a mount in progress (see the module doc).
#[derive(Default)]
pub(crate) struct FolderMoves {
    /// Each as (from, to).
    moving: Mutex<Vec<(Arc<str>, Arc<str>)>>,
    /// A folder's rename ended.
    moved: Notify,
    /// Creates and opens that waited out a folder rename and have not staged their
    /// file yet ([`WaitTurn`]).
    waiting: AtomicUsize,
    /// `waiting` fell to 0.
    waiters_gone: Notify,
}

/// Whether `path` is folder `dir` or inside it.
fn within(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// A create or open that waited out a folder rename, until it staged its file.
pub(crate) struct WaitTurn<'a>(&'a FolderMoves);

impl Drop for WaitTurn<'_> {
    fn drop(&mut self) {
        if self.0.waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.waiters_gone.notify_waiters();
        }
    }
}

/// A folder being renamed, until dropped.
pub(crate) struct Moving<'a> {
    moves: &'a FolderMoves,
    from: Arc<str>,
}

impl Drop for Moving<'_> {
    fn drop(&mut self) {
        let mut moving = self.moves.moving.lock();
        if let Some(i) = moving.iter().position(|(m, _)| Arc::ptr_eq(m, &self.from)) {
            moving.swap_remove(i);
        }
        drop(moving);
        self.moves.moved.notify_waiters();
    }
}

impl FolderMoves {
    /// Whether `path` is a folder being renamed (from or to), or inside one.
    pub(crate) fn covers(&self, path: &str) -> bool {
        self.moving
            .lock()
            .iter()
            .any(|(from, to)| within(path, from) || within(path, to))
    }

    /// Marks folder `from` as being renamed to `to` until the guard drops; None while
    /// another folder rename involves either, or a folder inside or around either.
    fn try_start(&self, from: &Arc<str>, to: &Arc<str>) -> Option<Moving<'_>> {
        let mut moving = self.moving.lock();
        let related = |a: &str, b: &str| within(a, b) || within(b, a);
        if moving
            .iter()
            .any(|(f, t)| related(from, f) || related(from, t) || related(to, f) || related(to, t))
        {
            return None;
        }
        moving.push((from.clone(), to.clone()));
        Some(Moving {
            moves: self,
            from: from.clone(),
        })
    }

    /// [`Self::try_start`], once no other folder rename involves them, and after the
    /// creates and opens that waited for the previous one (at most [`WAITERS_FIRST`]).
    pub(crate) async fn start(&self, from: &Arc<str>, to: &Arc<str>) -> Moving<'_> {
        let deadline = tokio::time::Instant::now() + WAITERS_FIRST;
        loop {
            let gone = self.waiters_gone.notified();
            tokio::pin!(gone);
            gone.as_mut().enable();
            if self.waiting.load(Ordering::Acquire) == 0
                || tokio::time::timeout_at(deadline, gone).await.is_err()
            {
                break;
            }
        }
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if let Some(guard) = self.try_start(from, to) {
                return guard;
            }
            moved.await;
        }
    }

    /// Waits while the path `path()` names is covered by a folder rename (asked again
    /// after each, as the rename moves it). Returns the caller's turn when it waited:
    /// held until it staged its file, the next folder rename lets it in first.
    pub(crate) async fn wait_while_covers(
        &self,
        path: impl Fn() -> Result<Arc<str>>,
    ) -> Result<Option<WaitTurn<'_>>> {
        let mut turn = None;
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if !self.covers(&path()?) {
                return Ok(turn);
            }
            if turn.is_none() {
                self.waiting.fetch_add(1, Ordering::AcqRel);
                turn = Some(WaitTurn(self));
            }
            moved.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_involving_each_others_folders_do_not_start_together() {
        let moves = FolderMoves::default();
        let a: Arc<str> = Arc::from("T/b");
        let first = moves.try_start(&a, &Arc::from("T/c")).expect("free");
        assert!(moves.covers("T/b/x") && moves.covers("T/c") && !moves.covers("T/bb"));
        assert!(
            moves.try_start(&Arc::from("T"), &Arc::from("Z")).is_none(),
            "around it"
        );
        assert!(
            moves
                .try_start(&Arc::from("T/c/d"), &Arc::from("Y"))
                .is_none(),
            "inside"
        );
        let other = moves
            .try_start(&Arc::from("U"), &Arc::from("V"))
            .expect("unrelated");
        drop(first);
        assert!(!moves.covers("T/b/x"));
        assert!(moves.try_start(&Arc::from("T"), &Arc::from("Z")).is_some());
        drop(other);
    }
}
