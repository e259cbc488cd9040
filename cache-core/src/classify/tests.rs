use super::*;

#[test]
fn placeholder_sequential() {
    let cfg = ClassifierConfig::default();
    let mut sc = Scratch::default();
    let mut s = StreamStats::new(Pattern::Unknown);
    for i in 0..64u64 {
        s.observe(i, i as u32, &cfg, &mut sc);
    }
    assert_eq!(s.pattern(), Pattern::Sequential);
}
