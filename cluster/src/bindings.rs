//! Namespace identity bindings shared by the group (docs/KV_KEYS.md, v2).
//!
//! A node binds a KV namespace to the model identity of its first put and refuses
//! other identities on it. Each node kept its own bindings, so a node that joined after
//! a namespace was bound, and became the only owner of some of its keys, bound the
//! namespace afresh to whichever model put there next: a client of another model
//! reusing keys then stored its blocks where the first model's clients read them.
//!
//! Here the group keeps one binding per namespace on etcd,
//! `/<prefix>/<group>/kv-bindings/<namespace>` holding the identity in hex: the first
//! put anywhere creates it (a transaction that only creates), and a node about to bind
//! a namespace it has no binding for asks it first ([`SharedBindings::bind`]). Nodes
//! still check their own binding first, so a bound namespace costs no etcd call; only a
//! node's first put of a namespace does.
//!
//! - **Lifetime.** Records live under a lease of [`RECORD_TTL`] (one day) that each
//!   node grants and replaces every [`LEASE_RENEW_AFTER`]; members write their
//!   bindings again (moving them to a fresh lease) more often than that
//!   ([`SharedBindings::publish`]), so a binding some member holds stays, and one no
//!   member holds any more (its blocks gone, its local binding reclaimed) leaves etcd
//!   within a day instead of piling up.
//! - **etcd away.** A failed call makes the next ones answer at once, unasked, for
//!   [`REST_AFTER_FAILURE`]: a put then waits for nothing and the node's own binding
//!   decides, as before this existed.

use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use parking_lot::Mutex;

use crate::membership::{bounded, connect, create_or_read, replace_if_same, Created};
use crate::{ClusterError, GroupConfig};

/// A model identity digest (the KV service's `IdentityDigest`).
pub type Identity = [u8; 32];

/// Lease of a binding record: one day. Long next to the members' rewrites (every few
/// hours), so a record some member holds never lapses between two; short enough that
/// bindings nobody holds do not accumulate on etcd.
pub const RECORD_TTL: Duration = Duration::from_secs(24 * 3600);

/// A node grants a fresh record lease after six hours: a record written under a lease
/// then has at least 18 hours left, more than the members' rewrite interval.
pub const LEASE_RENEW_AFTER: Duration = Duration::from_secs(6 * 3600);

/// After a failed etcd call, the next calls within 5 s are not tried: a put must not
/// wait for a dead etcd each time (its call timeout is seconds), and 5 s brings the
/// group's bindings back soon after etcd returns.
pub const REST_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// The group's bindings on etcd, as one node asks them.
pub struct SharedBindings {
    cfg: GroupConfig,
    client: Mutex<Option<Client>>,
    /// The lease this node writes records under, and when it was granted.
    lease: Mutex<Option<(i64, Instant)>>,
    /// Until when calls are not tried (see [`REST_AFTER_FAILURE`]).
    resting_until: Mutex<Option<Instant>>,
}

impl SharedBindings {
    pub fn new(cfg: GroupConfig) -> Result<SharedBindings, ClusterError> {
        cfg.check()?;
        Ok(SharedBindings {
            cfg,
            client: Mutex::new(None),
            lease: Mutex::new(None),
            resting_until: Mutex::new(None),
        })
    }

    /// `/<prefix>/<group>/kv-bindings/`: where every record lives.
    pub fn records_prefix(&self) -> String {
        format!(
            "/{}/{}/kv-bindings/",
            self.cfg.prefix.trim_matches('/'),
            self.cfg.group
        )
    }

    fn key(&self, namespace: &str) -> String {
        format!("{}{namespace}", self.records_prefix())
    }

    /// The identity the group has bound `namespace` to, binding it to `identity` when
    /// no member has: a node about to bind a namespace for the first time refuses the
    /// put unless this is `identity`.
    pub async fn bind(
        &self,
        namespace: &str,
        identity: &Identity,
    ) -> Result<Identity, ClusterError> {
        self.guarded(self.create_or_read(namespace, identity, false))
            .await
    }

    /// As [`Self::bind`], and a record that already holds `identity` is written again
    /// under this node's current lease, so it outlives its first writer's lease: what
    /// members do for every binding they hold, every few hours.
    pub async fn publish(
        &self,
        namespace: &str,
        identity: &Identity,
    ) -> Result<Identity, ClusterError> {
        self.guarded(self.create_or_read(namespace, identity, true))
            .await
    }

    /// The identity the group holds for `namespace`, if any (read only).
    pub async fn held(&self, namespace: &str) -> Result<Option<Identity>, ClusterError> {
        self.guarded(async {
            let mut client = self.client().await?;
            let key = self.key(namespace);
            let r = bounded(&self.cfg, client.get(key.clone(), None)).await?;
            match r.kvs().first() {
                None => Ok(None),
                Some(kv) => decode(kv.value()).map(Some).ok_or_else(|| bad_record(&key)),
            }
        })
        .await
    }

