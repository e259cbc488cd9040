//! Same-host zero-copy Gets: a shared-memory arena the service hands to local clients.
//!
//! A client on the daemon's host connects to the side socket (`kv-shm.sock` in the
//! cache dir, 0600) and receives, with `SCM_RIGHTS`, a memfd holding the arena plus a
//! session id; it maps the arena read-only. A Get that carries the session id (gRPC
//! metadata [`SHM_SESSION_METADATA`]) is answered with an offset and a lease instead of
//! the bytes: the client reads the block in place, without a copy through the socket,
//! and writes the lease id back on the side socket when done. While leased, a range is
//! never reused, so a mapped block cannot change under its reader; when the side
//! connection closes (the client exited or crashed) its leases are released.
//!
//! The arena is a cache of blocks recently served this way: a block stays in it after
//! its leases end (least recently used first out), so a hot block is copied into the
//! arena once and then served by reference. It never serves stale bytes: a value is
//! immutable while the cache holds it, and every store or removal of a key drops the
//! key's copy first ([`ShmArena::forget`]); a Get notes the key's change count before
//! it fetches the block from this node's tiers, and its copy becomes the key's only if
//! no change came between (a block fetched from a peer is leased from a copy of its
//! own). An entry used to keep the engine's buffer it was copied from, to compare
//! identities: up to the arena's size of buffers the engine had evicted stayed in the
//! heap (soak finding: 213 MB in use in malloc beside a 32 MiB memory tier).
//!
//! Bounds: the arena size (`[kv] shm`), and per session at most a quarter of it leased
//! at once, so one client cannot pin the whole arena; past that, or when every range is
//! leased, the Get falls back to inline bytes. The memfd is sealed against shrinking,
//! so a client's mapping can never fault on a truncated file.
//!
//! Device leases (the GPU tier's IPC handles, `strata_gds::ipc`) ride on the same
//! sessions: a Get that also carries [`DEVICE_IPC_METADATA`] for a block resident in
//! the GPU tier is answered with a handle (`device_handle`) and a lease id instead of
//! bytes. The lease holds the tier's export, so the block's device memory is neither
//! freed nor reused while the client reads it, even if the key is evicted meanwhile
//! (eviction waits for the lease, as an arena range's reuse does). Released like an
//! arena lease: the id on the side socket, or the session's end. An emulated device's
//! memory (a memfd) is sent in the hello beside the arena's, so its handles open in the
//! client; a CUDA handle needs nothing more (the driver maps it). Per session at most a
//! quarter of the GPU tier may be leased at once (the arena's rule, for the same reason:
//! one client cannot pin the tier); past that the Get falls back to the arena or inline
//! bytes. A read by handle records its access as every read does (the engine's tracker
//! and the GPU tier's policy through `CacheEngine::record_read_in_place`, the service's
//! hit and the staging controller's "used"; `KvService::record_served`), though no bytes
//! pass through the engine: a block read only by handle is as hot as one read as bytes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use strata_cache_core::CacheKey;
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};

use crate::error::{KvError, Result};
use strata_gds::sealed_memfd::SealedMemfd;

/// gRPC metadata naming the caller's shared-memory session (32 hex digits).
pub const SHM_SESSION_METADATA: &str = "strata-shm-session";

/// What BatchLease answers (FAILED_PRECONDITION) for a session the service does not
/// hold (it restarted, or the side connection closed): clients attach again on it.
pub const SESSION_ENDED: &str = "the shared-memory session has ended: attach again";

/// gRPC metadata naming the leasing call (a client-chosen number below 2^63), so the
/// client can give up the leases of an answer it never got: on the side socket it sends
/// the number with the top bit set ([`ABANDON_BIT`]). Black-box finding: the leases of
/// Gets whose caller timed out were never released (the client never learnt their ids),
/// and the session's quarter of the arena stayed leased until it closed, every later
/// block coming as bytes.
pub const SHM_REQUEST_METADATA: &str = "strata-shm-request";

/// Marks a side-socket message as "abandon the leases of this call" (lease ids never
/// reach it).
pub const ABANDON_BIT: u64 = 1 << 63;

/// Abandoned calls a session remembers, for answers built after the client gave up.
const ABANDONED_KEPT: usize = 64;

/// gRPC metadata (any value) asking for a device handle when the block is resident in
/// the GPU tier (with [`SHM_SESSION_METADATA`]; see the module docs).
pub const DEVICE_IPC_METADATA: &str = "strata-device-ipc";

/// Size of the side socket's hello: session id (16), arena size (8), device memory
/// size (8, 0 without); followed by the device memory's 16-byte id when that is not 0.
pub const HELLO_BYTES: usize = 32;

/// Arena ranges are whole pages, so a block's range never shares a page with another's.
const PAGE: usize = 4096;

/// Most sessions at once: 1,024 local clients (engine workers) is far beyond one
/// host's, and it bounds the descriptors and tasks the side socket can be made to hold.
/// A lower descriptor limit lowers it ([`session_cap`]).
pub const MAX_SESSIONS: usize = 1024;

/// Sessions at once under this process's descriptor limit: [`MAX_SESSIONS`], or the
/// connection listeners' share of the limit (a quarter, `accept.rs`) when that is
/// smaller, so the sessions' descriptors get a quarter of their own beside the
/// listeners' and the disk tier's (black-box finding: under a 512 limit, 512 idle
/// shared-memory clients took every descriptor and the KV service stopped serving).
pub fn session_cap() -> usize {
    MAX_SESSIONS.min(crate::accept::process_connection_cap())
}

