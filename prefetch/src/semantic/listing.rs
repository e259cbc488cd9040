//! Directory listings handed to the predictor (the mount already lists directories for
//! `readdir`), grouped into *member sets*: all listed files sharing one template.
//!
//! A member set is what a per-epoch permutation ranges over ("some unread file of this
//! set") and what lexical order walks: members are ordered by (directory, name), the
//! order of a listing, so walking them crosses from `train/n01440764/` into
//! `train/n01443537/` the way a name-ordered reader does.
//!
//! Members get stable ids in insertion order; the sorted order is rebuilt lazily after a
//! listing adds members, so trackers that index by id survive new listings.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use strata_types::FxBuild;

use super::tokenize::{tokenize_shared, DirScan, TokenizedPath};

/// Tokenized paths [`ListingIndex::tokenize`] remembers: 64Ki (a few MiB; the listing
/// itself may hold 4M entries). When full the memo starts over.
const MAX_TOKENIZED: usize = 1 << 16;

/// Directories remembered as listed: 65,536, then forgotten all at once (as
/// `tokenized`): a forgotten one only makes `exists` say "unknown" until it is listed
/// again. Black-box finding: the set grew by one per distinct name ever looked up, for
/// good (~300 B each; a million missing names probed, 300 MB).
const MAX_LISTED_DIRS: usize = 1 << 16;

/// All listed files of one template.
#[derive(Debug, Default)]
pub struct MemberSet {
    paths: Vec<Arc<str>>,
    /// Size in bytes, 0 when the listing did not say.
    sizes: Vec<u64>,
    /// Per member: byte offset of its last `/` (`NO_SLASH`: none), so the (directory,
    /// name) order is compared without searching the path again.
    slash: Vec<u32>,
    ids: HashMap<Arc<str>, u32, FxBuild>,
    /// Member ids in (directory, name) order; valid when `!dirty`.
    order: Vec<u32>,
    /// Position of each id in `order`.
    rank: Vec<u32>,
    dirty: bool,
}

impl MemberSet {
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    pub fn id(&self, path: &str) -> Option<u32> {
        self.ids.get(path).copied()
    }

    pub fn path(&self, id: u32) -> &Arc<str> {
        &self.paths[id as usize]
    }

    pub fn size(&self, id: u32) -> u64 {
        self.sizes[id as usize]
    }

    /// Position of `id` in listing order.
    pub fn rank(&self, id: u32) -> usize {
        self.rank[id as usize] as usize
    }

    /// Member at listing position `rank`.
    pub fn at_rank(&self, rank: usize) -> Option<u32> {
        self.order.get(rank).copied()
    }

    #[cfg(test)]
    fn insert(&mut self, path: Arc<str>, size: u64) {
        match self.ids.entry(path) {
            Entry::Occupied(e) => {
                if size > 0 {
                    self.sizes[*e.get() as usize] = size;
                }
            }
            Entry::Vacant(e) => {
                let path = e.key().clone();
                e.insert(self.paths.len() as u32);
                self.push(path, size);
            }
        }
    }

    /// Adds member `path`, whose id (`self.len()` before the call) `ids` already holds.
    fn push(&mut self, path: Arc<str>, size: u64) {
        self.slash.push(
            path.as_bytes()
                .iter()
                .rposition(|&b| b == b'/')
                .map_or(NO_SLASH, |i| i as u32),
        );
        self.paths.push(path);
        self.sizes.push(size);
        self.dirty = true;
    }

