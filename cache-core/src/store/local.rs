//! A `file://` store's own rules, beside what `object_store`'s local store does:
//! links out of the root refused, a folder's level read directly (names no key can
//! hold skipped, loops cut), local versions stat'ed, interrupted writes' temporary
//! files removed, and objects synced up to the root.

use std::sync::Arc;

use object_store::path::Path;
use object_store::ListResult;

use crate::error::{CacheError, Result};

use super::version::{etag_of, local_version};
use super::ObjectInfo;

/// Whether `rel` under `root` (canonical) resolves to a place inside `root`.
pub(super) fn inside_root(root: &std::path::Path, rel: &str) -> bool {
    match resolves_beneath(root, rel) {
        Some(found) => found,
        None => match std::fs::canonicalize(root.join(rel)) {
            Ok(real) => real.starts_with(root),
            // Gone meanwhile (or a dangling link): not something to list.
            Err(_) => false,
        },
    }
}

/// Whether `root/rel` exists and resolves outside `root` (a link out of it).
pub(super) fn escapes_root(root: &std::path::Path, rel: &str) -> bool {
    if resolves_beneath(root, rel).is_some() {
        return false;
    }
    std::fs::canonicalize(root.join(rel)).is_ok_and(|real| !real.starts_with(root))
}

/// `rel` resolved under `root` by the kernel in one call that fails once any step
/// leaves `root` (`openat2` with `RESOLVE_BENEATH`): Some(true) when it resolves and
/// never left, Some(false) when it does not exist; None when a step left `root` (a
/// link going up or an absolute one, which may lead back inside: `canonicalize` then
/// decides) or the kernel cannot say (no `openat2`). Black-box finding (round 23): a
/// `canonicalize` per check cost a `readlink` per folder of the path, several checks
/// per lookup, so walking a chain 1,000 folders deep took 54 s (0.01 s on the disk).
fn resolves_beneath(root: &std::path::Path, rel: &str) -> Option<bool> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    if rel.is_empty() {
        return None;
    }
    let dir = std::fs::File::open(root).ok()?;
    let path = std::ffi::CString::new(std::ffi::OsStr::new(rel).as_bytes()).ok()?;
    // SAFETY: a zeroed `open_how` is valid; the fields set are plain integers.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH;
    // SAFETY: `dir` is an open descriptor, `path` a NUL-terminated string and `how` a
    // valid `open_how` of the size passed; all outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd >= 0 {
        // SAFETY: the call returned a new descriptor that nothing else owns.
        drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        return Some(true);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => Some(false),
        _ => None,
    }
}

/// Whether the folder `rel` would be written in (its deepest existing ancestor, as a
/// write creates the missing ones) lies inside `root` once every link is resolved.
pub(super) fn folder_inside_root(root: &std::path::Path, rel: &str) -> bool {
    let mut dir = root.join(rel);
    while dir.pop() && dir.starts_with(root) {
        if std::fs::symlink_metadata(&dir).is_ok() {
            return match dir.strip_prefix(root).ok().and_then(|r| r.to_str()) {
                Some("") => true,
                Some(inner) => inside_root(root, inner),
                None => std::fs::canonicalize(&dir).is_ok_and(|real| real.starts_with(root)),
            };
        }
    }
    true
}

/// The first folder of `rel` under `root` that is a symbolic link (relative to `root`).
pub(super) fn folder_link_in(root: &std::path::Path, rel: &str) -> Option<String> {
    let mut dir = root.to_path_buf();
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    for (i, part) in parts.iter().enumerate().take(parts.len().saturating_sub(1)) {
        dir.push(part);
        if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
            return Some(parts[..=i].join("/"));
        }
    }
    None
}

