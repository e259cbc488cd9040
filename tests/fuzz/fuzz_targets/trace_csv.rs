#![no_main]
//! See `strata_tests::fuzz::trace_csv`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| strata_tests::fuzz::trace_csv(data));
