//! Namespaces bound to a model identity (docs/KV_KEYS.md, v2).
//!
//! A client that sends its model identity digest (metadata [`IDENTITY_METADATA`])
//! binds the namespace it puts into to that identity; from then on a call with another
//! identity on that namespace is refused (`FAILED_PRECONDITION`), so a client configured
//! with another revision, RoPE scaling or LoRA adapter can neither read nor add to the
//! blocks of the first. v2 keys already differ per identity; the binding also catches
//! clients that derive v1 keys or reuse keys by mistake. Calls without an identity
//! (v1 clients) are not checked.
//!
//! Only a put binds: a read names no content, and letting it bind would let a
//! misconfigured reader lock the real writer out. Bindings live in the tenant's key
//! space (the scoped namespace), so a tenant can only constrain itself. They are
//! persisted (`kv-identities.json` in the cache dir, written atomically) so a restart
//! over a warm disk tier keeps them; an unreadable file is moved aside with an error in
//! the log (the v2 keys still separate models) rather than stopping the service.
//!
//! The file is written at the first start too (empty), so that a file gone or
//! unreadable at a later start means bindings lost, not never made. Then the KV blocks
//! the cache recovered are dropped before the service serves
//! ([`drop_blocks_if_bindings_lost`]): no binding guards them any more, and another
//! model's client reusing their keys would load them (black-box finding: a truncated,
//! garbled or deleted file let model B read model A's blocks, 3 of 3).
//!
//! A start whose engine keeps nothing across restarts (no disk tier) cannot drop the
//! blocks a disk tier holds, and what it does to KV blocks (a Remove, a new value, a
//! binding, the tenancy mode) does not reach them: it marks the file
//! `disk_blocks_unguarded`, and the mark stays until a start with the disk tier drops
//! them (black-box findings: the file deleted, one `--disk 0` start let model B bind
//! the namespace, and the next start with the disk tier trusted that file and served
//! model A's 20 blocks to B; round 25: keys removed during a `--disk 0` run came back
//! with the disk tier, and re-put keys served their old bytes, and a `--disk 0` start
//! that switched the tenancy mode rewrote the file, so tenant `a` then read an
//! anonymous client's `a:x` blocks).
//!
//! A put that binds a namespace is acknowledged only once the binding is on disk
//! ([`IdentityBindings::durable`]): the put's block survives a crash, so its binding
//! must too (crash finding: a binding made less than a second before a kill -9 was
//! lost while its block was recovered, and another model's client then read it).
//! Writes are group commits ([`next_write_in`]): the first binding after a quiet spell
//! is written at once, and the bindings that arrive meanwhile wait for the next write
//! together, which comes after nine times the last write's cost (10 ms at the least, a
//! second at the most): the file's rewrites take at most a tenth of the disk's time, so
//! a client inventing namespaces cannot turn each new binding into a rewrite and an
//! fsync of the whole file, while a put into a new namespace waits milliseconds, not
//! the second a fixed interval cost (black-box finding: each put binding a new
//! namespace took 1.0 s, 100-200x a put into a bound one).
//!
//! [`IDENTITY_METADATA`]: crate::keys::IDENTITY_METADATA

use std::collections::{HashMap, HashSet};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_cache_core::state_file::write_atomically;
use strata_cache_core::{CacheEngine, CacheKey, TierKind};

use crate::error::{KvError, Result};

/// Most namespaces bound at once. 16,384: far beyond models times tenants on one node,
/// and it bounds what a client inventing namespaces can make the server remember (the
/// file stays under ~2 MiB).
pub const MAX_BINDINGS: usize = 1 << 14;

/// Most time between two writes of the bindings file: one second, however slow the
/// last write was, so a put that binds a namespace waits at most about that long for
/// its binding to be durable.
pub const PERSIST_INTERVAL: Duration = Duration::from_secs(1);

/// Least time between two writes: 10 ms, so a burst of new namespaces arriving at once
/// shares a write even when the file is small and its writes quick.
pub const PERSIST_GAP: Duration = Duration::from_millis(10);

/// How long after a write that took `cost` and ended `since` ago the next may start:
/// the gap is nine times its cost (the writes then take at most a tenth of the time),
/// within [`PERSIST_GAP`]..[`PERSIST_INTERVAL`].
pub fn next_write_in(cost: Duration, since: Duration) -> Duration {
    (cost * 9)
        .clamp(PERSIST_GAP, PERSIST_INTERVAL)
        .saturating_sub(since)
}

/// The most recent bindings [`IdentityBindings::recent`] lists: 256, one etcd call each
/// per check.
pub const MAX_RECENT_CHECKED: usize = 256;

/// A 32-byte model identity digest.
pub type IdentityDigest = [u8; 32];

/// One namespace's binding, as a service holds it.
#[derive(Clone, Copy, Debug)]
struct Bound {
    id: IdentityDigest,
    /// The generation that bound it (0: loaded from the file).
    generation: u64,
    /// When it was made, unix ms (kept in the file's `since`); 0: made by a release
    /// that kept no time, the oldest. The group's order of bindings
    /// ([`IdentityBindings::since_ms`]).
    since_ms: u64,
}

impl Bound {
    fn loaded(id: IdentityDigest) -> Bound {
        Bound {
            id,
            generation: 0,
            since_ms: 0,
        }
    }
}

/// Unix time in ms (a binding's making, compared across the group's nodes).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The bindings of one service.
#[derive(Debug)]
pub struct IdentityBindings {
    /// Each namespace's binding.
    map: Mutex<HashMap<Arc<str>, Bound>>,
    /// Where they persist; None: memory only.
    file: Option<PathBuf>,
    /// The generation of the newest binding (assigned under `map`'s lock).
    newest: AtomicU64,
    /// The newest generation the file holds.
    persisted: tokio::sync::watch::Sender<u64>,
    /// The newest generation a failed write was to hold, and its error.
    failed: Mutex<Option<(u64, String)>>,
    /// Set while one caller writes the file for everyone.
    writing: AtomicBool,
    /// When the file's last write ended, and what it cost.
    last_write: Mutex<Option<(Instant, Duration)>>,
    writes: AtomicU64,
    /// Tenants sharing [`MAX_BINDINGS`] (0: single-tenant, one pool): each may bind at
    /// most its equal share ([`Self::share_among_tenants`]).
    tenants: usize,
    /// When bindings were last reclaimed, and the newest generation then: bindings made
    /// since may belong to puts still in flight and are kept at the next reclaim.
    reclaimed: Mutex<(Option<Instant>, u64)>,
    /// The file's marks (`disk_blocks_unguarded`, `tenants`), kept in every write.
    marks: Marks,
    /// Namespaces bound here while the group's binding could not be asked (etcd away):
    /// checked against it once it answers ([`Self::adopt`]), as the group's decides.
    unconfirmed: Mutex<HashSet<Arc<str>>>,
    /// Wakes the check of [`Self::unconfirmed`] bindings (a call was refused by one).
    pub recheck: Arc<tokio::sync::Notify>,
}

