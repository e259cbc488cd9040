//! Helpers shared by the group tests.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// Runs `f` on a thread and fails the test if it takes longer than `secs`; a panic
/// inside `f` fails it with its own message (printed by the thread) instead of
/// reading as a timeout.
pub fn bounded<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(RecvTimeoutError::Timeout) => panic!("the test took longer than {secs} s"),
        Err(RecvTimeoutError::Disconnected) => {
            panic!("the test's body panicked (its message is printed above)")
        }
    }
}
