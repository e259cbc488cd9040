//! Listings kept on disk for a mount whose metadata never expires
//! (`--metadata-ttl indefinite`, a dataset its user declares immutable).
//!
//! A store that does not answer a mount's first listing is mounted on what the cache
//! holds (README). After a restart the cache held the blocks but no listing, so every
//! lookup waited for the silent store and failed: a fully cached file could not be read
//! (black-box finding). So each listing fetched from the store is appended to a log
//! (`<cache>/metadata/<mount>.jsonl`, one JSON line per directory), compacted to the
//! latest listing of each directory when the mount opens it. It is read only when the
//! store did not answer the mount's first listing ([`super::FsCore::preload_listings`]):
//! a store that answers is listed afresh, as before, and its changes are seen.
//!
//! Changes the mount makes (an upload, a removal, a rename) are logged too, in order
//! after the listings they change (crash finding: after `rm b`, `mv c c2` and an
//! overwrite of `a`, a restart with the store silent listed `a b c` again and served `a`'s
//! replaced bytes): a start with the store down sees the mount as it last left it.
//! Lines are written in the order they happen (one small append each), so a change is
//! never overtaken by a listing fetched before it.
//!
//! A line torn by a crash fails to parse and is skipped (the directory is listed from the
//! store again, or is missing while the store is down); the log is bounded by the
//! listings fetched (each directory once per mount's life with an indefinite TTL, until
//! the listing cache evicts it) and rewritten compact at every open, and while the
//! mount runs once it has grown well past its compact size.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use strata_cache_core::ObjectInfo;

/// One directory as logged: whether it exists, and its entries (None: a sub-directory).
pub(super) type LoggedListing = (bool, Vec<(String, Option<ObjectInfo>)>);

/// What a run logged: listings by directory, and objects looked up one by one (a HEAD:
/// a job that opens files by name never lists their directory).
#[derive(Debug, Default)]
pub(super) struct Logged {
    pub dirs: HashMap<String, LoggedListing>,
    pub files: HashMap<String, ObjectInfo>,
}

/// The log of one mount (see the module docs).
pub(super) struct ListingLog {
    path: PathBuf,
    source: String,
    block_size: u64,
    inner: parking_lot::Mutex<Appending>,
}

/// The open log and how much of it is new since it was last compacted.
struct Appending {
    file: std::fs::File,
    /// Bytes the log had when last compacted...
    compacted: u64,
    /// ...and bytes appended since.
    appended: u64,
}

/// The log is compacted while the mount runs once its appended lines pass this many
/// bytes and twice its compacted size: a writer creating and deleting files for days
/// appends ~180 bytes per change, which only the next start compacted (black-box
/// finding: 1.78 MB for 10,000 creates and deletes of a mount holding 1 object). The
/// cost, one read and rewrite of the log, is paid once per that many bytes appended.
const COMPACT_AFTER: u64 = 1 << 20;