/// A session id: 128 random bits, as 32 hex digits on the wire.
pub type SessionId = u128;

/// One lease handed to a client: where the block is and what to release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: u64,
    pub offset: u64,
    pub len: u64,
}

/// Counters for stats and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ShmStats {
    pub sessions: u64,
    /// Idle sessions ended to make room for a new one ([`MAX_SESSIONS`]).
    pub sessions_ended: u64,
    /// Gets answered from the arena, and how many of those copied the block in.
    pub leases: u64,
    pub copies: u64,
    /// Gets that fell back to inline bytes (arena or session cap full).
    pub fallbacks: u64,
    /// Arena bytes (whole pages) leased right now.
    pub leased_bytes: u64,
    /// Gets answered with a device handle, and the device bytes leased right now.
    pub device_leases: u64,
    pub device_leased_bytes: u64,
}

/// An emulated device's memory, sent to every session beside the arena.
struct DeviceMemory {
    fd: OwnedFd,
    size: u64,
    id: [u8; 16],
}

/// A device lease: the export it keeps alive (dropping it ends the lease).
struct DeviceLease {
    session: SessionId,
    bytes: u64,
    export: Box<dyn Send + Sync>,
}

struct Entry {
    /// None once detached (a newer copy of the key exists, or it was removed): freed
    /// when its last lease ends.
    key: Option<CacheKey>,
    offset: usize,
    /// Rounded up to whole pages.
    span: usize,
    /// The block's length.
    len: usize,
    refs: u32,
    /// Position in `idle` while unreferenced.
    idle_tick: Option<u64>,
}

#[derive(Default)]
struct Session {
    leases: HashSet<u64>,
    bytes: u64,
    device_bytes: u64,
    /// Its last lease or release (or its start).
    used_at: u64,
    /// The call each lease answered, where the client named it ([`SHM_REQUEST_METADATA`]).
    call_of: HashMap<u64, u64>,
    /// Calls the client gave up, newest last.
    abandoned: std::collections::VecDeque<u64>,
    /// Told when the arena ends the session to make room (its side connection closes).
    ended: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct State {
    /// Free ranges: offset -> length, coalesced.
    free: BTreeMap<usize, usize>,
    entries: HashMap<u64, Entry>,
    by_key: HashMap<CacheKey, u64>,
    /// Unreferenced entries by last use (the eviction order).
    idle: BTreeMap<u64, u64>,
    leases: HashMap<u64, (SessionId, u64)>,
    device_leases: HashMap<u64, DeviceLease>,
    sessions: HashMap<SessionId, Session>,
    /// Orders sessions by last use ([`Session::used_at`]).
    session_clock: u64,
    tick: u64,
    next_id: u64,
    /// Stores and removals of keys, counted per slot of key hashes ([`change_slot`]).
    changes: Vec<u64>,
}

/// Slots of the change counts: a change of one key makes a Get of another key in the
/// same slot copy afresh instead of keeping its copy, so slots are many (8 KiB).
const CHANGE_SLOTS: usize = 1024;

fn change_slot(key: &CacheKey) -> usize {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
    (h.hash_one(key) % CHANGE_SLOTS as u64) as usize
}

/// The arena: a sealed memfd mapped read-write here, read-only by clients.
pub struct ShmArena {
    map: SealedMemfd,
    per_session_bytes: u64,
    /// Sessions at once ([`session_cap`]).
    max_sessions: usize,
    state: Mutex<State>,
    leases: AtomicU64,
    copies: AtomicU64,
    fallbacks: AtomicU64,
    sessions_ended: AtomicU64,
    device_leases: AtomicU64,
    /// Device bytes one session may hold leased (0: device leases off).
    device_cap: AtomicU64,
    device: std::sync::OnceLock<DeviceMemory>,
}

impl std::fmt::Debug for ShmArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmArena")
            .field("size", &self.map.len())
            .field("stats", &self.stats())
            .finish()
    }
}

fn io(e: nix::Error, what: &str) -> KvError {
    KvError::Cache(strata_cache_core::CacheError::Io(std::io::Error::new(
        std::io::Error::from(e).kind(),
        format!("shared-memory arena: {what}: {e}"),
    )))
}

impl ShmArena {
    /// An arena of `size` bytes (rounded up to pages).
    pub fn new(size: usize) -> Result<Self> {
        let size = size.div_ceil(PAGE).max(1) * PAGE;
        let len = NonZeroUsize::new(size).ok_or_else(|| KvError::Config("empty arena".into()))?;
        // Only the daemon writes the arena: clients map the blocks read-only.
        let map = SealedMemfd::create(c"strata-kv-arena", len, false, true)
            .map_err(|e| io(e.source, e.step))?;
        let mut state = State {
            // Ids start at 1: a lease id 0 on the wire means "inline".
            next_id: 1,
            changes: vec![0; CHANGE_SLOTS],
            ..State::default()
        };
        state.free.insert(0, size);
        Ok(ShmArena {
            map,
            per_session_bytes: (size as u64 / 4).max(PAGE as u64),
            max_sessions: session_cap(),
            state: Mutex::new(state),
            leases: AtomicU64::new(0),
            copies: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            sessions_ended: AtomicU64::new(0),
            device_leases: AtomicU64::new(0),
            device_cap: AtomicU64::new(0),
            device: std::sync::OnceLock::new(),
        })
    }

    /// The arena with at most `n` sessions at once (tests: a descriptor limit's cap).
    pub fn with_max_sessions(mut self, n: usize) -> Self {
        self.max_sessions = n.max(1);
        self
    }