/// Whether `name` is how object_store's local store names an upload in progress
/// (`NAME#N`): such files are never listed, and no object can be named so.
pub(super) fn upload_in_progress_name(name: &str) -> bool {
    name.rsplit_once('#')
        .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// One level of folder `rel` of the local store at `root`, read directly: what
/// object_store lists there, except that a name no key can hold (not UTF-8, a control
/// character, `NAME#N`), something neither a file nor a folder (a FIFO, a socket, a
/// dangling link) and a link to this folder or one above it (a loop) are skipped
/// instead of failing the whole listing.
pub(super) fn local_level(root: &std::path::Path, rel: &str) -> std::io::Result<ListResult> {
    let dir = root.join(rel);
    // A folder reached through a link that loops (or into the daemon's own mount, which
    // answers its own threads ELOOP) is no folder: not found at once, not an error
    // retried as a store's (black-box finding: 3.5-7 s of retries, then EIO).
    let looped = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::ELOOP) => std::io::Error::new(std::io::ErrorKind::NotFound, e),
        _ => e,
    };
    // The folder's real place, for the loop check of linked folders in it: asked only
    // when it has one (a `readlink` per folder of the path).
    let mut real_dir: Option<std::path::PathBuf> = None;
    let (mut common_prefixes, mut objects) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(&dir).map_err(looped)? {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let key = match rel.is_empty() {
            true => name.clone(),
            false => format!("{rel}/{name}"),
        };
        let Ok(location) = Path::parse(&key) else {
            continue;
        };
        // (Follows links: a dangling one fails and is skipped.)
        let Ok(meta) = std::fs::metadata(entry.path()) else {
            continue;
        };
        if meta.is_dir() {
            // A linked folder that cannot be read is skipped as a dangling link is.
            let linked = entry.file_type().is_ok_and(|t| t.is_symlink());
            // Only a link can lead to this folder or one above it.
            let looped = linked && {
                if real_dir.is_none() {
                    real_dir = Some(std::fs::canonicalize(&dir).map_err(looped)?);
                }
                let real = real_dir.as_deref().unwrap_or(&dir);
                std::fs::canonicalize(entry.path()).is_ok_and(|r| real.starts_with(r))
            };
            let unreadable = linked && std::fs::read_dir(entry.path()).is_err();
            if !looped && !unreadable {
                common_prefixes.push(location);
            }
        } else if meta.is_file() && !upload_in_progress_name(&name) {
            objects.push(object_store::ObjectMeta {
                location,
                last_modified: meta.modified()?.into(),
                size: meta.len(),
                e_tag: Some(object_store_etag(&meta)),
                version: None,
            });
        }
    }
    common_prefixes.sort();
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(ListResult {
        common_prefixes,
        objects,
        extensions: Default::default(),
    })
}

/// The ETag object_store's local store gives a file (its `head` and its listings):
/// inode, mtime in microseconds and size, in hex and quoted. A listing read here must
/// name the versions a `head` through object_store names (checked against it by
/// `local_listing_etags_are_object_store_s`).
fn object_store_etag(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default()
        .as_micros();
    format!("\"{:x}-{mtime:x}-{:x}\"", meta.ino(), meta.len())
}

/// Every file under folder `rel` of the local store at `root`, by [`local_level`].
pub(super) fn local_walk(
    root: &std::path::Path,
    rel: &str,
) -> std::io::Result<Vec<object_store::ObjectMeta>> {
    let mut out = Vec::new();
    let mut todo = vec![rel.to_string()];
    while let Some(d) = todo.pop() {
        let level = match local_level(root, &d) {
            Ok(l) => l,
            // The prefix itself missing: nothing under it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && d == rel => break,
            Err(e) => return Err(e),
        };
        todo.extend(level.common_prefixes.iter().map(|p| p.to_string()));
        out.extend(level.objects);
    }
    Ok(out)
}

/// Fails with `NotFound` unless `p` under `root` is a regular file (links followed).
/// A FIFO put in a file's place would block the read's open, and with it a thread of
/// the blocking pool, for good (black-box finding: 8 such reads held threads past the
/// unmount; the daemon never exited); a device or a directory is no object either.
pub(super) async fn regular_local_file(
    root: Arc<std::path::Path>,
    p: &Path,
) -> object_store::Result<()> {
    let path = root.join(p.as_ref());
    let key = p.to_string();
    let kind = tokio::task::spawn_blocking(move || std::fs::metadata(path).map(|m| m.file_type()))
        .await
        .map_err(|e| object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(e),
        })?;
    match kind {
        Ok(t) if t.is_file() => Ok(()),
        Ok(_) => Err(object_store::Error::NotFound {
            path: key,
            source: "not a regular file (a FIFO, socket, device or directory took its place)"
                .into(),
        }),
        // The read itself reports a missing file (or any other failure) as before.
        Err(_) => Ok(()),
    }
}

/// `info` with its version taken from the file under `root` (see [`local_version`]).
pub(super) async fn local_info(
    root: Arc<std::path::Path>,
    info: ObjectInfo,
    follow_symlinks: bool,
) -> Result<ObjectInfo> {
    let mut v = local_infos(root, vec![info], follow_symlinks, false).await?;
    v.pop().ok_or_else(|| CacheError::Store {
        attempts: 1,
        message: "local stat returned nothing".into(),
    })
}