impl ListingLog {
    /// Opens `path`, compacting what an earlier run logged; returns the log and those
    /// listings (files' block size `block_size`, the layout the mount reads in).
    ///
    /// `source` names what the mount shows (the store and the prefix); a log written
    /// for another source is not used (black-box finding: a mountpoint repointed at
    /// another bucket or prefix while that store was down listed and served the first
    /// one's names and cached bytes, with no error). It is the compacted file's first
    /// line.
    pub(super) fn open(
        path: &Path,
        block_size: u64,
        source: &str,
    ) -> std::io::Result<(ListingLog, Logged)> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let latest = fold(path, block_size, source);
        let compacted = write_compact(path, source, &latest)?;
        let file = std::fs::OpenOptions::new().append(true).open(path)?;
        Ok((
            ListingLog {
                path: path.to_path_buf(),
                source: source.to_string(),
                block_size,
                inner: parking_lot::Mutex::new(Appending {
                    file,
                    compacted,
                    appended: 0,
                }),
            },
            latest,
        ))
    }

    /// Appends the listing of `dir` (one small write, see [`Self::write_line`]).
    pub(super) fn append(
        &self,
        dir: &str,
        exists: bool,
        entries: Vec<(String, Option<ObjectInfo>)>,
    ) {
        self.write_line(line_of(dir, exists, &entries));
    }

    /// Appends one object looked up by name (as [`Self::append`]).
    pub(super) fn append_file(&self, obj: &ObjectInfo) {
        self.write_line(file_line(obj));
    }

    /// Appends a change this mount made: `name` of `dir` is now `obj` (uploaded).
    pub(super) fn append_set(&self, dir: &str, name: &str, obj: &ObjectInfo) {
        self.write_line(json!({ "set": [dir, name, obj_value(obj)] }).to_string());
    }

    /// Appends a change this mount made: `name` of `dir` is a folder now (made by
    /// `mkdir`, a folder renamed there, the folder of a file saved in it).
    pub(super) fn append_folder(&self, dir: &str, name: &str) {
        self.write_line(json!({ "folder": [dir, name] }).to_string());
    }

    /// Appends a change this mount made: `name` of `dir` (the object `path`) is gone,
    /// or its state unknown (then a start with the store down does not serve it).
    pub(super) fn append_gone(&self, dir: &str, name: &str, path: &str) {
        self.write_line(json!({ "gone": [dir, name, path] }).to_string());
    }

    /// One line, appended now by one `write` under the log's lock (lines keep the
    /// order of what they record, see the module doc): a few hundred bytes to a local
    /// file, no fsync. Past [`COMPACT_AFTER`] the log is compacted first.
    fn write_line(&self, mut line: String) {
        line.push('\n');
        let mut a = self.inner.lock();
        if a.appended > COMPACT_AFTER && a.appended > 2 * a.compacted {
            match self.compact() {
                Ok((file, size)) => {
                    *a = Appending {
                        file,
                        compacted: size,
                        appended: 0,
                    }
                }
                Err(e) => {
                    tracing::debug!(path = %self.path.display(), error = %e, "listing log not compacted");
                    a.appended = 0;
                }
            }
        }
        match (&a.file).write_all(line.as_bytes()) {
            Ok(()) => a.appended += line.len() as u64,
            Err(e) => {
                tracing::debug!(path = %self.path.display(), error = %e, "listing not logged")
            }
        }
    }

    /// The log rewritten to its latest state, and that file opened to append to, with
    /// its size. Under the log's lock.
    fn compact(&self) -> std::io::Result<(std::fs::File, u64)> {
        let latest = fold(&self.path, self.block_size, &self.source);
        let size = write_compact(&self.path, &self.source, &latest)?;
        let file = std::fs::OpenOptions::new().append(true).open(&self.path)?;
        Ok((file, size))
    }
}

/// What the log at `path` says now: each directory's latest listing with the changes
/// after it applied (nothing if it was written for another source).
fn fold(path: &Path, block_size: u64, source: &str) -> Logged {
    let mut latest = Logged::default();
    let Ok(f) = strata_cache_core::state_file::open_regular(path) else {
        return latest;
    };
    let mut lines = std::io::BufReader::new(f).lines().peekable();
    let first = lines.peek().and_then(|l| l.as_ref().ok()).cloned();
    let logged_for = first
        .as_deref()
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .and_then(|v| v.get("source").and_then(Value::as_str).map(String::from));
    let other_source = first.is_some() && logged_for.as_deref() != Some(source);
    if other_source {
        tracing::warn!(log = %path.display(), logged_for = ?logged_for, source,
            "the listing log was written for another store or prefix; not used");
    }
    for line in lines.take_while(|_| !other_source) {
        let Ok(line) = line else { break };
        match parse_line(&line, block_size) {
            Some(Line::Dir(dir, listing)) => {
                latest.dirs.insert(dir, listing);
            }
            Some(Line::File(obj)) => {
                latest.files.insert(obj.path.to_string(), obj);
            }
            Some(Line::Set(dir, name, obj)) => {
                if let Some((_, entries)) = latest.dirs.get_mut(&dir) {
                    match entries.iter_mut().find(|(n, _)| *n == name) {
                        Some(e) => e.1 = Some(obj.clone()),
                        None => entries.push((name, Some(obj.clone()))),
                    }
                }
                latest.files.insert(obj.path.to_string(), obj);
            }
            Some(Line::Folder(dir, name)) => {
                if let Some((_, entries)) = latest.dirs.get_mut(&dir) {
                    match entries.iter_mut().find(|(n, _)| *n == name) {
                        Some(e) => e.1 = None,
                        None => entries.push((name.clone(), None)),
                    }
                }
                // (The folder's own listing is not made up: it may be a folder of the
                // store with more in it; its files saved here are found by name.)
            }
            Some(Line::Gone(dir, name, path)) => {
                if let Some((_, entries)) = latest.dirs.get_mut(&dir) {
                    entries.retain(|(n, _)| *n != name);
                }
                latest.files.remove(&path);
            }
            None => {}
        }
    }
    latest
}

/// Writes `latest` as the log at `path` (aside, then renamed over, so a crash leaves
/// one or the other); its size.
fn write_compact(path: &Path, source: &str, latest: &Logged) -> std::io::Result<u64> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    writeln!(out, "{}", json!({ "source": source }))?;
    for (dir, (exists, entries)) in &latest.dirs {
        writeln!(out, "{}", line_of(dir, *exists, entries))?;
    }
    for obj in latest.files.values() {
        writeln!(out, "{}", file_line(obj))?;
    }
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    let size = file.metadata()?.len();
    std::fs::rename(&tmp, path)?;
    Ok(size)
}