/// Least time between two reclaims of bindings whose namespaces hold no block (see
/// [`IdentityBindings::check`]): 5 s, so a client at the bound costs one scan of the
/// cache's KV keys per 5 s, and a binding made just before a reclaim survives it.
pub const RECLAIM_INTERVAL: Duration = Duration::from_secs(5);

impl Drop for IdentityBindings {
    fn drop(&mut self) {
        if self.newest.load(Ordering::Acquire) > *self.persisted.borrow() {
            if let Some(file) = &self.file {
                self.write(file);
            }
        }
    }
}

/// Clears [`IdentityBindings::writing`] when the writer is done or cancelled.
struct Writer<'a>(&'a AtomicBool);

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl IdentityBindings {
    /// Bindings persisted in `file` (loaded now if it exists), or memory only.
    pub fn open(file: Option<PathBuf>) -> Self {
        let (map, marks) = match &file {
            Some(f) => {
                let loaded = load(f);
                if !f.exists() {
                    // From now on a missing file means lost bindings (module doc).
                    if let Err(e) =
                        write_atomically(f, encode(&HashMap::new(), loaded.1).as_bytes())
                    {
                        tracing::error!(file = %f.display(), error = %e, "could not write the KV namespace identities file");
                    }
                }
                loaded
            }
            None => (HashMap::new(), Marks::default()),
        };
        IdentityBindings {
            map: Mutex::new(map),
            file,
            newest: AtomicU64::new(0),
            persisted: tokio::sync::watch::Sender::new(0),
            failed: Mutex::new(None),
            writing: AtomicBool::new(false),
            last_write: Mutex::new(None),
            writes: AtomicU64::new(0),
            tenants: 0,
            reclaimed: Mutex::new((None, 0)),
            marks,
            unconfirmed: Mutex::new(HashSet::new()),
            recheck: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Splits [`MAX_BINDINGS`] equally among `tenants` (namespaces scoped
    /// `tenant:namespace`): bindings outlive their blocks and are not charged to a
    /// tenant's byte quota, so one tenant binding namespace after namespace took all
    /// 16,384 and every other tenant's first put to a new namespace was refused, across
    /// restarts (black-box finding). 0: one pool, as without tenants.
    pub fn share_among_tenants(mut self, tenants: usize) -> Self {
        self.tenants = tenants;
        self
    }

    /// Whether the owner of `ns` may bind one more namespace: below [`MAX_BINDINGS`] in
    /// all and, with tenants, below its share.
    fn room_for(
        &self,
        map: &HashMap<Arc<str>, Bound>,
        ns: &str,
    ) -> std::result::Result<(), String> {
        if map.len() >= MAX_BINDINGS {
            return Err(format!(
                "{MAX_BINDINGS} namespaces are bound to model identities already"
            ));
        }
        if self.tenants == 0 {
            return Ok(());
        }
        let share = MAX_BINDINGS / self.tenants;
        let Some(tenant) = crate::tenants::tenant_of(ns) else {
            return Ok(());
        };
        let owned = map
            .keys()
            .filter(|k| crate::tenants::tenant_of(k) == Some(tenant))
            .count();
        if owned >= share {
            return Err(format!(
                "tenant {tenant} has bound its share of {share} namespaces to model identities"
            ));
        }
        Ok(())
    }

    /// Times the file was written (tests).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Writes every binding to `file` now (blocking); a failure is logged and noted
    /// for [`Self::durable`]'s waiters, whose puts then fail.
    fn write(&self, file: &Path) {
        let (text, upto) = {
            let map = self.map.lock();
            (
                encode(&map, self.marks),
                self.newest.load(Ordering::Acquire),
            )
        };
        self.writes.fetch_add(1, Ordering::Relaxed);
        match write_atomically(file, text.as_bytes()) {
            Ok(()) => self.persisted.send_modify(|p| *p = (*p).max(upto)),
            Err(e) => {
                tracing::error!(file = %file.display(), error = %e,
                    "could not persist KV namespace identities: the puts that bound a namespace meanwhile fail");
                *self.failed.lock() = Some((upto, e.to_string()));
                // Wakes the waiters (the value is unchanged).
                self.persisted.send_modify(|_| {});
            }
        }
    }

    /// Returns once the binding of generation `generation` (from [`Self::check`]) is
    /// in the file: at once when it is, else after the next group write (see the module
    /// doc). Err when the write that was to hold it failed: the put that made it must
    /// fail and undo it ([`Self::unbind`]), since its block would outlive the binding
    /// across a restart (black-box finding: one failed write of the file, the put was
    /// acknowledged, and after a restart another model's client read its block).
    pub async fn durable(self: &Arc<Self>, generation: u64) -> std::result::Result<(), String> {
        if self.file.is_none() {
            return Ok(());
        }
        let mut persisted = self.persisted.subscribe();
        loop {
            if *persisted.borrow_and_update() >= generation {
                return Ok(());
            }
            if let Some((upto, e)) = self.failed.lock().as_ref() {
                if *upto >= generation {
                    return Err(e.clone());
                }
            }
            if self
                .writing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                let _writer = Writer(&self.writing);
                let due = self
                    .last_write
                    .lock()
                    .map_or(Duration::ZERO, |(ended, cost)| {
                        next_write_in(cost, ended.elapsed())
                    });
                if !due.is_zero() {
                    tokio::time::sleep(due).await;
                }
                let started = Instant::now();
                let me = self.clone();
                let done = tokio::task::spawn_blocking(move || {
                    if let Some(file) = &me.file {
                        me.write(file);
                    }
                })
                .await;
                *self.last_write.lock() = Some((Instant::now(), started.elapsed()));
                if let Err(e) = done {
                    tracing::error!(error = %e, "persisting KV namespace identities failed");
                    *self.failed.lock() = Some((generation, e.to_string()));
                }
                continue;
            }
            // Another caller writes for everyone; its result wakes us (a writer that was
            // cancelled is replaced after the bounded wait).
            let _ = tokio::time::timeout(PERSIST_INTERVAL, persisted.changed()).await;
        }
    }

    /// Every binding (namespace, identity), for the group's copy.
    pub fn all(&self) -> Vec<(Arc<str>, IdentityDigest)> {
        self.map
            .lock()
            .iter()
            .map(|(ns, b)| (ns.clone(), b.id))
            .collect()
    }

    /// The identity `ns` is bound to, if any.
    pub fn bound(&self, ns: &str) -> Option<IdentityDigest> {
        self.map.lock().get(ns).map(|b| b.id)
    }

    /// When the binding of `ns` was made (unix ms; 0: by a release that kept no time,
    /// or taken from a group binding of then), if it is bound: where two nodes bound it
    /// to different identities, the group keeps the older (`strata_cluster::bindings`).
    pub fn since_ms(&self, ns: &str) -> Option<u64> {
        self.map.lock().get(ns).map(|b| b.since_ms)
    }

    /// Whether any binding was made (or taken from the group) at most `window` ago:
    /// [`Self::recent`] without listing them.
    pub fn any_recent(&self, window: Duration) -> bool {
        let after = unix_ms().saturating_sub(window.as_millis() as u64);
        self.map.lock().values().any(|b| b.since_ms > after)
    }

    /// The bindings made (or taken from the group) at most `window` ago: checked against
    /// the group's often for a while, since a member holding an older binding of the
    /// namespace may replace the group's record (etcd restored empty, this node's put
    /// first to bind it again).
    /// At most [`MAX_RECENT_CHECKED`], the earliest made first: a client binding
    /// namespace after namespace right after a start must not turn each 5 s check into
    /// thousands of etcd calls, and the bindings a fresh member made first are those a
    /// loss of etcd's records can have misplaced.
    pub fn recent(&self, window: Duration) -> Vec<(Arc<str>, IdentityDigest)> {
        let after = unix_ms().saturating_sub(window.as_millis() as u64);
        let mut recent: Vec<(u64, Arc<str>, IdentityDigest)> = self
            .map
            .lock()
            .iter()
            .filter(|(_, b)| b.since_ms > after)
            .map(|(ns, b)| (b.since_ms, ns.clone(), b.id))
            .collect();
        recent.sort_unstable_by_key(|(since, _, _)| *since);
        recent
            .into_iter()
            .take(MAX_RECENT_CHECKED)
            .map(|(_, ns, id)| (ns, id))
            .collect()
    }

    /// Notes that `ns` was bound here without the group's answer (it could not be
    /// asked): [`Self::unconfirmed`] lists it until the group answers. Called once the
    /// binding is made (a mark without a binding is forgotten at the next listing).
    pub fn mark_unconfirmed(&self, ns: &Arc<str>) {
        if self.unconfirmed.lock().insert(ns.clone()) {
            // The checker may be asleep until its next full round (hours).
            self.recheck.notify_one();
        }
    }

    /// The bindings made while the group could not be asked, with their identity
    /// (namespaces marked but not bound, or no longer, are forgotten).
    pub fn unconfirmed(&self) -> Vec<(Arc<str>, IdentityDigest)> {
        let map = self.map.lock();
        let mut marked = self.unconfirmed.lock();
        marked.retain(|ns| map.contains_key(ns));
        marked
            .iter()
            .filter_map(|ns| map.get(ns).map(|b| (ns.clone(), b.id)))
            .collect()
    }

    /// The group answered for `ns`: its binding is no longer unconfirmed.
    pub fn confirmed(&self, ns: &str) {
        self.unconfirmed.lock().remove(ns);
    }

    /// Replaces this node's binding of `ns`, `here`, by the group's, `group` (made at
    /// `group_since_ms`): the group's oldest binding decides (docs/KV_KEYS.md). The
    /// generation to see [`Self::durable`]; None when `ns` is no longer bound to `here`
    /// (changed meanwhile).
    pub fn adopt(
        &self,
        ns: &Arc<str>,
        here: &IdentityDigest,
        group: &IdentityDigest,
        group_since_ms: u64,
    ) -> Option<u64> {
        let mut map = self.map.lock();
        if map.get(ns).map(|b| &b.id) != Some(here) {
            return None;
        }
        self.unconfirmed.lock().remove(ns);
        let generation = self.newest.fetch_add(1, Ordering::AcqRel) + 1;
        map.insert(
            ns.clone(),
            Bound {
                id: *group,
                generation,
                since_ms: group_since_ms,
            },
        );
        Some(generation)
    }

    /// Drops the binding of `ns` if it is still the one of `generation` (made by a put
    /// the group then refused); the generation to see [`Self::durable`] for the file
    /// to say so, None if it was not dropped.
    pub fn unbind(&self, ns: &str, generation: u64) -> Option<u64> {
        let mut map = self.map.lock();
        if map.get(ns).map(|b| b.generation) != Some(generation) {
            return None;
        }
        map.remove(ns);
        Some(self.newest.fetch_add(1, Ordering::AcqRel) + 1)
    }

    /// Checks a call on `ns` carrying `identity`; with `bind` (a put) an unbound
    /// namespace is bound to it. For a put with an identity, the generation of the
    /// namespace's binding, which the put must see [`Self::durable`] before it is
    /// acknowledged. At the bound a new binding is refused ([`Self::check_reclaiming`]
    /// makes room).
    pub fn check(
        &self,
        ns: &Arc<str>,
        identity: Option<&IdentityDigest>,
        bind: bool,
    ) -> Result<Option<u64>> {
        self.check_with(ns, identity, bind, None)
    }

    /// [`Self::check`]; when the bound refuses a new binding, bindings of namespaces
    /// that hold no block (`in_use` names those that do) are dropped first, at most once
    /// per [`RECLAIM_INTERVAL`] and never one made since the last reclaim (its put may
    /// be in flight). Such a binding guards nothing: another identity binding the
    /// namespace afresh finds no block of the first. Black-box finding: bindings only
    /// ever grew, so a client cycling namespaces (per-request salts, per-session names)
    /// filled the bound, and every new namespace's put was refused for good, the blocks
    /// long removed or evicted.
    pub fn check_reclaiming(
        &self,
        ns: &Arc<str>,
        identity: Option<&IdentityDigest>,
        bind: bool,
        mut in_use: impl FnMut() -> HashSet<Arc<str>>,
    ) -> Result<Option<u64>> {
        self.check_with(ns, identity, bind, Some(&mut in_use))
    }

    /// [`Self::check`], reclaiming with `in_use` when given.
    fn check_with(
        &self,
        ns: &Arc<str>,
        identity: Option<&IdentityDigest>,
        bind: bool,
        in_use: Option<&mut dyn FnMut() -> HashSet<Arc<str>>>,
    ) -> Result<Option<u64>> {
        let Some(id) = identity else {
            return Ok(None);
        };
        let mut map = self.map.lock();
        match map.get(ns) {
            Some(b) if b.id != *id => Err(KvError::IdentityMismatch {
                namespace: ns.to_string(),
                bound: hex::encode(&b.id[..6]),
                got: hex::encode(&id[..6]),
            }),
            Some(b) => Ok(bind.then_some(b.generation)),
            None if !bind => Ok(None),
            None => {
                if let (Err(_), Some(in_use)) = (self.room_for(&map, ns), in_use) {
                    self.reclaim(&mut map, in_use);
                }
                self.room_for(&map, ns).map_err(KvError::Busy)?;
                let generation = self.newest.fetch_add(1, Ordering::AcqRel) + 1;
                map.insert(
                    ns.clone(),
                    Bound {
                        id: *id,
                        generation,
                        since_ms: unix_ms(),
                    },
                );
                Ok(Some(generation))
            }
        }
    }
}

impl IdentityBindings {
    /// Drops the bindings of namespaces not in `in_use`, but for those made since the
    /// previous reclaim; at most once per [`RECLAIM_INTERVAL`].
    fn reclaim(
        &self,
        map: &mut HashMap<Arc<str>, Bound>,
        in_use: &mut dyn FnMut() -> HashSet<Arc<str>>,
    ) {
        let mut last = self.reclaimed.lock();
        if last.0.is_some_and(|t| t.elapsed() < RECLAIM_INTERVAL) {
            return;
        }
        let floor = last.1;
        *last = (Some(Instant::now()), self.newest.load(Ordering::Acquire));
        drop(last);
        let used = in_use();
        let before = map.len();
        map.retain(|ns, b| b.generation > floor || used.contains(ns));
        let dropped = before - map.len();
        if dropped > 0 {
            tracing::info!(
                dropped,
                left = map.len(),
                "dropped the identity bindings of namespaces that hold no block"
            );
        }
    }
}

/// What the bindings file says besides the bindings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Marks {
    /// `disk_blocks_unguarded` (module doc).
    unguarded: bool,
    /// `tenants`: whether the service that wrote the blocks had tenants (None: a file
    /// from before it was recorded). See [`drop_blocks_if_tenancy_changed`].
    tenants: Option<bool>,
}

fn encode(map: &HashMap<Arc<str>, Bound>, marks: Marks) -> String {
    let obj: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .map(|(k, b)| (k.to_string(), serde_json::Value::String(hex::encode(b.id))))
        .collect();
    let since: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .filter(|(_, b)| b.since_ms > 0)
        .map(|(k, b)| (k.to_string(), serde_json::Value::from(b.since_ms)))
        .collect();
    let mut v = serde_json::json!({ "version": 1, "bindings": obj });
    if !since.is_empty() {
        v["since"] = serde_json::Value::Object(since);
    }
    if marks.unguarded {
        v["disk_blocks_unguarded"] = serde_json::Value::Bool(true);
    }
    if let Some(t) = marks.tenants {
        v["tenants"] = serde_json::Value::Bool(t);
    }
    v.to_string()
}

/// The marks of a bindings file's text.
fn marks_of(text: &str) -> Marks {
    let v = serde_json::from_str::<serde_json::Value>(text).unwrap_or_default();
    Marks {
        unguarded: v["disk_blocks_unguarded"] == serde_json::Value::Bool(true),
        tenants: v["tenants"].as_bool(),
    }
}

/// Drops every KV block `engine` holds if the bindings that guarded them are lost:
/// `file` missing, unreadable or corrupt while KV blocks were recovered (see the module
/// doc). Call before the service opens the file (which writes a missing one and moves a
/// corrupt one aside) and before it serves. Returns the blocks dropped.
/// Checks that the bindings `file` can be read, or is missing (a first start), or is
/// corrupt (handled by [`drop_blocks_if_bindings_lost`] and `load`): any other error
/// (EIO, EMFILE, EACCES) is the device's or the process's, and the start must fail with
/// the blocks kept. Taken for lost bindings, one EIO dropped every KV block (black-box
/// finding).
pub fn check_readable(file: &Path) -> std::io::Result<()> {
    match strata_cache_core::state_file::read_regular_to_string(file) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::InvalidData) => Ok(()),
        Err(e) => Err(e),
    }
}