    /// Turns device leases on for a GPU tier of `tier_bytes`: a session may hold a
    /// quarter of it leased at once (the arena's rule: one client cannot pin the tier).
    /// `memory`: the emulated device's memfd (a duplicate the arena keeps), its size
    /// and id, sent to every session; None for CUDA.
    pub fn enable_device_leases(&self, tier_bytes: u64, memory: Option<(OwnedFd, u64, [u8; 16])>) {
        self.device_cap
            .store((tier_bytes / 4).max(1), Ordering::Relaxed);
        if let Some((fd, size, id)) = memory {
            let _ = self.device.set(DeviceMemory { fd, size, id });
        }
    }

    /// Leases a device export of `bytes` to `session`; the export is dropped when the
    /// lease is released or the session ends. None: unknown session, device leases
    /// off, or the session's cap reached (the export is dropped at once).
    pub fn lease_device(
        &self,
        session: SessionId,
        bytes: u64,
        export: Box<dyn Send + Sync>,
    ) -> Option<u64> {
        let cap = self.device_cap.load(Ordering::Relaxed);
        let mut st = self.state.lock();
        let used = st.sessions.get(&session)?.device_bytes;
        if cap == 0 || used + bytes > cap {
            drop(st);
            self.fallbacks.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let id = st.next_id;
        st.next_id += 1;
        st.session_clock += 1;
        let now = st.session_clock;
        let s = st.sessions.get_mut(&session)?;
        s.device_bytes += bytes;
        s.leases.insert(id);
        s.used_at = now;
        st.device_leases.insert(
            id,
            DeviceLease {
                session,
                bytes,
                export,
            },
        );
        drop(st);
        self.device_leases.fetch_add(1, Ordering::Relaxed);
        Some(id)
    }

    pub fn size(&self) -> usize {
        self.map.len()
    }

    /// The memfd clients map.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.map.fd().as_fd()
    }

    /// Starts a session; its leases end with [`Self::close_session`].
    pub fn open_session(&self) -> Result<SessionId> {
        self.open_session_ended().map(|(id, _)| id)
    }

    /// [`Self::open_session`], with what tells the session's connection that the arena
    /// ended it. With [`MAX_SESSIONS`] open, the one unused longest that holds no lease
    /// is ended for the newcomer (black-box finding: 1,100 connections that took their
    /// hello and sat idle, as leaked clients or forked workers holding the socket do,
    /// refused every new shared-memory client for good). Its client attaches again at
    /// its next Get ([`SESSION_ENDED`]). Only sessions all holding leases refuse one.
    pub fn open_session_ended(&self) -> Result<(SessionId, Arc<tokio::sync::Notify>)> {
        let mut raw = [0u8; 16];
        getrandom(&mut raw)?;
        let id = u128::from_le_bytes(raw);
        let mut st = self.state.lock();
        st.session_clock += 1;
        let now = st.session_clock;
        if st.sessions.len() >= self.max_sessions {
            let idle = st
                .sessions
                .iter()
                .filter(|(_, s)| s.leases.is_empty())
                .min_by_key(|(_, s)| s.used_at)
                .map(|(&id, _)| id);
            let Some(victim) = idle else {
                return Err(KvError::Busy(format!(
                    "all {} shared-memory sessions (the most under this daemon's \
                     descriptor limit) hold leases; use the socket",
                    self.max_sessions
                )));
            };
            if let Some(s) = st.sessions.remove(&victim) {
                s.ended.notify_one();
            }
            self.sessions_ended.fetch_add(1, Ordering::Relaxed);
        }
        let ended = Arc::new(tokio::sync::Notify::new());
        st.sessions.insert(
            id,
            Session {
                used_at: now,
                ended: ended.clone(),
                ..Session::default()
            },
        );
        Ok((id, ended))
    }

    /// Ends a session, releasing every lease it still holds.
    pub fn close_session(&self, id: SessionId) {
        let mut st = self.state.lock();
        let mut exports = Vec::new();
        if let Some(s) = st.sessions.remove(&id) {
            for lease in s.leases {
                match st.device_leases.remove(&lease) {
                    Some(d) => exports.push(d.export),
                    None => release_locked(&mut st, lease),
                }
            }
        }
        drop(st);
        // Freeing device memory may be a driver call: outside the lock.
        drop(exports);
    }

    pub fn has_session(&self, id: SessionId) -> bool {
        self.state.lock().sessions.contains_key(&id)
    }

    /// Releases one lease of `session` (unknown ids, or another session's, are ignored).
    pub fn release(&self, session: SessionId, lease: u64) {
        let mut st = self.state.lock();
        if st.device_leases.get(&lease).map(|d| d.session) == Some(session) {
            let d = st.device_leases.remove(&lease);
            if let (Some(d), Some(s)) = (&d, st.sessions.get_mut(&session)) {
                s.leases.remove(&lease);
                s.call_of.remove(&lease);
                s.device_bytes = s.device_bytes.saturating_sub(d.bytes);
            }
            drop(st);
            // The export (and maybe the device memory) goes here, outside the lock.
            drop(d);
            return;
        }
        if st.leases.get(&lease).map(|(s, _)| *s) != Some(session) {
            return;
        }
        let len = st
            .leases
            .get(&lease)
            .and_then(|(_, e)| st.entries.get(e))
            .map_or(0, |e| e.span as u64);
        if let Some(s) = st.sessions.get_mut(&session) {
            s.leases.remove(&lease);
            s.call_of.remove(&lease);
            s.bytes = s.bytes.saturating_sub(len);
        }
        release_locked(&mut st, lease);
    }