fn obj_value(o: &ObjectInfo) -> Value {
    json!([
        o.size,
        &*o.version,
        o.has_etag,
        o.last_modified_unix_ns,
        &*o.path
    ])
}

fn obj_of(v: &[Value], block_size: u64) -> Option<ObjectInfo> {
    match v {
        [size, version, etag, mtime, path] => Some(ObjectInfo {
            size: size.as_u64()?,
            version: Arc::from(version.as_str()?),
            has_etag: etag.as_bool()?,
            last_modified_unix_ns: mtime.as_i64()?,
            path: Arc::from(path.as_str()?),
            block_size,
        }),
        _ => None,
    }
}

fn line_of(dir: &str, exists: bool, entries: &[(String, Option<ObjectInfo>)]) -> String {
    let entries: Vec<Value> = entries
        .iter()
        .map(|(name, obj)| match obj {
            None => json!([name]),
            Some(o) => json!([name, obj_value(o)]),
        })
        .collect();
    json!({ "dir": dir, "exists": exists, "entries": entries }).to_string()
}

fn file_line(obj: &ObjectInfo) -> String {
    json!({ "file": obj_value(obj) }).to_string()
}

enum Line {
    Dir(String, LoggedListing),
    File(ObjectInfo),
    /// (dir, name, object): uploaded through the mount.
    Set(String, String, ObjectInfo),
    /// (dir, name, path): removed (or renamed away) through the mount.
    Gone(String, String, String),
    /// (dir, name): a folder made (or renamed there) through the mount.
    Folder(String, String),
}