    /// Brings `order` and `rank` up to date. Ids are assigned in insertion order and
    /// `order` holds every id below its length, so only the members added since the
    /// last rebuild are sorted, then merged into the sorted order: O(k log k + n) per
    /// rebuild instead of sorting all n members (with two `String`s each) again. The
    /// replay hands a listing per directory at the first read in it, so a shuffled
    /// loader over a thousand directories rebuilt its set a thousand times: 20% of a
    /// replay's time on `train-small-files` went to that sort. Paths in a set are
    /// unique, so the (directory, name) order has no ties.
    fn rebuild(&mut self) {
        if !self.dirty {
            return;
        }
        // `path.rsplit_once('/').unwrap_or(("", path))`, from the offset kept per member.
        let (paths, slash) = (&self.paths, &self.slash);
        let key = |id: u32| -> (&str, &str) {
            let p: &str = &paths[id as usize];
            match slash[id as usize] {
                NO_SLASH => ("", p),
                i => (&p[..i as usize], &p[i as usize + 1..]),
            }
        };
        let mut fresh: Vec<u32> = (self.order.len() as u32..paths.len() as u32).collect();
        fresh.sort_unstable_by(|&a, &b| key(a).cmp(&key(b)));
        // Each fresh member goes where a binary search over the old order puts it (paths
        // are unique, so there are no ties and this is the order a full merge gives);
        // the old members between two insertion points are copied as a run. That is
        // O(k log n) comparisons instead of O(n) (each splits two paths at their last
        // `/`), and ranks change only from the first insertion point on: a replay that
        // lists a thousand directories of one set one by one rebuilt it a thousand times.
        let old = std::mem::take(&mut self.order);
        let mut merged = Vec::with_capacity(paths.len());
        let mut i = 0;
        // Where the first fresh member went: the order before it is unchanged.
        let mut first_changed = None;
        for &f in &fresh {
            let kf = key(f);
            let at = i + old[i..].partition_point(|&o| key(o) < kf);
            first_changed.get_or_insert(at);
            merged.extend_from_slice(&old[i..at]);
            merged.push(f);
            i = at;
        }
        merged.extend_from_slice(&old[i..]);
        self.order = merged;
        self.rank.resize(self.order.len(), 0);
        let from = first_changed.unwrap_or(old.len());
        for (r, &id) in self.order.iter().enumerate().skip(from) {
            self.rank[id as usize] = r as u32;
        }
        self.dirty = false;
    }
}

/// `MemberSet::slash` of a path without `/`.
const NO_SLASH: u32 = u32::MAX;

/// Dirty sets [`ListingIndex::prepare`] scans for its template before it looks the set
/// up instead: 8.
const DIRTY_SCAN: usize = 8;

/// Every listing seen, grouped by template.
#[derive(Debug, Default)]
pub struct ListingIndex {
    sets: HashMap<Arc<str>, MemberSet, FxBuild>,
    /// Tokenized paths by their text (see [`Self::tokenize`]): every listed entry is
    /// tokenized to find its set, and the predictor tokenizes each file it sees read,
    /// mostly listed ones (a shuffled loader's every access is a new file).
    tokenized: HashMap<Arc<str>, TokenizedPath, FxBuild>,
    listed_dirs: HashSet<Arc<str>, FxBuild>,
    entries: usize,
    max_entries: usize,
    /// [`Self::observe`]'s buffers, kept between listings.
    scan: DirScan,
    /// Templates of the sets with members not yet in their order (`MemberSet::dirty`),
    /// in no order: [`Self::prepare`] (on every access) looks a set up only when its
    /// template is one of them. Listings come once per directory, and a listing of a
    /// directory of directories leaves a set no file access asks for, dirty for good.
    dirty: Vec<Arc<str>>,
}

impl ListingIndex {
    pub fn new(max_entries: usize) -> Self {
        ListingIndex {
            max_entries,
            ..ListingIndex::default()
        }
    }

