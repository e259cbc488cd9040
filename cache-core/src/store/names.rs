//! What names a store can hold: keys no client can name or no local file system can
//! hold, and a `file://` store's writes kept inside its root.

use super::*;

impl BackingStore {
    /// A write, rename or delete of `path` in a local directory store whose folder is
    /// reached through a symbolic link leading out of the store (black-box finding: with
    /// the link `ckpt -> /elsewhere` hidden from the listing, `mkdir ckpt` then a write
    /// of `ckpt/new.bin` created the file outside the store, and with
    /// `--allow-overwrite` replaced one there; the daemon often runs as root). Refused
    /// unless the store follows symbolic links (`--follow-symlinks`), as reads are.
    /// Public so a mount refuses such a name when it is created, not at its upload.
    pub async fn local_write_inside(&self, path: &str) -> Result<()> {
        let Some(root) = &self.local_root else {
            return Ok(());
        };
        if self.follow_symlinks {
            return Ok(());
        }
        let (root, rel) = (root.clone(), path.to_string());
        let (folder_inside, hidden_link) = local_stat(move || {
            // The name itself a link the listing hides (out of the store, or leading
            // nowhere): a write would replace it, where the README promises EINVAL
            // (round 17b: `echo x > name` and `mv a name` turned such links into files).
            let hidden_link = std::fs::symlink_metadata(root.join(&rel))
                .is_ok_and(|m| m.file_type().is_symlink())
                && !inside_root(&root, &rel);
            (folder_inside_root(&root, &rel), hidden_link)
        })
        .await?;
        if hidden_link {
            tracing::warn!(
                path,
                "refused: the name is a symbolic link out of the store"
            );
            return Err(CacheError::InvalidArgument(format!(
                "{path}: a symbolic link out of the store (hidden from the mount) has this name"
            )));
        }
        if folder_inside {
            return Ok(());
        }
        tracing::warn!(
            path,
            "refused: the folder is a symbolic link out of the store"
        );
        Err(CacheError::InvalidArgument(format!(
            "{path}: its folder is reached through a symbolic link out of the store"
        )))
    }

    /// A delete or move of `path` in a local directory store whose folder is reached
    /// through a symbolic link (`data/latest -> v2`): refused, since it would act on the
    /// link's target (black-box finding: `rm -rf data/latest` through the mount, which
    /// shows the link as a folder, deleted every file of v2 and left the link; on the
    /// disk itself `rm -rf data/latest` removes the link only). Change such links in
    /// the store itself. A store that follows links (`--follow-symlinks`) takes them
    /// as the folders they lead to, as before.
    pub(super) async fn local_not_through_link(&self, path: &str) -> Result<()> {
        let Some(root) = self.local_root.as_ref().filter(|_| !self.follow_symlinks) else {
            return Ok(());
        };
        let (root, rel) = (root.clone(), path.to_string());
        match local_stat(move || folder_link_in(&root, &rel)).await? {
            None => Ok(()),
            Some(link) => {
                tracing::warn!(path, link = %link, "refused: a delete or move through a symbolic link to a folder acts on its target");
                Err(CacheError::PermissionDenied(format!(
                    "{path}: {link} is a symbolic link; deleting or moving through it would \
                     change its target (change the link in the store itself)"
                )))
            }
        }
    }

    /// A path of a local directory store too long to name (black-box finding: a
    /// directory 16 levels of 250-byte names deep, past `PATH_MAX`, was listed as empty
    /// with no error, and everything under it silently vanished): `NameTooLong`,
    /// ENAMETOOLONG at the mount. Cloud stores' keys have no such limit.
    pub(super) fn local_path_fits(&self, path: &str) -> Result<()> {
        match &self.local_root {
            Some(root) if !local_path_fits(root, path) => {
                Err(CacheError::NameTooLong(path.to_string()))
            }
            _ => Ok(()),
        }
    }