/// Runs `f`, which stats local files, on the blocking pool.
pub(super) async fn local_stat<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CacheError::Store {
            attempts: 1,
            message: format!("local stat task failed: {e}"),
        })
}

/// [`local_info`] of many files, in one blocking task. Entries that lead out of the
/// root through a symlink, or that are no regular file (a FIFO, socket or device: its
/// open would wait for a writer, black-box finding below), are skipped (`listing`: for
/// listings, as are files deleted since they were listed) or not found.
///
/// Black-box finding (round 21): a FIFO in a `file://` store was listed as a 0-byte
/// file, and a `stat` of it, once its attributes expired, sent a HEAD whose open waited
/// for a writer: 40 s, then the whole store taken for silent (every request of the
/// mount EIO), and the blocked threads kept the daemon from exiting on SIGTERM.
pub(super) async fn local_infos(
    root: Arc<std::path::Path>,
    infos: Vec<ObjectInfo>,
    follow_symlinks: bool,
    listing: bool,
) -> Result<Vec<ObjectInfo>> {
    local_stat(move || {
        let not_found = |info: &ObjectInfo| match listing {
            true => None,
            false => Some(Err(CacheError::NotFound(info.path.to_string()))),
        };
        infos
            .into_iter()
            .filter_map(|mut info| {
                if !follow_symlinks && !inside_root(&root, &info.path) {
                    // Warned only for a link that leads out: a file deleted since it was
                    // listed is just not found.
                    if escapes_root(&root, &info.path) {
                        match listing {
                            true => tracing::warn!(path = %info.path, "skipping a symlink out of the store root"),
                            false => tracing::warn!(path = %info.path, "refusing a symlink out of the store root"),
                        }
                    }
                    return not_found(&info);
                }
                let path = root.join(info.path.as_ref());
                let m = match std::fs::metadata(&path) {
                    Ok(m) => m,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return not_found(&info),
                    Err(e) => return Some(Err(CacheError::Io(e))),
                };
                if !m.is_file() {
                    tracing::warn!(path = %info.path,
                        "skipping a store entry that is no regular file (a FIFO, socket or device): no object");
                    return not_found(&info);
                }
                let etag = etag_of(&info.version).to_string();
                info.version = Arc::from(local_version(&etag, &m));
                Some(Ok(info))
            })
            .collect()
    })
    .await?
}

/// Whether `root/rel` can be named by a system call: shorter than `PATH_MAX` (4,096)
/// bytes with its terminating NUL.
pub(super) fn local_path_fits(root: &std::path::Path, rel: &str) -> bool {
    local_len_fits(root, rel.len())
}

/// [`local_path_fits`] for a relative path of `rel_len` bytes.
pub(super) fn local_len_fits(root: &std::path::Path, rel_len: usize) -> bool {
    root.as_os_str().len() + 1 + rel_len < libc::PATH_MAX as usize
}

/// Longest file name a local directory store takes: 255 (NAME_MAX) less room for the
/// `#N` suffix of its uploads in progress (N up to 3 digits).
pub(super) const LOCAL_NAME_MAX: usize = 255 - 4;

/// Removes what a local directory store's interrupted write of `key` left: its
/// temporary files `NAME#N` beside the object (object_store's names; a key may not end
/// so, see `object_key`). False if one could not be removed.
pub(super) fn remove_local_temp(root: &std::path::Path, key: &str) -> bool {
    let target = root.join(key);
    let (Some(dir), Some(name)) = (target.parent(), target.file_name()) else {
        return true;
    };
    let prefix = format!("{}#", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return true;
    };
    let mut ok = true;
    for e in entries.flatten() {
        let n = e.file_name();
        let n = n.to_string_lossy();
        let temp = n
            .strip_prefix(&prefix)
            .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()));
        if temp {
            if let Err(err) = std::fs::remove_file(e.path()) {
                if err.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(file = %e.path().display(), error = %err,
                        "cannot remove an interrupted write's temporary file");
                    ok = false;
                }
            }
        }
    }
    ok
}

/// Removes a new object's file whose sync failed (the caller is told the write failed,
/// and a failed create leaves no object); a failure to is only logged.
pub(crate) async fn remove_unsynced(file: &std::path::Path) {
    if let Err(rm) = tokio::fs::remove_file(file).await {
        tracing::warn!(file = %file.display(), error = %rm,
            "cannot remove an object whose sync failed");
    }
}