pub async fn drop_blocks_if_bindings_lost(file: &Path, engine: &CacheEngine) -> usize {
    let read = strata_cache_core::state_file::read_regular_to_string(file).ok();
    let bindings = read.as_deref().and_then(parse);
    let marks = read.as_deref().map(marks_of).unwrap_or_default();
    let unguarded = bindings.is_some() && marks.unguarded;
    if !engine.tier_kinds().contains(&TierKind::Disk) {
        // Nothing here outlives this run, but a disk tier's blocks may be waiting for
        // the next start with it, and nothing this run does to KV blocks reaches them:
        // marked so that start drops them (module doc).
        if !unguarded {
            let lost = bindings.is_none();
            if lost && read.is_some() {
                // Corrupt: kept aside, as `load` keeps it.
                let _ = std::fs::rename(file, file.with_extension("json.corrupt"));
            }
            let kept: HashMap<Arc<str>, Bound> = bindings.unwrap_or_default();
            let marks = Marks {
                unguarded: true,
                ..marks
            };
            match write_atomically(file, encode(&kept, marks).as_bytes()) {
                Err(e) => {
                    tracing::error!(file = %file.display(), error = %e, "could not mark the KV namespace identities file: a later start with a disk tier may trust blocks no binding guarded")
                }
                Ok(()) if lost => {
                    tracing::error!(file = %file.display(), "KV namespace identities missing or unreadable; this start has no disk tier: marked so the next start with one drops the KV blocks it holds")
                }
                Ok(()) => {
                    tracing::warn!(file = %file.display(), "this start has no disk tier: the KV blocks a disk tier holds in the cache dir miss what this run removes, replaces and binds, so the next start with the disk tier drops them")
                }
            }
        }
        return 0;
    }
    if bindings.is_some() && !unguarded {
        return 0;
    }
    let dropped = drop_every_kv_block(file, engine, unguarded).await;
    if let Some(map) = bindings.filter(|_| unguarded) {
        // Dropped: the bindings made since guard what is put from now on.
        let marks = Marks {
            unguarded: false,
            ..marks
        };
        if let Err(e) = write_atomically(file, encode(&map, marks).as_bytes()) {
            tracing::error!(file = %file.display(), error = %e, "could not clear the unguarded mark of the KV namespace identities file; the next start drops the KV blocks again");
        }
    }
    dropped
}

