use super::*;

#[test]
fn placeholder() {
    let p = PatternAwarePolicy::default();
    assert_eq!(p.name(), "strata");
}
