#![no_main]
//! See `strata_tests::fuzz::disk_header`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| strata_tests::fuzz::disk_header(data));