/// Drops every KV block `engine` holds, and every binding, when the cache dir was last
/// served with tenants and now is not, or the other way round; records the mode in
/// `file` either way. Call after [`drop_blocks_if_bindings_lost`], before the service
/// opens the file. Returns the blocks dropped.
///
/// A tenant's namespace `ns` is the cache namespace `"<tenant>:ns"`, and without tenants
/// a client names cache namespaces as it likes: across a switch, blocks and bindings of
/// one mode are those of another client in the other (black-box finding: an anonymous
/// client's put into `a:m-x` was read by tenant `a` as its own `m-x`, and its binding
/// of `a:m-y` refused tenant `a`'s model in its own namespace; the other way round,
/// tenants' blocks would be open to any client). A file from before the mode was
/// recorded (a release before 2026-12-05) says nothing of the mode: its blocks and
/// bindings go too, unless it has none (black-box finding: an upgrade that also turned
/// tenants on served a client's `acme:secret` to tenant `acme`, and one that turned
/// them off served tenant `acme`'s blocks to any client).
pub async fn drop_blocks_if_tenancy_changed(
    file: &Path,
    engine: &CacheEngine,
    tenants: bool,
) -> usize {
    let text = match strata_cache_core::state_file::read_regular_to_string(file) {
        Ok(t) => t,
        // A first start: nothing to drop, the mode recorded from now on.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            encode(&HashMap::new(), Marks::default())
        }
        Err(_) => return 0,
    };
    let Some(bindings) = parse(&text) else {
        // Corrupt: its blocks went with it (`drop_blocks_if_bindings_lost`). Kept
        // aside, as `load` keeps it, and the mode recorded in the file that replaces
        // it (round 20b: the file written after a corrupt one had no mode, and the
        // next start in the same mode dropped every block put since).
        let aside = file.with_extension("json.corrupt");
        tracing::error!(file = %file.display(), aside = %aside.display(), "KV namespace identities file is corrupt; moved aside, starting without them");
        let _ = std::fs::rename(file, &aside);
        let marks = Marks {
            tenants: Some(tenants),
            ..Marks::default()
        };
        if let Err(e) = write_atomically(file, encode(&HashMap::new(), marks).as_bytes()) {
            tracing::error!(file = %file.display(), error = %e, "could not record the tenancy mode in the KV namespace identities file");
        }
        return 0;
    };
    let marks = marks_of(&text);
    if marks.tenants == Some(tenants) {
        return 0;
    }
    let now = Marks {
        tenants: Some(tenants),
        ..marks
    };
    let blocks = engine.resident_kv();
    let (dropped, kept) = match marks.tenants {
        Some(_) => {
            tracing::warn!(file = %file.display(), blocks = blocks.len(), bindings = bindings.len(),
                tenants, "the KV cache was last served {} tenants: dropping its blocks and model-identity bindings, which belong to other clients' key spaces",
                if tenants { "without" } else { "with" });
            (remove_kv_blocks(engine, blocks).await, HashMap::new())
        }
        None if blocks.is_empty() && bindings.is_empty() => (0, HashMap::new()),
        None => {
            tracing::warn!(file = %file.display(), blocks = blocks.len(), bindings = bindings.len(),
                tenants, "the KV cache was last served by a release that did not record whether it had tenants: dropping its blocks and model-identity bindings, which may belong to another key space");
            (remove_kv_blocks(engine, blocks).await, HashMap::new())
        }
    };
    if let Err(e) = write_atomically(file, encode(&kept, now).as_bytes()) {
        tracing::error!(file = %file.display(), error = %e, "could not record the tenancy mode in the KV namespace identities file");
    }
    dropped
}

