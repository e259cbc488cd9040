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

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use strata_cache_core::ObjectInfo;

/// One directory as logged: whether it exists, and its entries (None: a sub-directory).
pub(super) type LoggedListing = (bool, Vec<(String, Option<ObjectInfo>)>);

/// Where a line lies in a log: its offset and length (without the newline).
type Span = (u64, u32);

/// What a run logged, as an index into the log compacted at open: the latest listing
/// of each directory and the objects looked up by name (a HEAD: a job that opens files
/// by name never lists their directory), each read back from the file when asked
/// ([`Self::dir`], [`Self::file`]). Only the index is held: a log of a million names
/// is not parsed into memory at every start (black-box finding: with listings held
/// whole, `find` over 400,000 names peaked ~100 MB higher at each compaction).
#[derive(Debug, Default)]
pub(super) struct Logged {
    /// The compacted log, kept open: a later compaction renames another file over it.
    file: Option<std::fs::File>,
    block_size: u64,
    dirs: HashMap<String, Span>,
    files: HashMap<String, Span>,
}

impl Logged {
    /// The listing of `dir` as logged.
    pub(super) fn dir(&self, dir: &str) -> Option<LoggedListing> {
        match self.read(*self.dirs.get(dir)?)? {
            Line::Dir(_, listing) => Some(listing),
            _ => None,
        }
    }

    /// The object `path` as logged (looked up by name, or written through the mount).
    pub(super) fn file(&self, path: &str) -> Option<ObjectInfo> {
        match self.read(*self.files.get(path)?)? {
            Line::File(obj) | Line::Set(_, _, obj) => Some(obj),
            _ => None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.dirs.is_empty() && self.files.is_empty()
    }

    #[cfg(test)]
    fn dirs_logged(&self) -> usize {
        self.dirs.len()
    }

    fn read(&self, span: Span) -> Option<Line> {
        read_line_at(self.file.as_ref()?, span, self.block_size)
    }
}

fn read_line_at(file: &std::fs::File, (offset, len): Span, block_size: u64) -> Option<Line> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset).ok()?;
    parse_line(std::str::from_utf8(&buf).ok()?, block_size)
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
        let (compacted, latest) = compact_file(path, source, block_size)?;
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
        let (size, _) = compact_file(&self.path, &self.source, self.block_size)?;
        let file = std::fs::OpenOptions::new().append(true).open(&self.path)?;
        Ok((file, size))
    }
}

/// Rewrites the log at `path` to what it says now (each directory's latest listing
/// with the changes after it applied, each object's latest line; nothing if it was
/// written for another source): its size, and the index of what it holds.
///
/// In two passes, so memory holds one directory's listing at a time, not the log: the
/// first notes where each directory's latest listing and its later changes lie, the
/// second reads each listing back, applies its changes and writes it out.
fn compact_file(path: &Path, source: &str, block_size: u64) -> std::io::Result<(u64, Logged)> {
    let (log, plan) = plan(path, source, block_size);
    write_compact(path, source, block_size, log.as_ref(), &plan)
}

/// Where a directory's latest listing lies in the log, and its changes after it.
#[derive(Debug)]
struct DirPlan {
    listing: Span,
    changes: Vec<Span>,
}

/// What compacting a log keeps: the lines of each directory and object it will write.
#[derive(Debug, Default)]
struct Plan {
    dirs: HashMap<String, DirPlan>,
    files: HashMap<String, Span>,
}