    /// Records the entries of `dir` (`""` for the root). Entries past `max_entries` in
    /// total are ignored: the index is bounded memory, and a set it cannot hold whole is
    /// still walked by the numeric rules.
    ///
    /// The directory is scanned once and each entry's name after it ([`DirScan`]),
    /// into buffers kept between listings; an entry's tokenization is remembered for
    /// the reads to come ([`Self::tokenize`]) with its set's key as its template (one
    /// `Arc` per set, not one per entry). Tokenizing every whole path (a `String`, two
    /// `Vec`s and an `Arc`, ~3,500 instructions for a 34-byte path) was two thirds of
    /// a listing's cost.
    pub fn observe<S: AsRef<str>>(&mut self, dir: &str, entries: &[(S, u64)]) {
        let dir = dir.trim_end_matches('/');
        if self.listed_dirs.len() >= MAX_LISTED_DIRS && !self.listed_dirs.contains(dir) {
            self.listed_dirs.clear();
        }
        self.listed_dirs.insert(Arc::from(dir));
        self.scan.start(dir);
        let mut joined = String::new();
        for (name, size) in entries {
            let name = name.as_ref();
            if name.is_empty() || name.contains('/') {
                continue;
            }
            let path: Arc<str> = if dir.is_empty() {
                Arc::from(name)
            } else {
                joined.clear();
                joined.push_str(dir);
                joined.push('/');
                joined.push_str(name);
                Arc::from(joined.as_str())
            };
            let key = self.scan.entry(name);
            let template = match self.sets.get_key_value(key) {
                Some((t, _)) => t.clone(),
                // A new set only while the index has room for its first member (sets
                // are bounded with their entries).
                None if self.entries >= self.max_entries => continue,
                None => {
                    let t: Arc<str> = Arc::from(key);
                    self.sets.insert(t.clone(), MemberSet::default());
                    t
                }
            };
            if !self.tokenized.contains_key(&path) {
                if self.tokenized.len() >= MAX_TOKENIZED {
                    self.tokenized.clear();
                }
                let t = self.scan.tokenized(path.clone(), template.clone());
                self.tokenized.insert(path.clone(), t);
            }
            let Some(set) = self.sets.get_mut(&template) else {
                continue;
            };
            // One hash of the path: the entry of an unknown path is filled only while
            // the index has room.
            match set.ids.entry(path) {
                Entry::Occupied(e) => {
                    if *size > 0 {
                        set.sizes[*e.get() as usize] = *size;
                    }
                }
                Entry::Vacant(e) if self.entries < self.max_entries => {
                    self.entries += 1;
                    let path = e.key().clone();
                    e.insert(set.paths.len() as u32);
                    if !set.dirty {
                        self.dirty.push(template.clone());
                    }
                    set.push(path, *size);
                }
                Entry::Vacant(_) => {}
            }
        }
    }

    /// [`Self::tokenize`] into `out`, whose buffers are reused (the predictor's last
    /// tokenized path: two `Vec` allocations and frees fewer per file read).
    pub fn tokenize_into(&mut self, path: &Arc<str>, out: &mut TokenizedPath) {
        match self.tokenized.get(&**path) {
            Some(t) => {
                out.clone_from(t);
                out.path = path.clone();
            }
            None => *out = self.tokenize(path),
        }
    }

    /// `tokenize_shared(path.clone())`, remembered by the path's text (tokenizing is a
    /// pure function of it): a listing tokenizes each of its entries and the predictor
    /// each file read, so a file listed and then read, or read again in a later epoch,
    /// is tokenized once (a `String`, an `Arc` and two `Vec`s, ~3k instructions for a
    /// short path, against a hash lookup and a copy of the fields). The result holds
    /// `path` itself, as a fresh tokenization would.
    pub fn tokenize(&mut self, path: &Arc<str>) -> TokenizedPath {
        if let Some(t) = self.tokenized.get(&**path) {
            let mut t = t.clone();
            t.path = path.clone();
            return t;
        }
        let t = tokenize_shared(path.clone());
        if self.tokenized.len() >= MAX_TOKENIZED {
            self.tokenized.clear();
        }
        self.tokenized.insert(path.clone(), t.clone());
        t
    }

    /// Brings `template`'s listing order up to date (sorting is deferred to first use so
    /// that listing a thousand directories of one dataset sorts once, not a thousand times).
    pub fn prepare(&mut self, template: &str) {
        // Past a few dirty sets the one lookup is cheaper than the scan.
        if self.dirty.len() <= DIRTY_SCAN && !self.dirty.iter().any(|t| **t == *template) {
            return;
        }
        if let Some(set) = self.sets.get_mut(template) {
            if set.dirty {
                set.rebuild();
                self.dirty.retain(|t| **t != *template);
            }
        }
    }

    /// The member set of `template`; its order is valid after [`Self::prepare`].
    pub fn set(&self, template: &str) -> Option<&MemberSet> {
        self.sets
            .get(template)
            .filter(|s| !s.is_empty() && !s.dirty)
    }

    pub fn is_listed(&self, dir: &str) -> bool {
        self.listed_dirs.contains(dir)
    }

