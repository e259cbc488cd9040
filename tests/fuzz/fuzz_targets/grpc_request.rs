#![no_main]
//! See `strata_tests::fuzz::grpc_request`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| strata_tests::fuzz::grpc_request(data));