/// The first pass of [`compact_file`]: the log (None if absent or another source's)
/// and where what it says lies.
fn plan(path: &Path, source: &str, block_size: u64) -> (Option<std::fs::File>, Plan) {
    let mut plan = Plan::default();
    let Ok(f) = strata_cache_core::state_file::open_regular(path) else {
        return (None, plan);
    };
    let mut reader = std::io::BufReader::new(&f);
    let mut buf = Vec::new();
    let mut offset = 0u64;
    let mut first = true;
    loop {
        buf.clear();
        let n = match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let at = offset;
        offset += n as u64;
        let text = std::str::from_utf8(&buf).unwrap_or("");
        let text = text.strip_suffix('\n').unwrap_or(text);
        if std::mem::take(&mut first) {
            let logged_for = serde_json::from_str::<Value>(text)
                .ok()
                .and_then(|v| v.get("source").and_then(Value::as_str).map(String::from));
            if logged_for.as_deref() != Some(source) {
                tracing::warn!(log = %path.display(), logged_for = ?logged_for, source,
                    "the listing log was written for another store or prefix; not used");
                return (None, Plan::default());
            }
            continue;
        }
        let Ok(len) = u32::try_from(text.len()) else {
            continue;
        };
        let span = (at, len);
        // A torn or unreadable line is skipped.
        match parse_line(text, block_size) {
            Some(Line::Dir(dir, _)) => {
                plan.dirs.insert(
                    dir,
                    DirPlan {
                        listing: span,
                        changes: Vec::new(),
                    },
                );
            }
            Some(Line::File(obj)) => {
                plan.files.insert(obj.path.to_string(), span);
            }
            Some(Line::Set(dir, _, obj)) => {
                if let Some(d) = plan.dirs.get_mut(&dir) {
                    d.changes.push(span);
                }
                plan.files.insert(obj.path.to_string(), span);
            }
            Some(Line::Folder(dir, _)) => {
                // (The folder's own listing is not made up: it may be a folder of the
                // store with more in it; its files saved here are found by name.)
                if let Some(d) = plan.dirs.get_mut(&dir) {
                    d.changes.push(span);
                }
            }
            Some(Line::Gone(dir, _, path)) => {
                if let Some(d) = plan.dirs.get_mut(&dir) {
                    d.changes.push(span);
                }
                plan.files.remove(&path);
            }
            None => {}
        }
    }
    drop(reader);
    (Some(f), plan)
}

/// A change logged after a listing, applied to its entries by name.
fn apply(entries: &mut BTreeMap<String, Option<ObjectInfo>>, change: Line) {
    match change {
        Line::Set(_, name, obj) => {
            entries.insert(name, Some(obj));
        }
        Line::Folder(_, name) => {
            entries.insert(name, None);
        }
        Line::Gone(_, name, _) => {
            entries.remove(&name);
        }
        Line::Dir(..) | Line::File(_) => {}
    }
}

