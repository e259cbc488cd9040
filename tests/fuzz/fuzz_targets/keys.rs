#![no_main]
//! See `strata_tests::fuzz::keys`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| strata_tests::fuzz::keys(data));