/// Syncs `file` and the folders from its own up to `root` (see
/// [`BackingStore::sync_local`]); a file already gone (deleted meanwhile) is not an
/// error.
pub(crate) async fn sync_local_file(
    root: std::path::PathBuf,
    file: std::path::PathBuf,
) -> Result<()> {
    tokio::task::spawn_blocking(move || {
        match std::fs::File::open(&file).and_then(|f| f.sync_all()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                // Named here: the flush's error names no file (the error itself is
                // kept as it is, its errno decides what the caller is told).
                tracing::warn!(file = %file.display(), error = %e,
                    "syncing a written object to the store's disk failed");
                return Err(e.into());
            }
            _ => {}
        }
        match file.parent() {
            Some(dir) => sync_dirs_blocking(&root, dir),
            None => Ok(()),
        }
    })
    .await
    .map_err(|e| CacheError::Io(std::io::Error::other(e)))?
}

/// Syncs folder `dir` and its parents up to `root`.
pub(super) async fn sync_local_dirs(
    root: std::path::PathBuf,
    dir: std::path::PathBuf,
) -> Result<()> {
    tokio::task::spawn_blocking(move || sync_dirs_blocking(&root, &dir))
        .await
        .map_err(|e| CacheError::Io(std::io::Error::other(e)))?
}

pub(super) fn sync_dirs_blocking(root: &std::path::Path, dir: &std::path::Path) -> Result<()> {
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| d.starts_with(root)) {
        match std::fs::File::open(d).and_then(|f| f.sync_all()) {
            // Emptied and removed meanwhile: its parent still gets synced.
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        if d == root {
            break;
        }
        at = d.parent();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-call check agrees with resolving every link: inside (directly, through
    /// a relative link, through an absolute link or one going up and back in) or not
    /// (a link out, a dangling one, nothing there).
    #[test]
    fn a_path_is_inside_the_root_as_its_links_resolve() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().canonicalize().expect("canonical");
        let root = base.join("root");
        std::fs::create_dir_all(root.join("a/b")).expect("mkdir");
        std::fs::create_dir(base.join("out")).expect("mkdir");
        std::fs::write(root.join("a/b/f"), b"x").expect("write");
        std::fs::write(base.join("out/secret"), b"s").expect("write");
        let link = |target: &std::path::Path, at: &str| {
            std::os::unix::fs::symlink(target, root.join(at)).expect("symlink")
        };
        link(std::path::Path::new("b/f"), "a/rel");
        link(&root.join("a/b"), "a/abs");
        link(std::path::Path::new("../../root/a/b"), "a/up_and_in");
        link(&base.join("out"), "a/outside");
        link(std::path::Path::new("../../out/secret"), "a/up_and_out");
        link(std::path::Path::new("nowhere"), "a/dangling");
        for (rel, inside) in [
            ("a/b/f", true),
            ("a", true),
            ("a/rel", true),
            ("a/abs/f", true),
            ("a/up_and_in/f", true),
            ("a/outside/secret", false),
            ("a/up_and_out", false),
            ("a/dangling", false),
            ("a/missing", false),
            ("a/b/f/under_a_file", false),
        ] {
            assert_eq!(inside_root(&root, rel), inside, "{rel}");
        }
        assert!(escapes_root(&root, "a/outside/secret"));
        assert!(escapes_root(&root, "a/up_and_out"));
        assert!(!escapes_root(&root, "a/abs/f"));
        assert!(!escapes_root(&root, "a/b/f"));
        assert!(!escapes_root(&root, "a/missing"));
        assert!(folder_inside_root(&root, "a/abs/new/file"));
        assert!(folder_inside_root(&root, "a/new/deeper/file"));
        assert!(!folder_inside_root(&root, "a/outside/new"));
    }

    /// The listing read here names each file by the ETag object_store's own `head`
    /// gives it: the two must name one version (a mismatch made every listed file's
    /// blocks another version than its `head`'s).
    #[tokio::test]
    async fn local_listing_etags_are_object_store_s() {
        use object_store::ObjectStoreExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        std::fs::create_dir(root.join("d")).expect("mkdir");
        std::fs::write(root.join("d/f"), vec![7u8; 12_345]).expect("write");
        let fs = object_store::local::LocalFileSystem::new_with_prefix(&root).expect("local");
        let head = fs.head(&Path::from("d/f")).await.expect("head");
        let level = local_level(&root, "d").expect("level");
        assert_eq!(level.objects.len(), 1);
        assert_eq!(level.objects[0].e_tag, head.e_tag);
        assert_eq!(level.objects[0].size, head.size);
    }
}
