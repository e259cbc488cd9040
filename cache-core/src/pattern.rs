//! Access patterns a stream can be classified as (see the classifier).

/// The pattern of one access stream.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Not enough evidence yet.
    #[default]
    Unknown,
    Sequential,
    Random,
    Skewed,
}
