//! Which version of an object a read names: the version tag from a listing or HEAD
//! (ETag, or size and Last-Modified), the pin a ranged GET's answer must match so one
//! open file never mixes two versions, and a local file's tag (ctime and mtime too).

use std::sync::Arc;

use super::ObjectInfo;

pub(super) fn info_from_meta(meta: &object_store::ObjectMeta, block_size: u64) -> ObjectInfo {
    // Past what i64 nanoseconds hold (before 1677, after 2262-04-11): the nearest
    // that fits, not 1970 (black-box finding: a file of 2300 showed as 1970, ancient
    // to make and rsync).
    let ns =
        meta.last_modified
            .timestamp_nanos_opt()
            .unwrap_or(if meta.last_modified.timestamp() > 0 {
                i64::MAX
            } else {
                i64::MIN
            });
    let (version, has_etag) = match &meta.e_tag {
        Some(e) => (e.clone(), true),
        // Whole seconds: a LIST says milliseconds, a HEAD's header seconds, and both
        // must name the same blocks.
        None => (
            format!("{:x}-{:x}", meta.last_modified.timestamp(), meta.size),
            false,
        ),
    };
    ObjectInfo {
        path: Arc::from(meta.location.as_ref()),
        size: meta.size,
        version: Arc::from(version),
        has_etag,
        last_modified_unix_ns: ns,
        block_size,
    }
}

/// What a ranged GET's answer must show to be the version a reader opened: the same
/// ETag (sent as `If-Match`, and checked, since a store or gateway that ignores
/// If-Match would otherwise hand one open file two versions and put the new bytes in
/// the cache under the old version's keys: black-box finding), or, from a store that
/// gives no ETag, the same size and Last-Modified second (black-box finding: behind a
/// gateway that drops ETags, an object overwritten during a read was served as its
/// old first MiBs spliced to the new rest, and cached so under the old version).
#[derive(Debug)]
pub(super) struct VersionPin {
    pub(super) etag: Option<String>,
    pub(super) size: u64,
    pub(super) modified_secs: i64,
}

impl VersionPin {
    pub(super) fn of(obj: &ObjectInfo) -> Self {
        VersionPin {
            etag: obj.has_etag.then(|| etag_of(&obj.version).to_string()),
            size: obj.size,
            modified_secs: obj.last_modified_unix_ns.div_euclid(1_000_000_000),
        }
    }

    /// Why `got` (a response's metadata) is not the pinned version, if it is not.
    pub(super) fn mismatch(&self, got: &object_store::ObjectMeta) -> Option<String> {
        match (&self.etag, &got.e_tag) {
            (Some(want), Some(got)) if bare_etag(want) != bare_etag(got) => Some(format!(
                "asked for version {want}, the store answered {got}"
            )),
            // The same version at another size: the size the read was planned by (a
            // HEAD or listing answer) is wrong, and a block cut at it would be cached as
            // the version's (black-box finding: one HEAD answering 1,000 bytes short
            // served a short file without an error, then EIO for good at its last block
            // once the store answered right).
            (Some(_), Some(_)) if got.size != self.size => Some(format!(
                "the object is {} bytes, {} when opened (the same version: a listing or HEAD answered a wrong size)",
                got.size, self.size
            )),
            (Some(_), Some(_)) => None,
            // No ETag in the answer (none at all, or a store that drops it from GETs
            // while ignoring If-Match: black-box finding, the same splice): what the
            // answer does say must match.
            _ if got.size != self.size => Some(format!(
                "the object was {} bytes when opened and is {} bytes now",
                self.size, got.size
            )),
            // An answer without Last-Modified reads as the epoch: nothing to compare
            // (every read of such a store would otherwise be refused).
            _ if got.last_modified.timestamp() != self.modified_secs
                && got.last_modified.timestamp() != 0
                && self.modified_secs != 0 =>
            {
                Some(format!(
                    "the object was modified (Last-Modified {}) since it was opened",
                    got.last_modified
                ))
            }
            _ => None,
        }
    }
}

/// Separates `object_store`'s ETag from what [`local_version`] appends to it.
pub(super) const LOCAL_VERSION_SEP: &str = "+c";

/// The ETag to send as `If-Match` for a version tag (a local file's version is its
/// ETag plus the ctime and mtime in nanoseconds).
/// An ETag without its weak marker and quotes, as two answers may write one version.
pub(super) fn bare_etag(etag: &str) -> &str {
    etag.trim_start_matches("W/").trim_matches('"')
}

pub(super) fn etag_of(version: &str) -> &str {
    version
        .split_once(LOCAL_VERSION_SEP)
        .map_or(version, |(etag, _)| etag)
}

/// Version tag of a local file: `object_store`'s ETag (inode, mtime in µs, size) plus
/// the ctime and mtime to the nanosecond. A file rewritten in place gets a new ctime
/// whatever its mtime is set back to, so it gets a new version and new block keys.
pub(super) fn local_version(etag: &str, m: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    format!(
        "{etag}{LOCAL_VERSION_SEP}{:x}.{:x}m{:x}.{:x}",
        m.ctime(),
        m.ctime_nsec(),
        m.mtime(),
        m.mtime_nsec()
    )
}
