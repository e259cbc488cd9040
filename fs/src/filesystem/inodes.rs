//! The inode table: one number per path the kernel knows, its references counted
//! as the kernel counts them, unreferenced ones swept past the budget (module docs of
//! `filesystem.rs`, "Inodes").

use super::*;

#[derive(Clone, Debug)]
pub(super) struct Node {
    pub(super) path: Arc<str>,
    pub(super) kind: Kind,
    pub(super) generation: u64,
    /// The kernel's references (LOOKUP replies and READDIRPLUS entries not forgotten).
    pub(super) lookups: u64,
    /// The size the kernel was last told for this file (it may cache it for the TTL);
    /// None: not told yet.
    pub(super) told_size: Option<u64>,
    /// The store version this inode stands for (a file looked up from the store; None
    /// for directories and files being written). Another version of the path is
    /// another inode (see [`InodeTable::intern`]).
    pub(super) version: Option<Arc<str>>,
    /// Another file was renamed over this one through the mount: the path names that
    /// one now, and this inode lives on only for handles already open (see
    /// [`InodeTable::moved`]).
    pub(super) replaced: bool,
}

#[derive(Default)]
pub(super) struct InodeTable {
    /// Every inode's generation: this daemon's start time in nanoseconds. Inode numbers
    /// start again at each start, so a file handle (`name_to_handle_at`, an NFS
    /// re-export, overlayfs) kept across a restart names another file under the same
    /// number; its generation makes it ESTALE instead (black-box finding: with a
    /// constant generation, 20 of 20 handles saved before a remount opened other files).
    pub(super) generation: u64,
    pub(super) nodes: HashMap<u64, Node>,
    pub(super) by_path: HashMap<Arc<str>, u64>,
    pub(super) next: u64,
    /// Numbers of inodes dropped (forgotten by the kernel, or swept), by path, so the
    /// path gets its number back when it is looked up again (black-box finding: after
    /// the kernel forgot them, every file came back under a new inode number, and git
    /// saw its whole index stat-dirty and re-hashed the tree). At most
    /// `forgotten_max`, oldest first out.
    pub(super) forgotten: HashMap<Arc<str>, (u64, Kind)>,
    pub(super) forgotten_order: std::collections::VecDeque<Arc<str>>,
    pub(super) forgotten_max: usize,
}

/// Inode numbers remembered for paths the kernel forgot: 131,072 (a few MB of paths),
/// a dataset's worth of files; past it a path forgotten long ago gets a new number, as
/// every path did before. Fewer where the unreferenced inodes' budget is smaller (a
/// remembered number costs about what an unreferenced inode does).
pub(super) const FORGOTTEN_NUMBERS: usize = 1 << 17;

impl InodeTable {
    pub(super) fn new(root: Arc<str>, max_inodes: usize) -> Self {
        let generation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            .max(1);
        let mut t = InodeTable {
            generation,
            next: ROOT_INO + 1,
            forgotten_max: max_inodes.clamp(1, FORGOTTEN_NUMBERS),
            ..Default::default()
        };
        t.nodes.insert(
            ROOT_INO,
            Node {
                path: root.clone(),
                kind: Kind::Dir,
                generation,
                lookups: 1,
                told_size: None,
                version: None,
                replaced: false,
            },
        );
        t.by_path.insert(root, ROOT_INO);
        t
    }

    /// The inode of `path` as `kind`, created if new (or if the path changed kind, or,
    /// for a lookup, names another store `version` than its inode stands for);
    /// `reference`: the reply hands the kernel a reference (a LOOKUP reply).
    ///
    /// A new version is a new inode, as a file replaced by a rename is on a local disk:
    /// the kernel keeps one page cache and one passthrough backing file per inode, so
    /// handles of two versions on one inode mixed them (black-box findings: a handle of
    /// the old version read the new version's bytes another reader had brought into
    /// the page cache, first half old, second half new; and while one handle held the
    /// old version's passthrough copy, every new open was served that copy, the old
    /// bytes, for as long as it stayed open). The old inode lives on for its handles
    /// until the kernel forgets it; the path names the new one from its next lookup.
    pub(super) fn intern(
        &mut self,
        path: &Arc<str>,
        kind: Kind,
        version: Option<&Arc<str>>,
        reference: bool,
    ) -> (u64, u64) {
        if let Some(&ino) = self.by_path.get(path) {
            if let Some(n) = self.nodes.get_mut(&ino) {
                let same_version = match (&n.version, version) {
                    (Some(had), Some(now)) => had == now,
                    _ => true,
                };
                // Only a lookup moves the path to a new inode: an attribute request
                // names an inode the kernel holds, which stays what it is.
                if (n.kind == kind && (same_version || !reference)) || ino == ROOT_INO {
                    n.lookups += u64::from(reference);
                    if same_version && version.is_some() {
                        n.version = version.cloned();
                    }
                    return (ino, n.generation);
                }
            }
        }
        // The number this path had, if the kernel forgot it (numbers only ever grow,
        // so no other path took it).
        let ino = match self.forgotten.remove(path) {
            Some((ino, k)) if k == kind && !self.nodes.contains_key(&ino) => ino,
            _ => {
                self.next += 1;
                self.next - 1
            }
        };
        self.nodes.insert(
            ino,
            Node {
                path: path.clone(),
                kind,
                generation: self.generation,
                lookups: u64::from(reference),
                told_size: None,
                version: version.cloned(),
                replaced: false,
            },
        );
        self.by_path.insert(path.clone(), ino);
        (ino, self.generation)
    }