/// Drops every KV block `engine` holds: their bindings were lost, or (`marked`) a
/// start without the disk tier marked them (the log says which: black-box finding,
/// round 25b: the mark was logged as a missing or unreadable file).
async fn drop_every_kv_block(file: &Path, engine: &CacheEngine, marked: bool) -> usize {
    let blocks = engine.resident_kv();
    if blocks.is_empty() {
        return 0;
    }
    if marked {
        tracing::warn!(file = %file.display(), blocks = blocks.len(),
            "a start without the disk tier ran over this cache dir since these KV blocks were written (it marked the identities file disk_blocks_unguarded): dropping them, as what it removed, replaced or bound did not reach them");
    } else {
        tracing::error!(file = %file.display(), blocks = blocks.len(),
            "KV namespace identities missing or unreadable while the cache holds KV blocks: dropping them, as no binding guards them from another model (releases before 2026-12-05 wrote no such file while no model identity was bound: an upgrade from one drops its KV blocks once)");
    }
    remove_kv_blocks(engine, blocks).await
}

/// Removes `blocks` from `engine`; how many it held. Many at once: each removal from a
/// disk tier waits for its index write to be synced, and the index syncs writes that
/// come together once (black-box finding: one at a time, 16,000 blocks held the start
/// for 10-14 s before the service listened).
async fn remove_kv_blocks(engine: &CacheEngine, blocks: Vec<(CacheKey, u64)>) -> usize {
    use futures::StreamExt;
    /// Removals in flight: enough for the index to sync them in groups.
    const AT_ONCE: usize = 64;
    futures::stream::iter(blocks)
        .map(|(key, _)| async move {
            match engine.remove(&key).await {
                Ok(held) => held,
                Err(e) => {
                    tracing::error!(%key, error = %e, "could not drop a KV block");
                    false
                }
            }
        })
        .buffer_unordered(AT_ONCE)
        .filter(|held| std::future::ready(*held))
        .count()
        .await
}

/// The bindings in `file`, and its marks.
fn load(file: &Path) -> (HashMap<Arc<str>, Bound>, Marks) {
    let text = match strata_cache_core::state_file::read_regular_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return (HashMap::new(), Marks::default())
        }
        Err(e) => {
            tracing::error!(file = %file.display(), error = %e, "cannot read KV namespace identities; starting without them");
            return (HashMap::new(), Marks::default());
        }
    };
    match parse(&text) {
        Some(m) => (m, marks_of(&text)),
        None => {
            let aside = file.with_extension("json.corrupt");
            tracing::error!(file = %file.display(), aside = %aside.display(), "KV namespace identities file is corrupt; moved aside, starting without them");
            let _ = std::fs::rename(file, aside);
            (HashMap::new(), Marks::default())
        }
    }
}