    /// Removes the record of `namespace` if it still holds `identity`: a put this node
    /// bound the namespace for was refused by an owner bound to another model (its
    /// binding predates the record), so the record was wrong.
    pub async fn withdraw(&self, namespace: &str, identity: &Identity) -> Result<(), ClusterError> {
        self.guarded(async {
            let mut client = self.client().await?;
            let key = self.key(namespace);
            let txn = Txn::new()
                .when([Compare::value(
                    key.clone(),
                    CompareOp::Equal,
                    encode(identity),
                )])
                .and_then([TxnOp::delete(key, None)]);
            bounded(&self.cfg, client.txn(txn)).await.map(|_| ())
        })
        .await
    }

    /// Runs `call` unless etcd failed less than [`REST_AFTER_FAILURE`] ago; a failure
    /// starts a rest and drops the client and lease (etcd may have been replaced).
    async fn guarded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, ClusterError>>,
    ) -> Result<T, ClusterError> {
        if let Some(until) = *self.resting_until.lock() {
            if Instant::now() < until {
                return Err(ClusterError::Resting(REST_AFTER_FAILURE));
            }
        }
        let r = call.await;
        if r.is_err() {
            *self.resting_until.lock() = Some(Instant::now() + REST_AFTER_FAILURE);
            *self.client.lock() = None;
            *self.lease.lock() = None;
        }
        r
    }

    async fn client(&self) -> Result<Client, ClusterError> {
        let cached = self.client.lock().clone();
        if let Some(c) = cached {
            return Ok(c);
        }
        let c = connect(&self.cfg).await?;
        *self.client.lock() = Some(c.clone());
        Ok(c)
    }

    async fn lease(&self, client: &mut Client) -> Result<i64, ClusterError> {
        let current = *self.lease.lock();
        if let Some((id, granted)) = current {
            if granted.elapsed() < LEASE_RENEW_AFTER {
                return Ok(id);
            }
        }
        let id = bounded(
            &self.cfg,
            client.lease_grant(RECORD_TTL.as_secs() as i64, None),
        )
        .await?
        .id();
        *self.lease.lock() = Some((id, Instant::now()));
        Ok(id)
    }

    async fn create_or_read(
        &self,
        namespace: &str,
        identity: &Identity,
        refresh: bool,
    ) -> Result<Identity, ClusterError> {
        let mut client = self.client().await?;
        let key = self.key(namespace);
        let value = encode(identity);
        // etcd may have lost the lease this node's records lived on (restored empty, or
        // the lease expired while the daemon was stopped): a new one at once, not a
        // failed call and a rest (black-box finding: after etcd lost its data the first
        // publish after registering again failed so).
        let mut retried = false;
        let (created, lease) = loop {
            let lease = self.lease(&mut client).await?;
            let created = create_or_read(
                &self.cfg,
                &mut client,
                &key,
                &value,
                lease,
                "binding record",
            )
            .await;
            if retried || !created.as_ref().is_err_and(lease_not_found) {
                break (created, lease);
            }
            *self.lease.lock() = None;
            retried = true;
        };
        let (held, held_lease) = match created? {
            Created::Created => return Ok(*identity),
            Created::Held { value, lease } => (value, lease),
        };
        let bound = decode(&held).ok_or_else(|| bad_record(&key))?;
        if refresh && bound == *identity && held_lease != lease {
            replace_if_same(&self.cfg, &mut client, &key, held, &value, lease).await?;
        }
        Ok(bound)
    }
}

/// Whether etcd refused a write for its lease: "requested lease not found".
fn lease_not_found(e: &ClusterError) -> bool {
    matches!(e, ClusterError::Etcd(_)) && e.to_string().contains("lease not found")
}

fn bad_record(key: &str) -> ClusterError {
    ClusterError::Config(format!(
        "the binding record {key} does not hold a 64-digit hex identity"
    ))
}

fn encode(identity: &Identity) -> Vec<u8> {
    identity
        .iter()
        .flat_map(|b| {
            let hex = b"0123456789abcdef";
            [hex[(b >> 4) as usize], hex[(b & 15) as usize]]
        })
        .collect()
}

fn decode(text: &[u8]) -> Option<Identity> {
    if text.len() != 64 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, pair) in text.chunks(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_round_trip_through_hex() {
        let mut id = [0u8; 32];
        for (i, b) in id.iter_mut().enumerate() {
            *b = (i * 37 + 5) as u8;
        }
        let text = encode(&id);
        assert_eq!(text.len(), 64);
        assert_eq!(decode(&text), Some(id));
        assert_eq!(decode(b"zz"), None);
        assert_eq!(decode(&[b'g'; 64]), None);
    }
}