/// The second pass of [`compact_file`]: writes what `plan` keeps of `log` as the log at
/// `path` (aside, then renamed over, so a crash leaves one or the other).
fn write_compact(
    path: &Path,
    source: &str,
    block_size: u64,
    log: Option<&std::fs::File>,
    plan: &Plan,
) -> std::io::Result<(u64, Logged)> {
    let tmp = path.with_extension("jsonl.tmp");
    let created = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    let mut out = std::io::BufWriter::new(created);
    let mut logged = Logged {
        file: None,
        block_size,
        dirs: HashMap::new(),
        files: HashMap::new(),
    };
    let mut offset = 0u64;
    let mut put = |out: &mut std::io::BufWriter<std::fs::File>, line: String| {
        let span = (offset, u32::try_from(line.len()).unwrap_or(u32::MAX));
        offset += line.len() as u64 + 1;
        writeln!(out, "{line}").map(|()| span)
    };
    put(&mut out, json!({ "source": source }).to_string())?;
    if let Some(log) = log {
        for (dir, d) in &plan.dirs {
            let Some(Line::Dir(_, (exists, mut entries))) =
                read_line_at(log, d.listing, block_size)
            else {
                continue;
            };
            if !d.changes.is_empty() {
                let mut by_name: BTreeMap<_, _> = entries.into_iter().collect();
                for change in &d.changes {
                    if let Some(c) = read_line_at(log, *change, block_size) {
                        apply(&mut by_name, c);
                    }
                }
                entries = by_name.into_iter().collect();
            }
            let span = put(&mut out, line_of(dir, exists, &entries))?;
            logged.dirs.insert(dir.clone(), span);
        }
        for (name, at) in &plan.files {
            let obj = match read_line_at(log, *at, block_size) {
                Some(Line::File(obj) | Line::Set(_, _, obj)) => obj,
                _ => continue,
            };
            let span = put(&mut out, file_line(&obj))?;
            logged.files.insert(name.clone(), span);
        }
    }
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    let size = file.metadata()?.len();
    std::fs::rename(&tmp, path)?;
    logged.file = Some(file);
    Ok((size, logged))
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
            assert!(got.is_empty());
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
        assert_eq!(got.dirs_logged(), 2, "{got:?}");
        assert_eq!(
            got.file("e/opened-by-name").expect("e/opened-by-name"),
            obj("e/opened-by-name", 7)
        );
        let (exists, entries) = &got.dir("d").expect("d");
        assert!(*exists);
        assert_eq!(
            entries,
            &vec![
                ("a.bin".to_string(), Some(obj("d/a.bin", 3 << 20))),
                ("sub".to_string(), None)
            ]
        );
        assert_eq!(got.dir("").expect("root").1, vec![("d".to_string(), None)]);
        // Compacted: the source, then one line per directory and per object.
        let lines = std::fs::read_to_string(&path)
            .expect("read")
            .lines()
            .count();
        assert_eq!(lines, 4);
        // A mount of another store or prefix at the same mountpoint sees none of it.
        let (_, got) = ListingLog::open(&path, 1 << 20, "s3://other|data").expect("other");
        assert!(got.is_empty(), "{got:?}");
        let (_, got) = ListingLog::open(&path, 1 << 20, SRC).expect("back");
        assert!(got.is_empty(), "the other source's open started it afresh");
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
            let (_, entries) = &got.dir("d").expect("d");
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
            assert_eq!(got.file("d/nd/f").expect("d/nd/f"), obj("d/nd/f", 3));
            assert!(
                got.file("d/b").is_none(),
                "a removed object is not found by name"
            );
            assert_eq!(got.file("d/a").expect("d/a"), new_a);
            assert_eq!(got.file("e/x").expect("e/x"), obj("e/x", 2));
            assert!(got.dir("e").is_none(), "no listing is made up");
        }
    }

    /// What the start found logged is read back from the log compacted then, which
    /// later compactions rename another file over: it still answers, unchanged.
    #[test]
    fn what_a_start_found_survives_later_compactions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m/listings.jsonl");
        {
            let (log, _) = ListingLog::open(&path, 1 << 20, SRC).expect("open");
            log.append("d", true, vec![("a".into(), Some(obj("d/a", 1)))]);
            log.append_file(&obj("e/by-name", 2));
        }
        let (log, got) = ListingLog::open(&path, 1 << 20, SRC).expect("reopen");
        for i in 0..20_000 {
            log.append_set("d", &format!("n{i}"), &obj(&format!("d/n{i}"), 3));
        }
        assert!(std::fs::metadata(&path).expect("log").len() < 3 * COMPACT_AFTER);
        assert_eq!(
            got.dir("d").expect("d").1,
            vec![("a".to_string(), Some(obj("d/a", 1)))]
        );
        assert_eq!(got.file("e/by-name"), Some(obj("e/by-name", 2)));
        assert_eq!(got.file("d/n7"), None, "written after the start");
        drop(log);
        let (_, now) = ListingLog::open(&path, 1 << 20, SRC).expect("third open");
        assert_eq!(now.dir("d").expect("d").1.len(), 20_001);
        assert_eq!(now.file("d/n7"), Some(obj("d/n7", 3)));
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
        let (_, entries) = &got.dir("d").expect("d");
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].0, "keep");
        assert!(got.file("d/tmp-19999").is_none());
    }
}
