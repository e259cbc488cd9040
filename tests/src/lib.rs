//! Support for Strata's end-to-end tests: real servers the tests start and stop
//! themselves (no skipping when one is missing: a missing server is a test failure that
//! names the install step).
//!
//! The end-to-end tests across crates live in `tests/tests/`.

pub mod fuzz;
pub mod s3;
