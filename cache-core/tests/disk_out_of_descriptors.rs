//! The disk tier out of descriptors (its own process: it uses up the descriptor limit).

use bytes::Bytes;
use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
use strata_cache_core::{Block, CacheKey, Tier, TierGet};

/// Black-box finding (round 16): with clients and shared-memory sessions holding their
/// shares of a low descriptor limit, 760 of 1,500 acknowledged KV blocks read back as
/// misses ("Too many open files" opening their files). An open that meets EMFILE has
/// the open-file cache give its descriptors back and is tried again.
#[tokio::test]
async fn a_read_out_of_descriptors_sheds_the_open_file_cache_and_hits() {
    // A low limit, as the finding's daemon had, so using it up is quick (this test is
    // alone in its process).
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit fill and read the struct given, nothing else.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_cur.min(512);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let tier = DiskTier::open(
        dir.path(),
        64 << 20,
        DiskOptions {
            fd_cache: 8,
            ..DiskOptions::default()
        },
    )
    .expect("open");
    let key = |i: u32| CacheKey::kv("ns", i.to_le_bytes().to_vec());
    for i in 0..20u32 {
        let block = Block::new(Bytes::from(vec![i as u8; 8192]));
        tier.put(&key(i), block).await.expect("put");
    }
    for i in 0..8u32 {
        assert!(matches!(tier.get(&key(i)).await, Ok(TierGet::Hit(_))));
    }
    // Every other descriptor taken (as clients and sessions would).
    let mut held = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                break;
            }
        }
        assert!(held.len() < 1024, "the limit was lowered");
    }
    let got = tier.get(&key(15)).await;
    drop(held);
    match got {
        Ok(TierGet::Hit(b)) => assert_eq!(b.data(), &vec![15u8; 8192][..]),
        other => panic!("a stored block must read back, got {other:?}"),
    }
}
