//! Reading a folder: `opendir` takes the shared listing (and what is being written
//! there), `readdir` makes each entry, and numbers its inode, as a read reaches it.

use super::*;

/// An open directory: its path and what its opendir listed. Its entries are made
/// (and their inodes numbered) as readdir reaches them, not at the opendir: a folder
/// of 300,000 names held each entry twice more (an entry with its attributes, an
/// inode) for as long as it was open, ~1.1 KB per name at the peak of one `ls -f`
/// (measured; the listing itself is shared with the listing cache).
pub(super) struct OpenDir {
    pub(super) ino: u64,
    pub(super) path: Arc<str>,
    /// `.` and `..`, offsets 0 and 1.
    pub(super) dots: [Entry; 2],
    pub(super) listing: Arc<Listing>,
    /// Files being written here, sorted by name: shown with their current size over a
    /// listed version of the same name.
    pub(super) written_over: Vec<(String, Meta)>,
    /// What is being written here and was not listed, sorted by name: after the
    /// listed entries.
    pub(super) written_extra: Vec<(String, Meta)>,
    /// The change number before its listing was read ([`FsCore::changing`]).
    pub(super) listed_at: u64,
    /// A read from its start was answered: the next one is a rewind (`rewinddir`).
    pub(super) read_from_start: std::sync::atomic::AtomicBool,
    /// The inodes of the entries its last read handed out: kept by the sweep while
    /// the folder is open, so a program that lists and then stats (`ls -i`, `find`)
    /// finds the numbers it was given.
    pub(super) handed_out: Mutex<Vec<u64>>,
}

impl OpenDir {
    /// Entries besides `.` and `..`.
    pub(super) fn len(&self) -> usize {
        self.listing.entries.len() + self.written_extra.len()
    }

    /// Entry `i` besides `.` and `..` (its offset cookie is `i + 3`).
    pub(super) fn entry(&self, i: usize) -> Option<(&str, &Meta)> {
        let listed = self.listing.entries.len();
        if i >= listed {
            return self
                .written_extra
                .get(i - listed)
                .map(|(n, m)| (n.as_str(), m));
        }
        let (name, meta) = &self.listing.entries[i];
        let meta = match self
            .written_over
            .binary_search_by(|(w, _)| w.as_str().cmp(name))
        {
            Ok(w) => &self.written_over[w].1,
            Err(_) => meta,
        };
        Some((name.as_str(), meta))
    }
}

/// An open directory's entry: `.` or `..` as its opendir answered them, or a listed
/// name's metadata as listed (or being written).
pub(super) enum DotOr<'a> {
    Dot(Entry),
    Listed(&'a Meta),
}

/// The entries of `dir` from cookie `offset` on, at most `max`: (cookie of the entry
/// itself, name, what it is).
pub(super) fn dir_entries(
    dir: &OpenDir,
    offset: u64,
    max: usize,
) -> impl Iterator<Item = (u64, &str, DotOr<'_>)> {
    let end = dir.len() as u64 + 2;
    (offset..end).take(max).filter_map(move |at| match at {
        0 => Some((at, ".", DotOr::Dot(dir.dots[0]))),
        1 => Some((at, "..", DotOr::Dot(dir.dots[1]))),
        _ => dir
            .entry(at as usize - 2)
            .map(|(name, meta)| (at, name, DotOr::Listed(meta))),
    })
}

impl FsCore {
    /// Opens directory `ino`: snapshots its entries (with `.` and `..`) so that the
    /// readdir calls of one pass see one listing, even if the cache expires between them.
    pub async fn opendir(&self, ino: u64) -> Result<u64> {
        let dir = self.snapshot_dir(ino).await?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs.lock().insert(fh, Arc::new(dir));
        self.sweep_inodes();
        Ok(fh)
    }