    /// `Some(true/false)` when `path`'s directory is listed, `None` when unknown.
    pub fn exists(&self, template: &str, path: &str) -> Option<bool> {
        let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
        if !self.is_listed(dir) {
            return None;
        }
        Some(self.set(template).is_some_and(|s| s.id(path).is_some()))
    }

    /// Listed size of `path`, if known and non-zero.
    pub fn size_of(&self, template: &str, path: &str) -> Option<u64> {
        let set = self.set(template)?;
        let size = set.size(set.id(path)?);
        (size > 0).then_some(size)
    }

    /// [`Self::exists`] and [`Self::size_of`] together, with one lookup of the set and
    /// of the member (the stride walk asks both for every candidate).
    pub fn exists_and_size(&self, template: &str, path: &str) -> (Option<bool>, Option<u64>) {
        let member = self
            .set(template)
            .and_then(|s| s.id(path).map(|id| s.size(id)));
        let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
        let exists = self.is_listed(dir).then_some(member.is_some());
        (exists, member.filter(|&size| size > 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exists_and_size_agrees_with_exists_and_size_of() {
        let mut l = ListingIndex::new(1 << 20);
        l.observe(
            "d",
            &[("f-001.bin", 10u64), ("f-002.bin", 0), ("g-001.txt", 5)],
        );
        l.observe("", &[("top-1.bin", 7u64)]);
        let paths = [
            "d/f-001.bin",
            "d/f-002.bin",
            "d/f-003.bin",
            "d/g-001.txt",
            "e/f-001.bin",
            "top-1.bin",
            "top-2.bin",
        ];
        let mut answers = 0;
        for p in paths {
            let template = tokenize_shared(Arc::from(p)).template;
            l.prepare(&template);
            let both = l.exists_and_size(&template, p);
            assert_eq!(
                both,
                (l.exists(&template, p), l.size_of(&template, p)),
                "{p}"
            );
            answers += usize::from(both.0 == Some(true));
        }
        assert_eq!(answers, 4, "the four listed files exist");
    }

    proptest::proptest! {
        /// Listings added in any order and any batches leave the same (directory, name)
        /// order as sorting all members at once, and `rank` inverts `order`.
        #[test]
        fn incremental_rebuild_matches_a_full_sort(
            batches in proptest::collection::vec(
                proptest::collection::vec((0u8..6, 0u16..40), 0..20), 1..8)
        ) {
            let mut set = MemberSet::default();
            for batch in batches {
                for (d, n) in batch {
                    set.insert(Arc::from(format!("d{d}/f-{n:03}.bin")), 1);
                }
                set.rebuild();
                let mut want: Vec<u32> = (0..set.len() as u32).collect();
                want.sort_by_key(|&id| {
                    let p = set.path(id).to_string();
                    let (d, n) = p.rsplit_once('/').map(|(d, n)| (d.to_owned(), n.to_owned())).unwrap_or_default();
                    (d, n)
                });
                proptest::prop_assert_eq!(&set.order, &want);
                for (r, &id) in set.order.iter().enumerate() {
                    proptest::prop_assert_eq!(set.rank(id), r);
                }
            }
        }
    }

    /// Black-box finding: every distinct name looked up (each absent one listed as an
    /// empty folder) stayed in the index for good. Its directories and sets are bounded.
    #[test]
    fn the_index_is_bounded_however_many_folders_it_sees() {
        let mut idx = ListingIndex::new(1000);
        for i in 0..(MAX_LISTED_DIRS + 10) {
            idx.observe(&format!("missing-{i:08}"), &[] as &[(&str, u64)]);
        }
        assert!(idx.listed_dirs.len() <= MAX_LISTED_DIRS);
        assert!(idx.is_listed(&format!("missing-{:08}", MAX_LISTED_DIRS + 9)));
        for i in 0..5000 {
            let name = format!("file-{i}-x{}.bin", "y".repeat(i % 7));
            idx.observe(&format!("d{i}"), &[(name.as_str(), 1)]);
        }
        assert!(
            idx.entries <= 1000 && idx.sets.len() <= 1000,
            "{}",
            idx.sets.len()
        );
    }
}