    /// A local folder whose path fits but some entry's does not (the store's listing
    /// drops what it cannot stat, so the folder would list as if that entry did not
    /// exist): `NameTooLong` for the whole listing. Only a folder within `NAME_MAX` of
    /// the limit is read for it.
    pub(super) async fn local_children_fit(&self, dir: &str) -> Result<()> {
        let Some(root) = &self.local_root else {
            return Ok(());
        };
        if local_len_fits(root, dir.len() + 1 + 255) {
            return Ok(());
        }
        let folder = root.join(dir);
        let longest = local_stat(move || {
            std::fs::read_dir(folder).map_or(0, |entries| {
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().len())
                    .max()
                    .unwrap_or(0)
            })
        })
        .await?;
        if longest > 0 && !local_len_fits(root, dir.len() + 1 + longest) {
            return Err(CacheError::NameTooLong(format!("{dir}/...")));
        }
        Ok(())
    }

    /// Why this store cannot hold an object named `path` as the mount names it (None:
    /// it can). A key cannot hold control characters, `.` or `..` segments (they would be
    /// percent-encoded into another name, so the file would come back renamed), and a
    /// local directory's object store keeps its uploads in progress as `NAME#N`, so a
    /// file named so would never be listed or stored; a cloud store's keys are at most
    /// [`CLOUD_KEY_MAX`] bytes (ENAMETOOLONG).
    pub fn unstorable_name(&self, path: &str) -> Option<CacheError> {
        self.name_problem(path, true)
    }

    /// Whether no object can be named `path` in this store, so a lookup of it is
    /// "missing" without asking: as [`Self::unstorable_name`], but for a name a local
    /// directory holds and could not write (over [`LOCAL_NAME_MAX`] bytes, within the
    /// file system's 255): files another program made may have it (black-box finding:
    /// files of 252-255-byte names were listed and then ENOENT to every open past the
    /// listing's TTL).
    pub fn unnameable(&self, path: &str) -> bool {
        self.name_problem(path, false).is_some()
    }

    /// [`Self::unstorable_name`]; `writing`: the name is to be written (a local
    /// directory store needs room for `NAME#N` then).
    fn name_problem(&self, path: &str, writing: bool) -> Option<CacheError> {
        if let Err(e) = Path::parse(path) {
            return Some(CacheError::InvalidArgument(format!(
                "{path:?} cannot be an object key: {e}"
            )));
        }
        // Black-box finding: names past S3's 1,024-byte keys were created and written
        // (the local test server takes them); a real store fails them at the upload.
        if let Some(max) = self.key_max.filter(|m| path.len() > *m) {
            return Some(CacheError::NameTooLong(format!(
                "{path:?}: {} bytes; the store takes keys of at most {CLOUD_KEY_MAX} bytes \
                 ({max} below this mount's prefix)",
                path.len()
            )));
        }
        let last = path.rsplit('/').next().unwrap_or(path);
        // A local directory store writes NAME#N first: a name the file system takes
        // (255 bytes) may be one it cannot take with that suffix, and the upload failed
        // at the close, after the whole write (black-box finding).
        // No file of a local directory has a name past the file system's 255 bytes: a
        // lookup of one is no object at once, not a HEAD failing ENAMETOOLONG as a store
        // error 8 times, EIO (black-box finding, round 22b).
        if !writing && self.local_root.is_some() && last.len() > 255 {
            return Some(CacheError::NameTooLong(format!(
                "{path:?}: a local directory holds names of at most 255 bytes; this one has {}",
                last.len()
            )));
        }
        if writing && self.local_root.is_some() && last.len() > LOCAL_NAME_MAX {
            return Some(CacheError::InvalidArgument(format!(
                "{path:?}: a local directory store holds names of at most {LOCAL_NAME_MAX} \
                 bytes (it writes NAME#N first); this one has {}",
                last.len()
            )));
        }
        (self.local_root.is_some() && upload_in_progress_name(last)).then(|| {
            CacheError::InvalidArgument(format!(
                "{path:?}: a local directory store keeps uploads in progress as NAME#N, so it \
                 cannot hold a file named so"
            ))
        })
    }

    /// For a local directory store: whether its file system makes hard links (None:
    /// not a local store). Its create-only writes, copies and create-only renames are
    /// hard links (object_store's `LocalFileSystem`); on a file system without them
    /// (exFAT, FAT, some FUSE file systems) every such write failed EACCES, small new
    /// files too (black-box finding). Probed with two files named as object_store's
    /// uploads in progress (`NAME#N`, never listed), removed at once. Blocking.
    pub fn local_links_work(&self) -> Option<std::io::Result<()>> {
        let root = self.local_root.as_ref()?;
        let a = root.join(format!(".strata-link-probe#{}", std::process::id()));
        let b = root.join(format!(".strata-link-probe#{}1", std::process::id()));
        let probe = || -> std::io::Result<()> {
            // A folder it cannot write in says nothing of links: its writes will say why.
            if std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&a)
                .is_err()
            {
                return Ok(());
            }
            std::fs::hard_link(&a, &b)
        };
        let r = probe();
        let _ = std::fs::remove_file(&b);
        let _ = std::fs::remove_file(&a);
        Some(r)
    }

    /// Removes directory `path` of a local directory store if it is empty (an object
    /// store has no directories: elsewhere there is nothing to remove; a missing one is
    /// removed already). Deletes remove the directories they empty; this is for one
    /// that was empty from the start or that a rename emptied. (ENOTEMPTY if it holds
    /// what the store does not list.)
    pub async fn remove_empty_dir(&self, path: &str) -> std::io::Result<()> {
        let Some(root) = &self.local_root else {
            return Ok(());
        };
        match tokio::fs::remove_dir(root.join(path)).await {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
}

/// Why `prefix` (slashes at either end aside) names no folder of a store, if it does
/// not: an empty, `.` or `..` segment, or one no key can hold. A store URL's prefix and
/// a mount's `prefix` are both checked by this.
pub fn folder_prefix_problem(prefix: &str) -> Option<String> {
    let inner = prefix.trim_matches('/');
    if inner.is_empty() {
        return None;
    }
    Path::parse(inner)
        .err()
        .map(|e| format!("an empty, `.` or `..` segment names no folder of the store ({e})"))
}