    /// The listing of directory `ino` as a handle holds it ([`Self::opendir`]).
    pub(super) async fn snapshot_dir(&self, ino: u64) -> Result<OpenDir> {
        let node = self.node(ino)?;
        if node.kind != Kind::Dir {
            return Err(Error::NotDir(node.path.to_string()));
        }
        let listed_at = self.change_seq.load(Ordering::Acquire);
        let listing = self.listing(&node.path).await?;
        let self_entry = self.getattr(ino).await?;
        let parent_ino = match self.parent_of(&node.path) {
            None => ROOT_INO,
            Some(p) => self
                .inodes
                .read()
                .by_path
                .get(p)
                .copied()
                .unwrap_or(ROOT_INO),
        };
        let parent_entry = Entry {
            attr: Attr {
                ino: parent_ino,
                ..self_entry.attr
            },
            ..self_entry
        };
        let mut written = self
            .writes
            .as_ref()
            .map(|w| w.children(&node.path))
            .unwrap_or_default();
        written.sort_by(|a, b| a.0.cmp(&b.0));
        written.dedup_by(|a, b| a.0 == b.0);
        // What is being written here shows its current size over any listed version.
        let (written_over, written_extra) = written.into_iter().partition(|(n, m)| {
            matches!(m, Meta::File(_))
                && listing
                    .entries
                    .binary_search_by(|(e, _)| e.as_str().cmp(n))
                    .is_ok()
        });
        let mut written_extra: Vec<(String, Meta)> = written_extra;
        written_extra.retain(|(n, _)| {
            listing
                .entries
                .binary_search_by(|(e, _)| e.as_str().cmp(n))
                .is_err()
        });
        Ok(OpenDir {
            ino,
            path: node.path.clone(),
            dots: [self_entry, parent_entry],
            listing,
            written_over,
            written_extra,
            listed_at,
            read_from_start: std::sync::atomic::AtomicBool::new(false),
            handed_out: Mutex::new(Vec::new()),
        })
    }

    pub(super) fn open_dir(&self, fh: u64) -> Result<Arc<OpenDir>> {
        self.dirs.lock().get(&fh).cloned().ok_or(Error::BadHandle {
            what: "directory handle",
            id: fh,
        })
    }

    /// The listing handle `fh` reads from `offset`: its snapshot, or a new one at a
    /// read from the start after one was answered (`rewinddir`, and `os.listdir(fd)` or
    /// `scandir(fd)` of an open folder: POSIX has a rewind see the folder as it is
    /// then; black-box finding: such a handle kept showing a removed file and none made
    /// since, also past the TTL).
    pub(super) async fn dir_at(&self, fh: u64, offset: u64) -> Result<Arc<OpenDir>> {
        let dir = self.open_dir(fh)?;
        if offset != 0 || !dir.read_from_start.swap(true, Ordering::AcqRel) {
            return Ok(dir);
        }
        let fresh = Arc::new(self.snapshot_dir(dir.ino).await?);
        fresh.read_from_start.store(true, Ordering::Release);
        let mut dirs = self.dirs.lock();
        // (Not if released meanwhile.)
        if let Some(held) = dirs.get_mut(&fh) {
            *held = fresh.clone();
        }
        Ok(fresh)
    }

    /// Entries of an open directory from cookie `offset` on (at most `max`), as its
    /// opendir listed them (or a rewind, [`Self::dir_at`]): names and inode numbers
    /// (READDIR; the kernel links none).
    pub async fn readdir(&self, fh: u64, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        let dir = self.dir_at(fh, offset).await?;
        let mut out = Vec::new();
        for (at, name, meta) in dir_entries(&dir, offset, max) {
            let entry = match meta {
                DotOr::Dot(e) => e,
                // Gone since it was listed: left out (its cookie stays unused).
                DotOr::Listed(Meta::Missing) => continue,
                DotOr::Listed(meta) => {
                    self.entry_for(&self.child_path(&dir.path, name), meta, false)?
                }
            };
            out.push(DirEntry {
                name: name.to_string(),
                offset: at + 1,
                entry,
            });
        }
        Ok(self.hand_out(&dir, out))
    }

