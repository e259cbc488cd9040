//! The process-wide connection pool of the listeners' gates (`accept.rs`), alone in its
//! test binary: the pool is per process, and this test lowers the descriptor limit.

use std::sync::Arc;
use std::time::Duration;

use strata_kvcache::accept::{process_connection_cap, Gate, H2_START_BYTES};

/// Black-box finding (round 11): with the descriptor limit at 2,048, 1,200 silent
/// connections on each of two KV listeners (1,024 slots each) ran the daemon out of
/// descriptors. All gates now draw from one pool of a quarter of the limit: past it a gate
/// makes room by closing its own oldest unproven connection, and nothing holds more.
#[test]
fn all_listeners_together_hold_at_most_a_quarter_of_the_descriptor_limit() {
    let lowered = libc::rlimit {
        rlim_cur: 800,
        rlim_max: 800,
    };
    // SAFETY: setrlimit only reads the struct passed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _in_rt = rt.enter();
    assert_eq!(process_connection_cap(), 200);
    let gate = |what| {
        Arc::new(Gate::new(
            what,
            1024,
            H2_START_BYTES,
            Duration::from_secs(60),
        ))
    };
    let (tcp, unix) = (gate("kv tcp"), gate("kv unix"));
    let mut held = Vec::new();
    for _ in 0..150 {
        held.push(tcp.admit(()).expect("room in the pool"));
    }
    for _ in 0..50 {
        held.push(unix.admit(()).expect("room in the pool"));
    }
    assert_eq!(tcp.live() + unix.live(), 200);
    // The pool is full: each gate makes room from its own silent connections.
    for _ in 0..300 {
        held.push(
            unix.admit(())
                .expect("its oldest silent one closed to make room"),
        );
        held.push(
            tcp.admit(())
                .expect("its oldest silent one closed to make room"),
        );
    }
    assert_eq!(tcp.live() + unix.live(), 200, "never more than the pool");
    assert_eq!(tcp.evicted() + unix.evicted(), 600);
    // Connections that leave give their slots back to the pool.
    held.clear();
    assert_eq!(tcp.live() + unix.live(), 0);
    let _one = tcp.admit(()).expect("room again");
}