    /// Leases `ids` answer the client's call `call`: released at once if the client has
    /// given that call up already, else when it does ([`Self::abandon`]).
    pub fn answered(&self, session: SessionId, call: u64, ids: &[u64]) {
        let gone = {
            let mut st = self.state.lock();
            let Some(s) = st.sessions.get_mut(&session) else {
                return;
            };
            if s.abandoned.contains(&call) {
                true
            } else {
                for &id in ids {
                    if s.leases.contains(&id) {
                        s.call_of.insert(id, call);
                    }
                }
                false
            }
        };
        if gone {
            for &id in ids {
                self.release(session, id);
            }
        }
    }

    /// The client gave up its call `call` (it never got the answer): the leases that
    /// answered it are released, and any answering it later.
    pub fn abandon(&self, session: SessionId, call: u64) {
        let ids: Vec<u64> = {
            let mut st = self.state.lock();
            let Some(s) = st.sessions.get_mut(&session) else {
                return;
            };
            if s.abandoned.len() >= ABANDONED_KEPT {
                s.abandoned.pop_front();
            }
            s.abandoned.push_back(call);
            s.call_of
                .iter()
                .filter(|(_, c)| **c == call)
                .map(|(&id, _)| id)
                .collect()
        };
        for id in ids {
            self.release(session, id);
        }
    }

    /// Drops the arena's copy of `key` and counts a change of it: called before every
    /// store of the key and at its removal (see the module doc). Leased ranges stay
    /// valid until released.
    pub fn forget(&self, key: &CacheKey) {
        let mut st = self.state.lock();
        let slot = change_slot(key);
        st.changes[slot] = st.changes[slot].wrapping_add(1);
        if let Some(id) = st.by_key.remove(key) {
            detach_locked(&mut st, id);
        }
    }

    /// The change count of `key`, to note before fetching its block from this node's
    /// tiers and give to [`ShmArena::lease`].
    pub fn changes(&self, key: &CacheKey) -> u64 {
        self.state.lock().changes[change_slot(key)]
    }

    /// Leases `data`, the bytes of `key`, to `session`: from the arena's copy of the key
    /// when it has one and `data` came from this node's tiers, else copied in; the copy
    /// becomes the key's when `data` came from this node's tiers after `local_since`
    /// (the key's [`ShmArena::changes`] noted before the fetch) and no change came
    /// since. `local_since` None: `data` came from elsewhere (a peer), and is leased
    /// from a copy of its own. None: fall back to inline bytes (unknown session, its
    /// cap reached, or no room the eviction of unleased entries could make).
    pub fn lease(
        &self,
        session: SessionId,
        key: &CacheKey,
        data: &Bytes,
        local_since: Option<u64>,
    ) -> Option<Lease> {
        let len = data.len();
        if len == 0 || len > self.map.len() {
            return None;
        }
        let span = len.div_ceil(PAGE) * PAGE;
        let (lease, entry_id, fresh) = {
            let mut st = self.state.lock();
            let session_bytes = st.sessions.get(&session)?.bytes;
            // Counted in whole pages, as the arena holds them: tiny blocks cannot let a
            // session occupy more of the arena than its share.
            if session_bytes + span as u64 > self.per_session_bytes {
                drop(st);
                self.fallbacks.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            // A keyed copy holds the key's value since its last change (any later one
            // dropped it), and this node's tiers hold the same until the next change.
            let existing = local_since.and(st.by_key.get(key).copied());
            let reuse = existing.filter(|id| st.entries.get(id).is_some_and(|e| e.len == len));
            let (entry_id, fresh) = match reuse {
                Some(id) => (id, false),
                None => {
                    if let Some(old) = existing {
                        // Cannot be (values are immutable while held); not trusted.
                        st.by_key.remove(key);
                        detach_locked(&mut st, old);
                    }
                    let Some(offset) = allocate_locked(&mut st, span) else {
                        drop(st);
                        self.fallbacks.fetch_add(1, Ordering::Relaxed);
                        return None;
                    };
                    let id = st.next_id;
                    st.next_id += 1;
                    // Keyless until filled: nobody else can be handed this range yet.
                    st.entries.insert(
                        id,
                        Entry {
                            key: None,
                            offset,
                            span,
                            len,
                            refs: 0,
                            idle_tick: None,
                        },
                    );
                    (id, true)
                }
            };
            let lease_id = st.next_id;
            st.next_id += 1;
            let e = st.entries.get_mut(&entry_id)?;
            e.refs += 1;
            let offset = e.offset as u64;
            if let Some(t) = e.idle_tick.take() {
                st.idle.remove(&t);
            }
            st.leases.insert(lease_id, (session, entry_id));
            st.session_clock += 1;
            let now = st.session_clock;
            let s = st.sessions.get_mut(&session)?;
            s.leases.insert(lease_id);
            s.bytes += span as u64;
            s.used_at = now;
            (
                Lease {
                    id: lease_id,
                    offset,
                    len: len as u64,
                },
                entry_id,
                fresh,
            )
        };
        if fresh {
            // SAFETY: [offset, offset + len) lies inside the mapping (allocated from
            // its free list) and belongs to this entry alone: it was free, and the
            // entry is not findable by key until the copy is done, so nothing reads or
            // writes it concurrently (clients map the arena read-only).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    self.map.base().as_ptr().add(lease.offset as usize),
                    len,
                );
            }
            self.copies.fetch_add(1, Ordering::Relaxed);
            let mut st = self.state.lock();
            let unchanged = local_since == Some(st.changes[change_slot(key)]);
            if unchanged && !st.by_key.contains_key(key) {
                if let Some(e) = st.entries.get_mut(&entry_id) {
                    e.key = Some(key.clone());
                    st.by_key.insert(key.clone(), entry_id);
                }
            }
        }
        self.leases.fetch_add(1, Ordering::Relaxed);
        Some(lease)
    }

    pub fn stats(&self) -> ShmStats {
        let st = self.state.lock();
        ShmStats {
            sessions: st.sessions.len() as u64,
            sessions_ended: self.sessions_ended.load(Ordering::Relaxed),
            leases: self.leases.load(Ordering::Relaxed),
            copies: self.copies.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            leased_bytes: st.sessions.values().map(|s| s.bytes).sum(),
            device_leases: self.device_leases.load(Ordering::Relaxed),
            device_leased_bytes: st.sessions.values().map(|s| s.device_bytes).sum(),
        }
    }

    /// The bytes at a lease's range, as a client would read them (tests).
    #[cfg(test)]
    fn read(&self, lease: &Lease) -> Vec<u8> {
        // SAFETY: a leased range inside the mapping; its bytes are not rewritten
        // while the lease is held.
        unsafe {
            std::slice::from_raw_parts(
                self.map.base().as_ptr().add(lease.offset as usize),
                lease.len as usize,
            )
            .to_vec()
        }
    }
}