    /// [`Self::readdir`] for READDIRPLUS, whose entries the kernel links into its
    /// dentry cache with their attributes: each is resolved again now, from what the
    /// mount knows without asking the store (a file being written, the attribute
    /// cache). A name removed through the mount since the opendir is left out; one
    /// replaced or renamed over is the inode and attributes its path has now.
    /// Black-box findings: the opendir's snapshot, handed out while a program wrote in
    /// the folder, linked names to inodes the mount had dropped or detached (`open`
    /// after `os.replace` failed EBADF "unknown inode", a create after an unlink failed
    /// EBADF or ENOENT, a removed folder stayed for the TTL), and set a just-uploaded
    /// file's size back to the 0 bytes it had when listed (its read-back was empty).
    pub async fn readdir_plus(&self, fh: u64, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        let dir = self.dir_at(fh, offset).await?;
        let mut out = Vec::new();
        for (at, name, listed) in dir_entries(&dir, offset, max) {
            let listed = match listed {
                DotOr::Dot(e) => {
                    out.push(DirEntry {
                        name: name.to_string(),
                        offset: at + 1,
                        entry: e,
                    });
                    continue;
                }
                DotOr::Listed(meta) => meta,
            };
            let path = self.child_path(&dir.path, name);
            let known = match self.written_meta(&path) {
                Some(m) => Some(m),
                None => self.attrs.get(&path).await,
            };
            let entry = match known {
                Some(Meta::Missing) => continue,
                Some(meta) => self.entry_for(&path, &meta, false)?,
                None => {
                    // Nothing newer known (its attributes expired): the listing's
                    // entry, if this mount has not changed the name since it was
                    // listed and no inode names the path as something else now;
                    // otherwise the name as it is now. Left out instead, a name that
                    // existed throughout (a file saved by rename over it, rewritten,
                    // or read at a newer version) was missing from listings with
                    // `--metadata-ttl 0`, and a folder whose one file was re-saved
                    // listed as ENOENT (black-box finding).
                    if !self.changed_since(&path, dir.listed_at) && self.names_listed(&path, listed)
                    {
                        self.entry_for(&path, listed, false)?
                    } else {
                        match self.meta(&path).await {
                            Ok(Meta::Missing) | Err(_) => continue,
                            Ok(meta) => self.entry_for(&path, &meta, false)?,
                        }
                    }
                }
            };
            // The kernel counts a reference for each entry it is given: counted here,
            // with the inode known to be in the table (the adapter gives back those
            // that did not fit in the reply, [`Self::not_handed_out`]).
            if !self.inodes.write().referenced(entry.attr.ino, 1) {
                continue;
            }
            out.push(DirEntry {
                name: name.to_string(),
                offset: at + 1,
                entry,
            });
        }
        Ok(self.hand_out(&dir, out))
    }

    /// A page of `dir`'s entries as answered: its inodes are the ones the sweep keeps
    /// for the folder while it is open.
    pub(super) fn hand_out(&self, dir: &OpenDir, page: Vec<DirEntry>) -> Vec<DirEntry> {
        *dir.handed_out.lock() = page.iter().map(|e| e.entry.attr.ino).collect();
        self.sweep_inodes();
        page
    }

    /// Whether the inode table agrees with what a listing said `path` is: no inode
    /// names it, or the one that does is of that kind and (a file) that version. A
    /// newer version looked up since has its own inode, whose size the listed one
    /// must not set back.
    pub(super) fn names_listed(&self, path: &Arc<str>, listed: &Meta) -> bool {
        let inodes = self.inodes.read();
        let Some(node) = inodes.by_path.get(path).and_then(|i| inodes.nodes.get(i)) else {
            return !matches!(listed, Meta::Missing);
        };
        match listed {
            Meta::Dir => node.kind == Kind::Dir,
            Meta::File(obj) => {
                node.kind == Kind::File && node.version.as_ref().is_none_or(|v| *v == obj.version)
            }
            Meta::Missing => false,
        }
    }

    /// An entry [`Self::readdir_plus`] returned did not fit in the reply: its
    /// reference is not the kernel's.
    pub fn not_handed_out(&self, e: &DirEntry) {
        if e.name != "." && e.name != ".." {
            self.forget(e.entry.attr.ino, 1);
        }
    }

    pub fn releasedir(&self, fh: u64) {
        self.dirs.lock().remove(&fh);
    }
}