fn parse_line(line: &str, block_size: u64) -> Option<Line> {
    let v: Value = serde_json::from_str(line).ok()?;
    if let Some(f) = v.get("file") {
        return obj_of(f.as_array()?, block_size).map(Line::File);
    }
    if let Some(s) = v.get("set") {
        let [dir, name, obj] = s.as_array()?.as_slice() else {
            return None;
        };
        return Some(Line::Set(
            dir.as_str()?.to_string(),
            name.as_str()?.to_string(),
            obj_of(obj.as_array()?, block_size)?,
        ));
    }
    if let Some(f) = v.get("folder") {
        let [dir, name] = f.as_array()?.as_slice() else {
            return None;
        };
        return Some(Line::Folder(
            dir.as_str()?.to_string(),
            name.as_str()?.to_string(),
        ));
    }
    if let Some(g) = v.get("gone") {
        let [dir, name, path] = g.as_array()?.as_slice() else {
            return None;
        };
        return Some(Line::Gone(
            dir.as_str()?.to_string(),
            name.as_str()?.to_string(),
            path.as_str()?.to_string(),
        ));
    }
    let dir = v.get("dir")?.as_str()?.to_string();
    let exists = v.get("exists")?.as_bool()?;
    let mut entries = Vec::new();
    for e in v.get("entries")?.as_array()? {
        let e = e.as_array()?;
        let name = e.first()?.as_str()?.to_string();
        let obj = match e.len() {
            1 => None,
            2 => Some(obj_of(e[1].as_array()?, block_size)?),
            _ => return None,
        };
        entries.push((name, obj));
    }
    Some(Line::Dir(dir, (exists, entries)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(path: &str, size: u64) -> ObjectInfo {
        ObjectInfo {
            path: Arc::from(path),
            size,
            version: Arc::from("\"etag-1\""),
            has_etag: true,
            last_modified_unix_ns: 1_700_000_000_000_000_000,
            block_size: 1 << 20,
        }
    }

    /// What a run logged comes back at the next open, the latest listing of each
    /// directory and the objects looked up by name, and a torn last line is skipped.
    #[tokio::test]
    async fn listings_come_back_compacted_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m/listings.jsonl");
        {
            let (log, got) = ListingLog::open(&path, 1 << 20, SRC).expect("open");
            assert!(got.dirs.is_empty() && got.files.is_empty());
            log.append("d", true, vec![("old".into(), Some(obj("d/old", 1)))]);
            log.append(
                "d",
                true,
                vec![
                    ("a.bin".into(), Some(obj("d/a.bin", 3 << 20))),
                    ("sub".into(), None),
                ],
            );
            log.append("", true, vec![("d".into(), None)]);
            log.append_file(&obj("e/opened-by-name", 7));
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        write!(f, "{{\"dir\": \"torn\", \"exists\": tr").expect("torn line");
        drop(f);
        let (_, got) = ListingLog::open(&path, 1 << 20, SRC).expect("reopen");
        assert_eq!(got.dirs.len(), 2, "{got:?}");
        assert_eq!(got.files["e/opened-by-name"], obj("e/opened-by-name", 7));
        let (exists, entries) = &got.dirs["d"];
        assert!(*exists);
        assert_eq!(
            entries,
            &vec![
                ("a.bin".to_string(), Some(obj("d/a.bin", 3 << 20))),
                ("sub".to_string(), None)
            ]
        );
        assert_eq!(got.dirs[""].1, vec![("d".to_string(), None)]);
        // Compacted: the source, then one line per directory and per object.
        let lines = std::fs::read_to_string(&path)
            .expect("read")
            .lines()
            .count();
        assert_eq!(lines, 4);
        // A mount of another store or prefix at the same mountpoint sees none of it.
        let (_, got) = ListingLog::open(&path, 1 << 20, "s3://other|data").expect("other");
        assert!(got.dirs.is_empty() && got.files.is_empty(), "{got:?}");
        let (_, got) = ListingLog::open(&path, 1 << 20, SRC).expect("back");
        assert!(
            got.dirs.is_empty(),
            "the other source's open started it afresh"
        );
    }

    /// What the logs in these tests were written for.
    const SRC: &str = "s3://bucket|data";

    /// Crash finding: `rm b`, `mv c c2` and an overwrite of `a` through the mount, then a
    /// restart with the store silent, listed `a b c` again and served `a`'s replaced
    /// bytes. The changes are logged in order after the listing, and a reopen applies
    /// them: the log says what the mount last showed.
    #[test]
    fn changes_made_through_the_mount_come_back_applied() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m/listings.jsonl");
        let mut new_a = obj("d/a", 10);
        new_a.version = Arc::from("\"etag-2\"");
        {
            let (log, _) = ListingLog::open(&path, 1 << 20, SRC).expect("open");
            log.append(
                "d",
                true,
                vec![
                    ("a".into(), Some(obj("d/a", 1))),
                    ("b".into(), Some(obj("d/b", 1))),
                    ("c".into(), Some(obj("d/c", 1))),
                ],
            );
            log.append_file(&obj("d/b", 1));
            log.append_gone("d", "b", "d/b");
            log.append_gone("d", "c", "d/c");
            log.append_set("d", "c2", &obj("d/c2", 1));
            log.append_set("d", "a", &new_a);
            log.append_set("e", "x", &obj("e/x", 2)); // a directory never listed
                                                      // A folder made (or renamed into place) through the mount (black-box
                                                      // finding: missing from its parent after an offline restart).
            log.append_folder("d", "nd");
            log.append_set("d/nd", "f", &obj("d/nd/f", 3));
        }
        for _ in 0..2 {
            // Once from the appended lines, once more from their compaction.
            let (_, got) = ListingLog::open(&path, 1 << 20, SRC).expect("reopen");
            let (_, entries) = &got.dirs["d"];
            let mut names: Vec<_> = entries
                .iter()
                .map(|(n, o)| (n.clone(), o.clone()))
                .collect();
            names.sort_by(|x, y| x.0.cmp(&y.0));
            assert_eq!(
                names,
                vec![
                    ("a".to_string(), Some(new_a.clone())),
                    ("c2".to_string(), Some(obj("d/c2", 1))),
                    ("nd".to_string(), None),
                ]
            );
            assert_eq!(got.files["d/nd/f"], obj("d/nd/f", 3));
            assert!(
                !got.files.contains_key("d/b"),
                "a removed object is not found by name"
            );
            assert_eq!(got.files["d/a"], new_a);
            assert_eq!(got.files["e/x"], obj("e/x", 2));
            assert!(!got.dirs.contains_key("e"), "no listing is made up");
        }
    }

    /// Black-box finding: a writer creating and deleting files under an indefinite TTL
    /// grew the log ~180 bytes per change while the mount ran. It is compacted as it
    /// goes, and what it says stays the same.
    #[test]
    fn the_log_is_compacted_while_the_mount_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m/listings.jsonl");
        {
            let (log, _) = ListingLog::open(&path, 1 << 20, SRC).expect("open");
            log.append("d", true, vec![("keep".into(), Some(obj("d/keep", 1)))]);
            for i in 0..20_000 {
                let name = format!("tmp-{i}");
                log.append_set("d", &name, &obj(&format!("d/{name}"), 1));
                log.append_gone("d", &name, &format!("d/{name}"));
            }
            let size = std::fs::metadata(&path).expect("log").len();
            assert!(
                size < 2 * COMPACT_AFTER,
                "{size} bytes after 40,000 changes"
            );
        }
        let (_, got) = ListingLog::open(&path, 1 << 20, SRC).expect("reopen");
        let (_, entries) = &got.dirs["d"];
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].0, "keep");
        assert!(!got.files.contains_key("d/tmp-19999"));
    }
}
