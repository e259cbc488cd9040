//! The requests that name blocks by a namespace and a list of hashes (BatchGet,
//! BatchExists, MatchPrefix, Remove, Prefetch, EstimateLoad): built one way by the
//! client and opened one way by the server.

use bytes::Bytes;

use crate::pb;

/// A request that names blocks by a namespace and their hashes.
pub(crate) trait BlocksRequest: Sized {
    /// The request for `hashes` in `namespace`, its other fields at their defaults.
    fn named(namespace: &str, hashes: &[impl AsRef<[u8]>]) -> Self;
    fn namespace(&self) -> &str;
    fn hashes(&self) -> &[Bytes];
}

macro_rules! blocks_request {
    ($($t:ty),*) => {$(
        impl BlocksRequest for $t {
            #[allow(clippy::needless_update)]
            fn named(namespace: &str, hashes: &[impl AsRef<[u8]>]) -> Self {
                Self {
                    namespace: namespace.to_string(),
                    hashes: hashes
                        .iter()
                        .map(|h| Bytes::copy_from_slice(h.as_ref()))
                        .collect(),
                    ..Default::default()
                }
            }
            fn namespace(&self) -> &str {
                &self.namespace
            }
            fn hashes(&self) -> &[Bytes] {
                &self.hashes
            }
        }
    )*};
}

blocks_request!(
    pb::BatchGetRequest,
    pb::BatchExistsRequest,
    pb::MatchPrefixRequest,
    pb::RemoveRequest,
    pb::PrefetchRequest,
    pb::EstimateLoadRequest
);