/// The bindings of a file's text, each with its time where the file has one (`since`,
/// written from 2026-12-07 on; version 1 all the same, as older releases read past it).
fn parse(text: &str) -> Option<HashMap<Arc<str>, Bound>> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    if v["version"] != 1 {
        return None;
    }
    let since = v["since"].as_object();
    let mut out = HashMap::new();
    for (k, d) in v["bindings"].as_object()? {
        let digest = crate::keys::parse_identity_hex(d.as_str()?)?;
        let mut bound = Bound::loaded(digest);
        bound.since_ms = since
            .and_then(|m| m.get(k.as_str()))
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        out.insert(Arc::from(k.as_str()), bound);
        if out.len() > MAX_BINDINGS {
            return None;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IdentityDigest = [1; 32];
    const B: IdentityDigest = [2; 32];

    #[test]
    fn a_put_binds_and_another_identity_is_refused() {
        let b = IdentityBindings::open(None);
        let ns: Arc<str> = Arc::from("m/t");
        b.check(&ns, Some(&A), false).expect("reads do not bind");
        assert_eq!(b.bound("m/t"), None);
        b.check(&ns, Some(&B), true).expect("first put binds");
        b.check(&ns, Some(&B), false).expect("same identity");
        let e = b.check(&ns, Some(&A), false).expect_err("other identity");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        assert!(e.to_string().contains("m/t"), "{e}");
        b.check(&ns, Some(&A), true).expect_err("nor can it put");
        b.check(&ns, None, true)
            .expect("v1 clients are not checked");
    }

    /// Black-box finding: one failed write of the file (the cache disk full) and the
    /// put that bound the namespace was acknowledged; after a restart another model's
    /// client read its block. The put's wait for durability now fails, the binding is
    /// undone, and a later put binds and saves it once the disk recovers.
    #[tokio::test]
    async fn a_binding_that_cannot_be_saved_fails_its_put_until_it_can() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir");
        let f = sub.join("kv-identities.json");
        let b = Arc::new(IdentityBindings::open(Some(f.clone())));
        // The folder turns into a file: every write of the bindings fails.
        std::fs::remove_dir_all(&sub).expect("rm");
        std::fs::write(&sub, b"not a folder").expect("write");
        let ns: Arc<str> = Arc::from("m/t");
        let g = b
            .check(&ns, Some(&A), true)
            .expect("bind")
            .expect("generation");
        let e = b.durable(g).await.expect_err("the write failed");
        assert!(!e.is_empty());
        b.unbind(&ns, g);
        assert_eq!(b.bound("m/t"), None, "undone");
        // The disk recovers: the next put binds, and is acknowledged once saved.
        std::fs::remove_file(&sub).expect("rm");
        std::fs::create_dir(&sub).expect("mkdir");
        let g = b
            .check(&ns, Some(&B), true)
            .expect("bind")
            .expect("generation");
        b.durable(g).await.expect("saved");
        assert_eq!(IdentityBindings::open(Some(f)).bound("m/t"), Some(B));
    }

    /// The gap between writes of the bindings file follows their cost: nine times it,
    /// within 10 ms..1 s (a put into a new namespace waited a whole second before).
    #[test]
    fn the_gap_between_writes_is_nine_times_their_cost_within_bounds() {
        let ms = Duration::from_millis;
        assert_eq!(next_write_in(ms(2), ms(0)), ms(18));
        assert_eq!(next_write_in(ms(2), ms(5)), ms(13));
        assert_eq!(next_write_in(ms(2), ms(30)), ms(0));
        assert_eq!(next_write_in(Duration::ZERO, ms(0)), PERSIST_GAP);
        assert_eq!(next_write_in(ms(500), ms(0)), PERSIST_INTERVAL);
    }

    /// 500 puts binding new namespaces at once: each is acknowledged only with its
    /// binding in the file, and they share a couple of writes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_new_bindings_is_made_durable_by_few_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("kv-identities.json");
        let b = Arc::new(IdentityBindings::open(Some(f.clone())));
        let mut puts = tokio::task::JoinSet::new();
        for i in 0..500 {
            let b = b.clone();
            // Bound here, before any put waits: a task starting late on a loaded
            // machine must not turn one burst into many.
            let ns: Arc<str> = Arc::from(format!("ns-{i}"));
            let generation = b.check(&ns, Some(&A), true).expect("bind");
            puts.spawn(async move {
                b.durable(generation.expect("a put with an identity"))
                    .await
                    .expect("saved");
                // Acknowledged: the binding is in the file, as a crash would find it.
                let on_disk = IdentityBindings::open(Some(b.file.clone().expect("file")));
                assert_eq!(
                    on_disk.bound(&ns),
                    Some(A),
                    "{ns} acknowledged, not durable"
                );
            });
        }
        while let Some(r) = puts.join_next().await {
            r.expect("put");
        }
        // Group commit: a write per batch, not per put (the elapsed time is not
        // asserted: the 500 re-reads of the file take seconds on a loaded CI machine).
        assert!(b.writes() <= 3, "{} writes for 500 bindings", b.writes());
        // A put into a namespace bound and persisted already does not wait.
        let writes = b.writes();
        let again = b
            .check(&Arc::from("ns-7"), Some(&A), true)
            .expect("same identity");
        b.durable(again.expect("generation")).await.expect("saved");
        assert_eq!(b.writes(), writes);
    }

    /// Black-box finding: with the bindings file truncated, garbled or deleted while
    /// the daemon was down, it started with the blocks and without their bindings, and
    /// another model's client loaded them. The blocks go with the bindings; an intact
    /// file (an empty one included, as the first start writes) keeps them.
    #[tokio::test]
    async fn blocks_are_dropped_when_their_bindings_are_lost() {
        use strata_cache_core::{AccessContext, CacheKey};
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("kv-identities.json");
        let engine = disk_engine(dir.path());
        let key = CacheKey::kv("team", b"h1".to_vec());
        let fill = || async {
            engine
                .put(
                    &key,
                    bytes::Bytes::from_static(b"model A's kv"),
                    &AccessContext::default(),
                )
                .await
                .expect("put");
        };
        // First start: no file yet, nothing held: nothing dropped, the file is written.
        assert_eq!(drop_blocks_if_bindings_lost(&f, &engine).await, 0);
        let b = IdentityBindings::open(Some(f.clone()));
        assert!(f.exists(), "written at the first start");
        b.check(&Arc::from("team"), Some(&A), true).expect("bind");
        b.write(&f);
        fill().await;
        // A restart with the file intact keeps the block.
        assert_eq!(drop_blocks_if_bindings_lost(&f, &engine).await, 0);
        assert!(engine.contains(&key));
        for damage in ["truncate", "garble", "delete"] {
            match damage {
                "truncate" => std::fs::write(&f, b"{\"version\": 1, \"bind").expect("write"),
                "garble" => std::fs::write(&f, [0xffu8; 64]).expect("write"),
                _ => std::fs::remove_file(&f).expect("rm"),
            }
            assert_eq!(
                drop_blocks_if_bindings_lost(&f, &engine).await,
                1,
                "{damage}"
            );
            assert!(
                !engine.contains(&key),
                "{damage}: no unguarded block is kept"
            );
            // The service then starts afresh (the damaged file moved aside).
            let b = IdentityBindings::open(Some(f.clone()));
            assert_eq!(b.bound("team"), None);
            b.check(&Arc::from("team"), Some(&A), true).expect("bind");
            b.write(&f);
            fill().await;
        }
    }

    /// An engine of one memory tier: nothing outlives the run.
    fn memory_engine() -> CacheEngine {
        CacheEngine::builder()
            .tier(Arc::new(strata_cache_core::tiers::MemoryTier::new(1 << 20)))
            .build()
            .expect("engine")
    }

    /// A first start over `disk`: model A binds `team` and puts `key`.
    async fn first_start_binding_a(
        f: &Path,
        disk: &CacheEngine,
        key: &strata_cache_core::CacheKey,
        value: &'static [u8],
    ) {
        assert_eq!(drop_blocks_if_bindings_lost(f, disk).await, 0);
        let a = IdentityBindings::open(Some(f.to_path_buf()));
        a.check(&Arc::from("team"), Some(&A), true).expect("bind A");
        a.write(f);
        disk.put(
            key,
            bytes::Bytes::from_static(value),
            &strata_cache_core::AccessContext::default(),
        )
        .await
        .expect("put");
    }

    /// An engine with a disk tier under `dir`: its blocks outlive a restart.
    fn disk_engine(dir: &Path) -> CacheEngine {
        use strata_cache_core::tiers::disk::{DiskOptions, DiskTier};
        CacheEngine::builder()
            .tier(Arc::new(
                DiskTier::open(dir.join("blocks"), 16 << 20, DiskOptions::default())
                    .expect("disk tier"),
            ))
            .build()
            .expect("engine")
    }

    /// Black-box finding (round 11): with the file deleted, one start without a disk
    /// tier (`--disk 0`) had nothing to drop, let model B bind the namespace and wrote
    /// an intact file; the next start with the disk tier trusted it and served model
    /// A's blocks to B. The start without a disk tier marks the file, and the next
    /// start with one drops the blocks and clears the mark.
    #[tokio::test]
    async fn a_start_without_the_disk_tier_leaves_lost_bindings_marked_for_the_next_with_it() {
        use strata_cache_core::CacheKey;
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("kv-identities.json");
        let disk = disk_engine(dir.path());
        let key = CacheKey::kv("team", b"h1".to_vec());
        first_start_binding_a(&f, &disk, &key, b"model A's kv").await;
        std::fs::remove_file(&f).expect("lost");

        let memory_only = memory_engine();
        for _ in 0..2 {
            // Two such starts: the mark survives the second's rewrite of the file.
            assert_eq!(drop_blocks_if_bindings_lost(&f, &memory_only).await, 0);
            let b = IdentityBindings::open(Some(f.clone()));
            b.check(&Arc::from("team"), Some(&B), true)
                .expect("B binds");
            b.write(&f);
        }

        assert_eq!(
            drop_blocks_if_bindings_lost(&f, &disk).await,
            1,
            "the start with the disk tier drops the block no binding guarded"
        );
        assert!(!disk.contains(&key));
        let back = IdentityBindings::open(Some(f.clone()));
        assert_eq!(back.bound("team"), Some(B), "the bindings made since kept");
        assert_eq!(
            drop_blocks_if_bindings_lost(&f, &disk).await,
            0,
            "the mark cleared: blocks put from now on are guarded"
        );
    }

    /// Round 25: with the bindings intact, a start without the disk tier (which cannot
    /// see the disk's blocks) removed keys, put new values and switched the tenancy
    /// mode; the next start with the disk tier served the removed keys, the old values
    /// and another key space's blocks. It marks the file, and the next start with the
    /// disk tier drops the blocks, keeping the bindings.
    #[tokio::test]
    async fn a_start_without_the_disk_tier_marks_the_disks_kv_blocks_for_the_next_with_it() {
        use strata_cache_core::CacheKey;
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("kv-identities.json");
        let key = CacheKey::kv("team", b"h1".to_vec());
        first_start_binding_a(&f, &disk_engine(dir.path()), &key, b"v1").await;
        let memory_only = memory_engine();
        assert_eq!(drop_blocks_if_bindings_lost(&f, &memory_only).await, 0);
        assert_eq!(
            IdentityBindings::open(Some(f.clone())).bound("team"),
            Some(A),
            "the bindings are intact: kept"
        );
        // The run removes the key (from memory: the disk's copy is out of its reach).
        memory_only.remove(&key).await.expect("remove");

        let disk = disk_engine(dir.path());
        assert!(disk.contains(&key), "the disk still holds it");
        assert_eq!(
            drop_blocks_if_bindings_lost(&f, &disk).await,
            1,
            "the start with the disk tier drops what the last run could not see"
        );
        assert!(!disk.contains(&key));
        assert_eq!(
            IdentityBindings::open(Some(f.clone())).bound("team"),
            Some(A)
        );
        assert_eq!(
            drop_blocks_if_bindings_lost(&f, &disk).await,
            0,
            "the mark cleared"
        );
    }

    /// Black-box finding (round 13): blocks and bindings made without tenants under
    /// `a:m-x` were tenant `a`'s own `m-x` once tenants were configured over the same
    /// cache dir. A start in the other mode drops them, and so does one over a file from
    /// before the mode was recorded (round 20: an upgrade that switched the mode leaked
    /// blocks across); a start in the same mode keeps them.
    #[tokio::test]
    async fn a_switch_of_tenancy_drops_the_blocks_and_bindings_of_the_other_mode() {
        use strata_cache_core::{AccessContext, CacheKey};
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("kv-identities.json");
        let engine = disk_engine(dir.path());
        let key = CacheKey::kv("a:m-x", b"k".to_vec());
        let put = || async {
            engine
                .put(
                    &key,
                    bytes::Bytes::from_static(b"an anonymous client's bytes"),
                    &AccessContext::default(),
                )
                .await
                .expect("put");
        };
        let (f, engine) = (&f, &engine);
        let start = |tenants| async move {
            let dropped = drop_blocks_if_bindings_lost(f, engine).await
                + drop_blocks_if_tenancy_changed(f, engine, tenants).await;
            (dropped, IdentityBindings::open(Some(f.clone())))
        };
        // First start, without tenants: the mode is recorded even before any binding.
        let (dropped, b) = start(false).await;
        assert_eq!(dropped, 0);
        assert_eq!(
            marks_of(&std::fs::read_to_string(f).expect("read")).tenants,
            Some(false)
        );
        b.check(&Arc::from("a:m-y"), Some(&A), true).expect("bind");
        b.write(f);
        put().await;
        let (dropped, b) = start(false).await;
        assert_eq!(dropped, 0, "same mode: kept");
        assert_eq!(b.bound("a:m-y"), Some(A));
        drop(b);
        // Tenants configured over the same dir: nothing of the anonymous client's stays.
        let (dropped, b) = start(true).await;
        assert_eq!(dropped, 1);
        assert!(!engine.contains(&key));
        assert_eq!(
            b.bound("a:m-y"),
            None,
            "tenant a's own namespace is unbound"
        );
        b.check(&Arc::from("a:m-y"), Some(&B), true)
            .expect("tenant a's model binds");
        b.write(f);
        put().await;
        // And back: the tenant's blocks are not left open to any client.
        let (dropped, b) = start(false).await;
        assert_eq!(dropped, 1);
        assert_eq!(b.bound("a:m-y"), None);
        drop(b);
        // A file from before the mode was recorded, either way: the blocks and
        // bindings go; the mode is recorded from then on.
        for tenants in [true, false] {
            put().await;
            std::fs::write(
                f,
                format!(
                    r#"{{"version": 1, "bindings": {{"a:m-y": "{}"}}}}"#,
                    hex::encode(A)
                ),
            )
            .expect("write");
            let (dropped, b) = start(tenants).await;
            assert_eq!(dropped, 1, "tenants {tenants}");
            assert!(!engine.contains(&key));
            assert_eq!(b.bound("a:m-y"), None);
            drop(b);
            assert_eq!(
                marks_of(&std::fs::read_to_string(f).expect("read")).tenants,
                Some(tenants)
            );
            let (dropped, _) = start(tenants).await;
            assert_eq!(dropped, 0, "recorded: the next start in that mode keeps");
        }
        // A corrupt file: its blocks go, and the file that replaces it records the
        // mode, so the next start in that mode keeps what was put since (round 20b).
        put().await;
        std::fs::write(f, b"{not json").expect("corrupt");
        let (dropped, b) = start(false).await;
        assert_eq!(dropped, 1);
        drop(b);
        put().await;
        let (dropped, _) = start(false).await;
        assert_eq!(dropped, 0, "the mode recorded over the corrupt file");
        assert!(engine.contains(&key));
    }

    /// Black-box finding (round 11): a binding made while the group could not be asked
    /// was never checked against the group's once it answered. It is listed until the
    /// group answers, and gives way to the group's.
    #[test]
    fn a_binding_made_unasked_is_listed_until_confirmed_and_gives_way_to_the_groups() {
        let b = IdentityBindings::open(None);
        let ns: Arc<str> = Arc::from("m/t");
        b.check(&ns, Some(&B), true)
            .expect("B binds, the group unasked");
        b.mark_unconfirmed(&ns);
        assert_eq!(b.unconfirmed(), vec![(ns.clone(), B)]);
        assert_eq!(b.adopt(&ns, &A, &A, 0), None, "not bound to A here");
        let generation = b.adopt(&ns, &B, &A, 0).expect("the group's A replaces B");
        assert!(generation > 0);
        assert_eq!(b.bound("m/t"), Some(A));
        assert_eq!(b.since_ms("m/t"), Some(0), "the group's time with it");
        assert!(b.unconfirmed().is_empty(), "settled");
        b.check(&ns, Some(&B), false).expect_err("B refused now");
        b.check(&ns, Some(&A), true).expect("A puts");
        // A mark whose binding is gone is forgotten.
        let other: Arc<str> = Arc::from("other");
        b.mark_unconfirmed(&other);
        assert!(b.unconfirmed().is_empty());
    }

    /// The group keeps the oldest of two bindings (`strata_cluster::bindings`): a binding
    /// carries its time, across a restart too (a restart must not make a binding made
    /// after etcd lost its records look older than those of the members that held the
    /// namespace before); one from a file without times is the oldest.
    #[test]
    fn a_binding_keeps_its_time_across_a_reopen_and_one_without_is_the_oldest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("kv-identities.json");
        let ns: Arc<str> = Arc::from("m/t");
        let b = IdentityBindings::open(Some(f.clone()));
        let before = unix_ms();
        b.check(&ns, Some(&A), true).expect("bind");
        let since = b.since_ms("m/t").expect("bound");
        assert!(since >= before && since <= unix_ms(), "{since}");
        assert_eq!(b.recent(Duration::from_secs(60)), vec![(ns.clone(), A)]);
        drop(b);
        let again = IdentityBindings::open(Some(f.clone()));
        assert_eq!(again.since_ms("m/t"), Some(since));
        assert_eq!(again.recent(Duration::from_secs(60)), vec![(ns.clone(), A)]);
        drop(again);
        // An older release's file: no times.
        std::fs::write(
            &f,
            format!(
                r#"{{"version":1,"bindings":{{"m/t":"{}"}}}}"#,
                hex::encode(A)
            ),
        )
        .expect("write");
        let old = IdentityBindings::open(Some(f));
        assert_eq!(old.bound("m/t"), Some(A));
        assert_eq!(old.since_ms("m/t"), Some(0));
        assert!(old.recent(Duration::from_secs(60)).is_empty());
    }

    /// A client binding namespace after namespace right after a start gets at most
    /// [`MAX_RECENT_CHECKED`] of them checked, the earliest first.
    #[test]
    fn recent_bindings_are_bounded_and_the_earliest_kept() {
        let b = IdentityBindings::open(None);
        let first: Arc<str> = Arc::from("first");
        b.check(&first, Some(&A), true).expect("bind");
        std::thread::sleep(Duration::from_millis(5));
        for i in 0..MAX_RECENT_CHECKED + 50 {
            let ns: Arc<str> = Arc::from(format!("churn-{i}").as_str());
            b.check(&ns, Some(&B), true).expect("bind");
        }
        let recent = b.recent(Duration::from_secs(60));
        assert_eq!(recent.len(), MAX_RECENT_CHECKED);
        assert_eq!(recent[0], (first, A));
    }

    #[test]
    fn bindings_survive_a_reopen_and_a_corrupt_file_is_moved_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("kv-identities.json");
        let ns: Arc<str> = Arc::from("m/t");
        let first = IdentityBindings::open(Some(f.clone()));
        first.check(&ns, Some(&A), true).expect("bind");
        drop(first); // what was not written yet is written on drop
        let again = IdentityBindings::open(Some(f.clone()));
        assert_eq!(again.bound("m/t"), Some(A));
        assert!(again.check(&ns, Some(&B), false).is_err());
        std::fs::write(&f, b"{not json").expect("corrupt it");
        let fresh = IdentityBindings::open(Some(f.clone()));
        assert_eq!(fresh.bound("m/t"), None);
        assert!(
            f.with_extension("json.corrupt").exists(),
            "kept for inspection"
        );
    }

    /// Black-box finding (security): one tenant bound 16,384 namespaces (blocks put, then
    /// removed; bindings stay) and every other tenant's first put to a new namespace was
    /// refused. With tenants each binds at most its share; the others keep theirs.
    /// Black-box finding: bindings only ever grew, so a client cycling namespaces
    /// filled the bound and every new namespace's put was refused for good. At the
    /// bound, bindings of namespaces holding no block make room (not one made since
    /// the last reclaim: its put may be in flight).
    #[test]
    fn bindings_of_namespaces_without_blocks_make_room_at_the_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("ids.json");
        let id = [1u8; 32];
        {
            let b = IdentityBindings::open(Some(file.clone()));
            for i in 0..MAX_BINDINGS {
                b.check(&Arc::from(format!("ns{i}")), Some(&id), true)
                    .expect("bind");
            }
            assert!(
                b.check(&Arc::from("new"), Some(&id), true).is_err(),
                "at the bound"
            );
        }
        let b = IdentityBindings::open(Some(file));
        let in_use = || HashSet::from([Arc::<str>::from("ns7")]);
        b.check_reclaiming(&Arc::from("new"), Some(&id), true, in_use)
            .expect("room made");
        assert_eq!(
            b.bound("ns7"),
            Some(id),
            "a namespace holding blocks stays bound"
        );
        assert_eq!(b.bound("ns8"), None);
        assert_eq!(b.bound("new"), Some(id));
    }

    #[test]
    fn each_tenant_binds_at_most_its_share() {
        let b = IdentityBindings::open(None).share_among_tenants(2);
        let share = MAX_BINDINGS / 2;
        for i in 0..share {
            b.check(&Arc::from(format!("alice:n{i}")), Some(&A), true)
                .expect("within alice's share");
        }
        let e = b
            .check(&Arc::from("alice:one-more"), Some(&A), true)
            .expect_err("past alice's share");
        assert!(matches!(&e, KvError::Busy(m) if m.contains("alice")), "{e}");
        b.check(&Arc::from("alice:n0"), Some(&A), true)
            .expect("a bound namespace is still put to");
        b.check(&Arc::from("bob:first"), Some(&B), true)
            .expect("bob's share is his");
        let single = IdentityBindings::open(None);
        for i in 0..share + 1 {
            single
                .check(&Arc::from(format!("n{i}")), Some(&A), true)
                .expect("without tenants one pool");
        }
    }
}

#[cfg(test)]
mod readable_tests {
    use super::check_readable;

    /// Black-box finding (round 15): one EIO reading the bindings was taken for lost
    /// bindings and dropped every KV block. Only a missing or corrupt file is theirs to
    /// handle; any other error fails the start.
    #[test]
    fn only_a_missing_or_corrupt_bindings_file_is_readable_enough() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("kv-identities.json");
        check_readable(&file).expect("missing: a first start");
        std::fs::write(&file, b"{not json").expect("write");
        check_readable(&file).expect("corrupt: handled by the drop");
        let not_a_dir = file.join("x.json");
        let e = check_readable(&not_a_dir).expect_err("an I/O error fails the start");
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR), "{e}");
    }
}