    /// `path` was removed (unlink, rmdir): its inode stays for the kernel's open
    /// handles (and its FORGET) but no longer names the path, so a file or directory
    /// made there next is a new inode. Reusing the number would hand the new file the
    /// old one's page cache and open handles (a reader of the deleted file read the new
    /// file's bytes), and a directory the kernel has marked removed (every create in a
    /// re-made directory failed ENOENT): black-box findings.
    pub(super) fn detach(&mut self, path: &str) {
        self.by_path.remove(path);
        self.forgotten.remove(path);
    }

    /// `from` was renamed to `to`: its inode now names `to` (the kernel keeps the
    /// inode across a rename); an inode `to` had is left to the kernel's FORGET.
    /// `now`: the object the rename made at `to`, when known.
    pub(super) fn moved(&mut self, from: &Arc<str>, to: &Arc<str>, now: Option<&ObjectInfo>) {
        let Some(ino) = self.by_path.remove(from) else {
            return;
        };
        let version = now.map(|o| &o.version);
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.path = to.clone();
            if let Some(o) = now {
                node.told_size = Some(o.size);
            }
            // The object moved is a copy, a version of its own: the inode stands for
            // it, so an open after the next rename over `to` is ESTALE rather than an
            // open of what that one put there (None: the one its next lookup or open
            // finds).
            node.version = version.cloned();
        }
        // A replaced file's inode still names `to` until the kernel forgets it (the
        // kernel's dentry now points at the moved inode), but is no longer the file
        // there: an open of it (by a process that looked the name up before the
        // rename) is ESTALE, and the kernel looks the name up again. It took whatever
        // `to` held at the open (black-box finding: two processes saving one name by
        // temp file and rename, a reader got the size of one version and the bytes of
        // the next, as a success).
        if let Some(old) = self.by_path.insert(to.clone(), ino) {
            if old != ino {
                if let Some(n) = self.nodes.get_mut(&old) {
                    n.replaced = true;
                }
            }
        }
    }

    /// Directory `from` was renamed to `to`: it and every inode under it now name the
    /// same place under `to` (the kernel keeps them all across the rename).
    pub(super) fn moved_tree(&mut self, from: &str, to: &str) {
        let under = format!("{from}/");
        let moved: Vec<(Arc<str>, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.as_ref() == from || p.starts_with(&under))
            .map(|(p, &ino)| (p.clone(), ino))
            .collect();
        for (old, ino) in moved {
            let new: Arc<str> = Arc::from(format!("{to}{}", &old[from.len()..]));
            self.by_path.remove(&old);
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.path = new.clone();
                node.version = None;
            }
            self.by_path.insert(new, ino);
        }
    }

    /// The kernel took `n` more references to `ino` (READDIRPLUS entries); false if
    /// the inode is not in the table.
    pub(super) fn referenced(&mut self, ino: u64, n: u64) -> bool {
        match self.nodes.get_mut(&ino) {
            Some(node) => {
                node.lookups += n;
                true
            }
            None => false,
        }
    }

    /// The kernel dropped `n` references to `ino`; at zero the inode goes (the root
    /// never does). Returns whether it went.
    pub(super) fn forget(&mut self, ino: u64, n: u64) -> bool {
        if ino == ROOT_INO {
            return false;
        }
        let Some(node) = self.nodes.get_mut(&ino) else {
            return false;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups > 0 {
            return false;
        }
        self.drop_node(ino);
        true
    }

    pub(super) fn drop_node(&mut self, ino: u64) {
        if let Some(node) = self.nodes.remove(&ino) {
            if self.by_path.get(&node.path) == Some(&ino) {
                self.by_path.remove(&node.path);
                if self
                    .forgotten
                    .insert(node.path.clone(), (ino, node.kind))
                    .is_none()
                {
                    self.forgotten_order.push_back(node.path);
                }
                // The order may name a path twice (forgotten, found, forgotten again):
                // bounding it bounds the map, at worst dropping a number early.
                while self.forgotten_order.len() > self.forgotten_max {
                    if let Some(p) = self.forgotten_order.pop_front() {
                        self.forgotten.remove(&p);
                    }
                }
            }
        }
    }

    /// Past `max` inodes, drops those the kernel holds no reference to, except `keep`
    /// (inodes of open handles). Returns how many went.
    pub(super) fn sweep(&mut self, max: usize, keep: &std::collections::HashSet<u64>) -> usize {
        if self.nodes.len() <= max {
            return 0;
        }
        let idle: Vec<u64> = self
            .nodes
            .iter()
            .filter(|(ino, n)| n.lookups == 0 && **ino != ROOT_INO && !keep.contains(ino))
            .map(|(ino, _)| *ino)
            .collect();
        for &ino in &idle {
            self.drop_node(ino);
        }
        // A table that held a large folder's entries keeps its room after they go
        // (21 MB for 300,000 names, measured): given back once mostly empty.
        let len = self.nodes.len();
        if self.nodes.capacity() > 4 * len.max(1024) {
            self.nodes.shrink_to(2 * len);
            self.by_path.shrink_to(2 * len);
        }
        idle.len()
    }
}