fn release_locked(st: &mut State, lease: u64) {
    let Some((_, entry_id)) = st.leases.remove(&lease) else {
        return;
    };
    let Some(e) = st.entries.get_mut(&entry_id) else {
        return;
    };
    e.refs = e.refs.saturating_sub(1);
    if e.refs > 0 {
        return;
    }
    if e.key.is_none() {
        free_entry_locked(st, entry_id);
    } else {
        st.tick += 1;
        let t = st.tick;
        if let Some(e) = st.entries.get_mut(&entry_id) {
            e.idle_tick = Some(t);
        }
        st.idle.insert(t, entry_id);
    }
}

/// Unlinks an entry from its key; frees it now if nobody holds it.
fn detach_locked(st: &mut State, id: u64) {
    let Some(e) = st.entries.get_mut(&id) else {
        return;
    };
    e.key = None;
    if e.refs == 0 {
        free_entry_locked(st, id);
    }
}

fn free_entry_locked(st: &mut State, id: u64) {
    let Some(e) = st.entries.remove(&id) else {
        return;
    };
    if let Some(t) = e.idle_tick {
        st.idle.remove(&t);
    }
    if let Some(k) = &e.key {
        if st.by_key.get(k) == Some(&id) {
            st.by_key.remove(k);
        }
    }
    free_range_locked(st, e.offset, e.span);
}

fn free_range_locked(st: &mut State, mut offset: usize, mut len: usize) {
    // Coalesce with the free neighbours on both sides.
    if let Some((&prev, &plen)) = st.free.range(..offset).next_back() {
        if prev + plen == offset {
            st.free.remove(&prev);
            offset = prev;
            len += plen;
        }
    }
    if let Some(&next_len) = st.free.get(&(offset + len)) {
        st.free.remove(&(offset + len));
        len += next_len;
    }
    st.free.insert(offset, len);
}

/// First fit; evicts unleased entries (least recently used first) until one fits.
fn allocate_locked(st: &mut State, span: usize) -> Option<usize> {
    loop {
        let fit = st
            .free
            .iter()
            .find(|(_, &l)| l >= span)
            .map(|(&o, &l)| (o, l));
        if let Some((o, l)) = fit {
            st.free.remove(&o);
            if l > span {
                st.free.insert(o + span, l - span);
            }
            return Some(o);
        }
        let (_, victim) = st.idle.pop_first()?;
        if let Some(e) = st.entries.get_mut(&victim) {
            e.idle_tick = None;
        }
        free_entry_locked(st, victim);
    }
}

fn getrandom(buf: &mut [u8]) -> Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|e| KvError::Cache(strata_cache_core::CacheError::Io(e)))
}

/// Parses a session id sent as 32 hex digits.
pub fn parse_session(s: &str) -> Option<SessionId> {
    if s.len() != 32 {
        return None;
    }
    u128::from_str_radix(s, 16).ok()
}

