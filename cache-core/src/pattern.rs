//! Access patterns a stream can be classified as (see the classifier).
//!
//! [`Pattern`] is defined in `strata-types` so that the prefetch predictors can read it
//! without linking the core; this module keeps its path in the core.

pub use strata_types::Pattern;
