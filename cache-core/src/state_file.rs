//! The daemon's small state files (namespace bindings, listing logs, fsync records):
//! written atomically ([`write_atomically`]), and read without blocking on what is not
//! a regular file.
//!
//! A fifo (or a device) in place of one made a plain `open` wait for a writer that
//! never came: the start hung with nothing logged (crash finding). Opened with
//! `O_NONBLOCK` (no effect on a regular file's reads) and checked, such an entry is an
//! error naming it, which each caller handles as an unreadable file.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// `path` opened for reading if it is a regular file (following symlinks); an
/// `InvalidData` error naming it if it is anything else.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok(f)
}

/// Writes `file` (mode 0600) via `<file>.tmp`, fsync and rename, then syncs the
/// folder, so a crash leaves the old or the new version, never a torn one.
pub fn write_atomically(file: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomically_keep(file, bytes).map(drop)
}

/// [`write_atomically`], keeping the new file open for reading and writing: a caller
/// that next rewrites it in place (a fixed-size record) need not open it again.
pub fn write_atomically_keep(file: &Path, bytes: &[u8]) -> io::Result<File> {
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)?;
    if let Some(dir) = file.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(f)
}

/// The bytes of regular file `path` (see [`open_regular`]).
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    open_regular(path)?.read_to_end(&mut out)?;
    Ok(out)
}

/// The text of regular file `path` (see [`open_regular`]).
pub fn read_regular_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read_regular(path)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Most bytes of a file given by the operator (a configuration, a token, a key or a
/// certificate): such files are KiB, and a path naming something else (a device, a
/// log, a dataset) must be an error, not read whole (black-box finding: `--config
/// /dev/zero` grew to 19 GB in 10 s; a 1 GiB token_file got the daemon OOM-killed).
pub const OPERATOR_FILE_MAX: u64 = 4 << 20;

/// The bytes of an operator's file `path`: at most [`OPERATOR_FILE_MAX`], else an
/// `InvalidData` error naming it. Pipes are read (`--config <(envsubst < t)`), folders
/// are an error.
pub fn read_operator_file(path: &Path) -> io::Result<Vec<u8>> {
    let f = File::open(path)?;
    if f.metadata()?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is a folder", path.display()),
        ));
    }
    let mut out = Vec::new();
    f.take(OPERATOR_FILE_MAX + 1).read_to_end(&mut out)?;
    if out.len() as u64 > OPERATOR_FILE_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is larger than {} MiB: not a configuration, token, key or certificate",
                path.display(),
                OPERATOR_FILE_MAX >> 20
            ),
        ));
    }
    Ok(out)
}

/// [`read_operator_file`] as text.
pub fn read_operator_text(path: &Path) -> io::Result<String> {
    String::from_utf8(read_operator_file(path)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_file_is_read_within_its_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("strata.toml");
        std::fs::write(&f, "[cache]\n").expect("write");
        assert_eq!(read_operator_text(&f).expect("read"), "[cache]\n");
        let e = read_operator_file(Path::new("/dev/zero")).expect_err("endless");
        assert!(e.to_string().contains("larger than"), "{e}");
        let e = read_operator_file(dir.path()).expect_err("a folder");
        assert!(e.to_string().contains("folder"), "{e}");
        std::fs::write(&f, [0xff, 0xfe]).expect("write");
        assert!(read_operator_text(&f).is_err());
    }

    #[test]
    fn a_fifo_or_a_folder_is_an_error_at_once_a_file_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("state.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: `c` is a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_regular(&fifo).expect_err("a fifo");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(read_regular(dir.path()).is_err(), "a folder");
        let file = dir.path().join("ok.json");
        std::fs::write(&file, b"{}").expect("write");
        assert_eq!(read_regular_to_string(&file).expect("read"), "{}");
    }
}