/// Serves the side socket until `shutdown`: each connection gets a session, the memfd
/// (SCM_RIGHTS; the emulated device's memfd second when there is one) and a hello
/// (session id as 16 bytes LE, arena size as u64 LE, device memory size as u64 LE (0:
/// none), then the device memory's 16-byte id when there is one), then sends lease ids
/// (u64 LE) to release; closing it ends the session.
pub async fn serve_side_socket(
    listener: UnixListener,
    arena: Arc<ShmArena>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let arena = arena.clone();
                    tokio::spawn(async move {
                        if let Err(e) = session(stream, &arena).await {
                            tracing::debug!(error = %e, "shared-memory session ended");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "shared-memory socket accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// What a newcomer is sent, with no descriptor, when every session holds leases, so
/// its client can say why (black-box finding: it reported "bad hello ... 0 bytes, 0
/// descriptors"). Shorter than a hello, so a client reads it whole.
pub const REFUSED_SESSIONS_FULL: &[u8] = b"strata-shm refused: sessions full";

async fn session(mut stream: UnixStream, arena: &ShmArena) -> std::io::Result<()> {
    let (id, ended) = match arena.open_session_ended() {
        Ok(opened) => opened,
        Err(e) => {
            use tokio::io::AsyncWriteExt;
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(1),
                stream.write_all(REFUSED_SESSIONS_FULL),
            )
            .await;
            return Err(std::io::Error::other(e.to_string()));
        }
    };
    // Released whatever happens below.
    struct Close<'a>(&'a ShmArena, SessionId);
    impl Drop for Close<'_> {
        fn drop(&mut self) {
            self.0.close_session(self.1);
        }
    }
    let _close = Close(arena, id);
    let mut hello = Vec::with_capacity(HELLO_BYTES + 16);
    hello.extend_from_slice(&id.to_le_bytes());
    hello.extend_from_slice(&(arena.size() as u64).to_le_bytes());
    let mut fds = vec![arena.fd().as_raw_fd()];
    match arena.device.get() {
        Some(d) => {
            hello.extend_from_slice(&d.size.to_le_bytes());
            hello.extend_from_slice(&d.id);
            fds.push(d.fd.as_raw_fd());
        }
        None => hello.extend_from_slice(&0u64.to_le_bytes()),
    }
    loop {
        stream.writable().await?;
        let sent = stream.try_io(tokio::io::Interest::WRITABLE, || {
            nix::sys::socket::sendmsg::<()>(
                stream.as_raw_fd(),
                &[std::io::IoSlice::new(&hello)],
                &[nix::sys::socket::ControlMessage::ScmRights(&fds)],
                nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(std::io::Error::from)
        });
        match sent {
            Ok(n) if n == hello.len() => break,
            Ok(n) => return Err(std::io::Error::other(format!("short hello: {n} bytes"))),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    let mut buf = [0u8; 8];
    loop {
        tokio::select! {
            // Ended by the arena for a newcomer: the connection closes.
            _ = ended.notified() => return Ok(()),
            read = stream.read_exact(&mut buf) => match read {
                Ok(_) => match u64::from_le_bytes(buf) {
                    m if m & ABANDON_BIT != 0 => arena.abandon(id, m & !ABANDON_BIT),
                    lease => arena.release(id, lease),
                },
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> CacheKey {
        CacheKey::kv("ns", vec![i; 16])
    }

    fn block(n: usize, seed: u8) -> Bytes {
        Bytes::from(
            (0..n)
                .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn a_hot_block_is_copied_once_and_served_by_reference() {
        let a = ShmArena::new(1 << 20).expect("arena");
        let s = a.open_session().expect("session");
        let b = block(100_000, 1);
        let seen = a.changes(&key(1));
        let l1 = a.lease(s, &key(1), &b, Some(seen)).expect("lease");
        assert_eq!(a.read(&l1), b.to_vec());
        // Another buffer of the same bytes (read from disk): the same copy.
        let b_again = Bytes::copy_from_slice(&b);
        let l2 = a
            .lease(s, &key(1), &b_again, Some(a.changes(&key(1))))
            .expect("again");
        assert_eq!(
            (l2.offset, a.stats().copies),
            (l1.offset, 1),
            "no second copy"
        );
        a.release(s, l1.id);
        a.release(s, l2.id);
        // The key is put again with other bytes (after an eviction): the store drops
        // the copy first, and the next Get copies afresh, never the stale one.
        a.forget(&key(1));
        let b2 = block(100_000, 2);
        let l3 = a
            .lease(s, &key(1), &b2, Some(a.changes(&key(1))))
            .expect("fresh");
        assert_eq!(a.read(&l3), b2.to_vec());
        assert_eq!(a.stats().copies, 2);
        let l4 = a
            .lease(s, &key(1), &b2, Some(a.changes(&key(1))))
            .expect("reused");
        assert_eq!((l4.offset, a.stats().copies), (l3.offset, 2));
    }

    /// A Get that fetched the old bytes before a store of new ones (the key evicted and
    /// put again meanwhile) serves its own bytes, but its copy does not become the
    /// key's: the next Get, of the new bytes, is not handed the old ones. Nor does a
    /// block fetched from a peer become the key's copy, nor is it served from one.
    #[test]
    fn a_copy_made_across_a_change_is_never_reused() {
        let a = ShmArena::new(1 << 20).expect("arena");
        let s = a.open_session().expect("session");
        let old = block(50_000, 1);
        let new = block(50_000, 2);
        let seen = a.changes(&key(1));
        a.forget(&key(1)); // the new bytes are stored
        let l1 = a.lease(s, &key(1), &old, Some(seen)).expect("lease");
        assert_eq!(a.read(&l1), old.to_vec(), "its own bytes");
        let l2 = a
            .lease(s, &key(1), &new, Some(a.changes(&key(1))))
            .expect("lease");
        assert_eq!(a.read(&l2), new.to_vec(), "not the old copy");
        assert_eq!(a.stats().copies, 2);
        let remote = block(50_000, 3);
        let l3 = a.lease(s, &key(1), &remote, None).expect("lease");
        assert_eq!(a.read(&l3), remote.to_vec(), "a peer's bytes, copied");
        let l4 = a
            .lease(s, &key(1), &new, Some(a.changes(&key(1))))
            .expect("lease");
        assert_eq!((l4.offset, a.read(&l4)), (l2.offset, new.to_vec()));
        for l in [l1, l2, l3, l4] {
            a.release(s, l.id);
        }
        let st = a.state.lock();
        assert_eq!(st.entries.len(), 1, "only the key's copy stays");
    }

    /// The arena holds no buffer of the engine's: a block the engine dropped is freed
    /// whatever the arena keeps of it.
    #[test]
    fn the_arena_keeps_no_engine_buffer_alive() {
        let a = ShmArena::new(1 << 20).expect("arena");
        let s = a.open_session().expect("session");
        let b = block(100_000, 4);
        let l = a
            .lease(s, &key(4), &b, Some(a.changes(&key(4))))
            .expect("lease");
        a.release(s, l.id);
        assert!(b.is_unique(), "the arena holds no reference to the buffer");
    }

    #[test]
    fn leased_ranges_are_never_reused_and_caps_fall_back() {
        // 1 MiB arena; one session may lease 256 KiB at once.
        let a = ShmArena::new(1 << 20).expect("arena");
        let s1 = a.open_session().expect("s1");
        let blocks: Vec<Bytes> = (0..4).map(|i| block(250 << 10, i)).collect();
        let l0 = a.lease(s1, &key(0), &blocks[0], Some(0)).expect("first");
        assert!(
            a.lease(s1, &key(1), &blocks[1], Some(0)).is_none(),
            "past the session's quarter of the arena"
        );
        // Other sessions fill the rest; the arena then has no room while all is leased.
        let mut held = Vec::new();
        for i in 1..4u8 {
            let s = a.open_session().expect("session");
            held.push((
                s,
                a.lease(s, &key(i), &blocks[i as usize], Some(0))
                    .expect("fits"),
            ));
        }
        let s5 = a.open_session().expect("s5");
        assert!(
            a.lease(s5, &key(9), &block(250 << 10, 9), Some(0))
                .is_none(),
            "all leased"
        );
        assert!(a.stats().fallbacks >= 2);
        for (i, (_, l)) in held.iter().enumerate() {
            assert_eq!(a.read(l), blocks[i + 1].to_vec(), "untouched while leased");
        }
        assert_eq!(a.read(&l0), blocks[0].to_vec());
        // A session that ends releases its leases: its range can be reused.
        a.close_session(held[0].0);
        let l9 = a
            .lease(s5, &key(9), &block(250 << 10, 9), Some(0))
            .expect("room now");
        assert_eq!(a.read(&l9), block(250 << 10, 9).to_vec());
        assert_eq!(
            a.read(&l0),
            blocks[0].to_vec(),
            "still leased, still intact"
        );
    }

    /// Black-box finding: 1,100 connections that took their hello and sat idle refused
    /// every new shared-memory client for good. A full arena ends the session unused
    /// longest that holds no lease; sessions that all hold leases refuse a newcomer.
    /// Black-box finding (round 14): under a 512 descriptor limit, 512 idle sessions
    /// took every descriptor and the KV service stopped serving. The cap follows the
    /// limit: past it, the longest idle session ends for a newcomer.
    #[test]
    fn sessions_are_capped_by_the_descriptor_limits_share() {
        assert!(session_cap() <= MAX_SESSIONS);
        assert!(session_cap() <= crate::accept::process_connection_cap());
        let a = ShmArena::new(1 << 20).expect("arena").with_max_sessions(8);
        let first = a.open_session().expect("open");
        for _ in 1..8 {
            a.open_session().expect("open");
        }
        a.open_session().expect("room made");
        assert!(!a.has_session(first), "the longest idle one ended");
        assert_eq!(a.state.lock().sessions.len(), 8);
    }

    #[test]
    fn a_full_arena_ends_its_longest_idle_session_for_a_newcomer() {
        let a = ShmArena::new(8 << 20)
            .expect("arena")
            .with_max_sessions(MAX_SESSIONS);
        let busy = a.open_session().expect("busy");
        a.lease(busy, &key(0), &block(1024, 0), Some(0))
            .expect("lease");
        let (oldest, ended) = a.open_session_ended().expect("oldest idle");
        let rest: Vec<SessionId> = (2..MAX_SESSIONS)
            .map(|_| a.open_session().expect("open"))
            .collect();
        // The oldest idle one is used again: the next oldest is ended instead.
        let reused = a
            .lease(oldest, &key(1), &block(1024, 1), Some(0))
            .expect("lease");
        a.release(oldest, reused.id);
        a.open_session().expect("room made");
        assert!(a.has_session(busy), "a session holding a lease stays");
        assert!(a.has_session(oldest), "used since: not the longest idle");
        assert!(!a.has_session(rest[0]), "the longest idle one ended");
        assert!(futures::FutureExt::now_or_never(ended.notified()).is_none());
        assert_eq!(a.stats().sessions, MAX_SESSIONS as u64);
        assert_eq!(a.stats().sessions_ended, 1);
        // Every session holding a lease: a newcomer is refused.
        let all: Vec<SessionId> = a.state.lock().sessions.keys().copied().collect();
        for (i, s) in all.iter().enumerate() {
            let k = CacheKey::kv("full", (i as u32).to_le_bytes().to_vec());
            if !a.state.lock().sessions[s].leases.is_empty() {
                continue;
            }
            a.lease(*s, &k, &block(100, 7), Some(0)).expect("lease");
        }
        assert!(a.open_session().is_err(), "every session holds a lease");
    }

    /// Black-box finding: the leases of Gets whose caller timed out were never released
    /// (it never learnt their ids). A client gives the call up by its number: the leases
    /// answering it go back, also those of an answer built after it gave up.
    #[test]
    fn leases_of_an_abandoned_call_are_released_before_or_after_the_answer() {
        let a = ShmArena::new(1 << 20).expect("arena");
        let s = a.open_session().expect("s");
        let l1 = a
            .lease(s, &key(1), &block(5000, 1), Some(0))
            .expect("lease");
        let l2 = a
            .lease(s, &key(2), &block(5000, 2), Some(0))
            .expect("lease");
        let kept = a
            .lease(s, &key(3), &block(5000, 3), Some(0))
            .expect("lease");
        a.answered(s, 7, &[l1.id, l2.id]);
        a.answered(s, 8, &[kept.id]);
        a.abandon(s, 7);
        assert_eq!(a.stats().leased_bytes, 8192, "only call 8's lease is left");
        // Given up before its answer was built.
        a.abandon(s, 9);
        let late = a
            .lease(s, &key(4), &block(5000, 4), Some(0))
            .expect("lease");
        a.answered(s, 9, &[late.id]);
        assert_eq!(a.stats().leased_bytes, 8192);
        a.release(s, kept.id);
        assert_eq!(a.stats().leased_bytes, 0);
    }

    /// Black-box finding (round 11): with every session holding a lease, a newcomer's
    /// client reported "bad hello ... 0 bytes, 0 descriptors". It is told why.
    #[tokio::test]
    async fn a_newcomer_refused_for_want_of_sessions_is_told_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kv-shm.sock");
        let a = Arc::new(ShmArena::new(1 << 20).expect("arena"));
        for i in 0..MAX_SESSIONS {
            let s = a.open_session().expect("session");
            assert!(a
                .lease(s, &key((i % 200) as u8), &block(16, 1), Some(0))
                .is_some());
        }
        let listener = UnixListener::bind(&path).expect("bind");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve_side_socket(listener, a.clone(), async {
            let _ = stopped.await;
        }));
        let e = crate::shm_client::ShmClient::connect(&path)
            .await
            .err()
            .expect("refused");
        assert!(e.to_string().contains("hold leases"), "{e}");
        let _ = stop.send(());
        served.await.expect("joins");
    }

    #[test]
    fn a_session_of_tiny_blocks_is_held_to_its_share_in_pages() {
        // 1 MiB arena: a session may hold 256 KiB of pages, i.e. 64 one-page blocks,
        // however small the blocks are.
        let a = ShmArena::new(1 << 20).expect("arena");
        let s = a.open_session().expect("s");
        let more: Vec<_> = (1..MAX_SESSIONS).map(|_| a.open_session()).collect();
        assert!(more.iter().all(Result::is_ok));
        let leased = (0..100u8)
            .filter(|i| a.lease(s, &key(*i), &block(1024, *i), Some(0)).is_some())
            .count();
        assert_eq!(leased, 64);
        assert_eq!(a.stats().leased_bytes, 256 << 10);
    }

    #[test]
    fn forget_and_release_return_all_space() {
        let a = ShmArena::new(1 << 20).expect("arena");
        let s = a.open_session().expect("s");
        let ls: Vec<Lease> = (0..3)
            .map(|i| {
                a.lease(s, &key(i), &block(50_000, i), Some(0))
                    .expect("lease")
            })
            .collect();
        a.forget(&key(1));
        for l in &ls {
            a.release(s, l.id);
        }
        a.forget(&key(0));
        a.forget(&key(2));
        let st = a.state.lock();
        assert!(st.entries.is_empty() && st.by_key.is_empty() && st.idle.is_empty());
        assert_eq!(st.free.len(), 1, "coalesced back into one range");
        assert_eq!(st.free.get(&0), Some(&(1 << 20)));
    }

    #[test]
    fn device_leases_hold_their_export_until_released_or_the_session_ends() {
        let a = ShmArena::new(1 << 20).expect("arena");
        let s = a.open_session().expect("session");
        let export = Arc::new(());
        let hold = || Box::new(export.clone()) as Box<dyn Send + Sync>;
        assert!(a.lease_device(s, 10, hold()).is_none(), "off until enabled");
        a.enable_device_leases(4000, None);
        let l1 = a.lease_device(s, 600, hold()).expect("fits");
        let _l2 = a.lease_device(s, 400, hold()).expect("fits");
        assert!(
            a.lease_device(s, 1, hold()).is_none(),
            "a quarter of 4000 per session"
        );
        assert_eq!(Arc::strong_count(&export), 3);
        a.release(s ^ 1, l1);
        assert_eq!(
            Arc::strong_count(&export),
            3,
            "another session's release is ignored"
        );
        a.release(s, l1);
        assert_eq!(Arc::strong_count(&export), 2);
        assert_eq!(a.stats().device_leased_bytes, 400);
        a.close_session(s);
        assert_eq!(
            Arc::strong_count(&export),
            1,
            "the session's end drops its exports"
        );
        assert_eq!(
            (a.stats().device_leases, a.stats().device_leased_bytes),
            (2, 0)
        );
    }

    #[tokio::test]
    async fn a_client_receives_the_memfd_and_its_session_ends_on_disconnect() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kv-shm.sock");
        let arena = Arc::new(ShmArena::new(1 << 20).expect("arena"));
        let listener = UnixListener::bind(&path).expect("bind");
        let stop = tokio_util_stop();
        let server = tokio::spawn(serve_side_socket(listener, arena.clone(), stop.1));
        let client = crate::shm_client::ShmClient::connect(&path)
            .await
            .expect("attach");
        assert_eq!(client.size(), 1 << 20);
        assert!(arena.has_session(client.session()));
        let b = block(10_000, 3);
        let l = arena
            .lease(client.session(), &key(3), &b, Some(0))
            .expect("lease");
        assert_eq!(client.read(l.offset, l.len).expect("in range"), &b[..]);
        client.release(l.id).await.expect("release");
        let session = client.session();
        drop(client);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while arena.has_session(session) {
            assert!(
                std::time::Instant::now() < deadline,
                "session ends on close"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let _ = stop.0.send(());
        server.await.expect("server task");
    }

    fn tokio_util_stop() -> (
        tokio::sync::oneshot::Sender<()>,
        impl std::future::Future<Output = ()>,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        (tx, async move {
            let _ = rx.await;
        })
    }
}
