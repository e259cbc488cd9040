//! Turns `strace -f -ttt` output into trace reads: pure logic, no I/O (the one look-up
//! of a file's real path and size goes through the [`Lookup`] the caller passes).
//!
//! What it follows:
//!
//! - **File descriptors** per fd table: `open`/`openat`/`creat` make a new open file
//!   description (OFD) with its own offset; `dup`/`dup2`/`dup3`/`fcntl(F_DUPFD[_CLOEXEC])`
//!   make another fd onto the *same* OFD (one shared offset); `close`/`close_range` drop
//!   fds; `execve` drops close-on-exec fds; fds made by pipes, sockets and the like
//!   replace whatever the number meant before and are never recorded.
//! - **Processes and threads**: a `clone`/`clone3` with `CLONE_FILES` (threads) shares the
//!   parent's fd table, one without it (and `fork`/`vfork`) copies it, with every fd onto
//!   the parent's OFDs (a forked child moves the parent's offsets and the other way
//!   round, as in the kernel); `CLONE_FS` shares the working directory (`chdir`/`fchdir`).
//!   Strace prints a child's first lines before its parent's `clone` returns, so the
//!   parser reads every `clone` result first and builds a process when it first appears.
//! - **Offsets**: `read`/`readv` read at the OFD's offset and move it by the bytes
//!   returned; `pread64`/`preadv`/`preadv2` read at their own offset; `lseek` sets it to
//!   what the call returned. Copies the kernel makes from a file read it too, at the
//!   offset they are given (`[off]`) or else at the OFD's, moving it: `sendfile` (how
//!   Python's `shutil.copyfile` and web servers send a file), `copy_file_range` (GNU
//!   `cp`) and `splice`. Errors (`= -1 E...`), restarts (`= ? ERESTARTSYS`) and
//!   end of file (`= 0`) record nothing. Reads through `mmap` page faults are invisible
//!   to strace and are not in the trace; the mappings of files under the root are
//!   counted ([`ParseStats::file_maps`]) so that the recorder can say so; so are the
//!   io_uring instances set up ([`ParseStats::io_urings`]), whose reads strace does not
//!   see either.
//! - **Split calls**: `read(3,  <unfinished ...>` and a later `<... read resumed>...`
//!   of the same pid are joined into one call, timed at its start. Calls take effect in
//!   the order the kernel applies them: a call that makes an fd (`openat`, `dup`, ...) when
//!   it returns, one that uses or frees an fd (`read`, `lseek`, `close`, ...) when it
//!   starts. The kernel frees a closed fd on entry, so another thread's `openat` can be
//!   given that number while strace still shows the `close` unfinished; applying the
//!   close at its resumption would drop the new file's reads.
//! - **Jobs, one per process group**: the traced command starts its own group (named by
//!   its pid); a child inherits its parent's group; `setpgid(p, g)` and `setsid()` move
//!   a process. A job is named `<program>-<pgid>`, the program being the base name of
//!   the last `execve` of the group's leader (or the program it was forked running; `pg`
//!   when none was traced).
//!
//! Only reads of regular files under the root are kept, with their path relative to it
//! (after the [`Lookup`] resolves symbolic links); reads of anything else only move
//! offsets.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::trace::{Trace, TraceBuilder};

/// What the parser asks of the file system: for an absolute path, the regular file's
/// real (symlink-free) path and size, or `None` when it is not a regular file or is gone.
pub trait Lookup {
    fn regular_file(&mut self, abs: &Path) -> Option<(PathBuf, u64)>;

    /// For a path that no longer exists (removed or renamed before the run ended), its
    /// real path as it was: its folder's real path and its name. `None`: it exists, or
    /// its folder is gone too.
    fn gone(&mut self, _abs: &Path) -> Option<PathBuf> {
        None
    }
}

/// The real file system (`canonicalize` and `metadata`).
pub struct FsLookup;

impl Lookup for FsLookup {
    fn regular_file(&mut self, abs: &Path) -> Option<(PathBuf, u64)> {
        let real = std::fs::canonicalize(abs).ok()?;
        let md = std::fs::metadata(&real).ok()?;
        md.is_file().then_some((real, md.len()))
    }

    fn gone(&mut self, abs: &Path) -> Option<PathBuf> {
        match std::fs::symlink_metadata(abs) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let dir = std::fs::canonicalize(abs.parent()?).ok()?;
                Some(dir.join(abs.file_name()?))
            }
            _ => None,
        }
    }
}

/// Counts of what the parser saw, for the summary and error messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParseStats {
    pub lines: usize,
    pub calls: usize,
    pub processes: usize,
    /// Reads (with data) of files kept in the trace.
    pub reads: usize,
    /// Reads (with data) of regular files outside the root, or of other fds we follow.
    pub reads_elsewhere: usize,
    /// Lines that looked like calls but did not parse (skipped).
    pub malformed: usize,
    /// Mappings (`mmap` of an fd) of files under the root, and their bytes: reads
    /// through them are page faults strace cannot see, so they are not in the trace.
    pub file_maps: usize,
    pub file_map_bytes: u64,
    /// io_uring instances set up: reads submitted through one are not in the trace.
    pub io_urings: usize,
    /// Reads (with data) of descriptors the command inherited that name no file the
    /// recorder saw (a pipe or a terminal on stdin): not in the trace. (Inherited
    /// regular files are followed: `parse_strace_inheriting`.)
    pub reads_inherited: usize,
    /// Linux AIO contexts set up (`io_setup`): reads submitted through one are not in
    /// the trace.
    pub aio_contexts: usize,
    /// Reads (with data) of descriptors received over a socket (`SCM_RIGHTS`): the
    /// recorder does not know their files, so they are not in the trace.
    pub reads_received: usize,
    /// Files under the root read and gone (removed or renamed) by the end of the run:
    /// kept under the name they were opened by, sized by the furthest byte read.
    pub files_gone: usize,
    /// The command exited leaving processes running in the background, which were not
    /// traced past a grace period (set by the recorder, not the parser).
    pub left_background: bool,
}

/// One read before the trace is built (sizes are fixed at the end).
struct RawRead {
    ts_ns: u64,
    pgid: u32,
    file: u32,
    offset: u64,
    len: u64,
}

/// An open file description: what was opened, and the one offset its fds share.
struct Ofd {
    /// Absolute path as opened (for `openat` relative to a directory fd, `fchdir`).
    abs: Option<Arc<Path>>,
    /// Index into `Parser::files` when it is a regular file under the root.
    file: Option<u32>,
    offset: u64,
    /// Received over a socket: its reads are counted in
    /// [`ParseStats::reads_received`].
    received: bool,
    /// The other end, for one end of a `socketpair`: descriptors sent on this end
    /// are received on that one.
    peer: Option<usize>,
}

#[derive(Clone, Copy)]
struct Fd {
    ofd: usize,
    cloexec: bool,
}

#[derive(Clone, Copy)]
struct Proc {
    /// Index of its fd table (shared by threads).
    files: usize,
    /// Index of its working directory (shared with `CLONE_FS`).
    fs: usize,
    pgid: u32,
}

/// A `clone`'s result, read before the main pass.
#[derive(Clone, Copy)]
struct Birth {
    parent: u32,
    share_files: bool,
    share_fs: bool,
}

struct Parser<'a, L: Lookup> {
    root: PathBuf,
    lookup: &'a mut L,
    t0: Option<u64>,
    /// Each pid's births in the order they happened: a pid the kernel hands out again
    /// after its process exited is another process (black-box finding: a recycled pid
    /// kept the dead process's fd table, and its reads of one file were recorded as
    /// another's).
    births: HashMap<u32, std::collections::VecDeque<Birth>>,
    procs: HashMap<u32, Proc>,
    tables: Vec<HashMap<i32, Fd>>,
    /// Descriptors the top process starts with (see [`parse_strace_inheriting`]).
    inherited: Vec<InheritedFd>,
    cwds: Vec<Arc<Path>>,
    ofds: Vec<Ofd>,
    /// Regular files under the root: relative path, size at look-up, and whether it
    /// was gone then.
    files: Vec<(String, u64, bool)>,
    file_ids: HashMap<Arc<Path>, Option<u32>>,
    /// Base name of each pid's last `execve`.
    exe: HashMap<u32, String>,
    reads: Vec<RawRead>,
    /// Open file descriptions sent (`SCM_RIGHTS`) to each socketpair end, not yet
    /// received there, in the order sent.
    in_transit: HashMap<usize, std::collections::VecDeque<usize>>,
    stats: ParseStats,
    top: Option<u32>,
    initial_cwd: Arc<Path>,
}

/// One whole call: `name(args) = ret`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Call<'a> {
    pub name: &'a str,
    pub args: Vec<&'a str>,
    /// The return value when it is a number (`-1` for errors); `None` for `?`.
    pub ret: Option<i64>,
}

/// Parses strace output (`strace -f -ttt`, pids on every line) into a trace. `root` and
/// `cwd` (the command's starting directory) are absolute; `root` should be free of
/// symbolic links (the [`Lookup`]'s real paths are compared with it).
pub fn parse_strace<L: Lookup>(
    text: &str,
    root: &Path,
    cwd: &Path,
    lookup: &mut L,
) -> (Trace, ParseStats) {
    parse_strace_inheriting(text, root, cwd, &[], lookup)
}

/// A descriptor the command inherits open (stdin redirected from a file): its number,
/// the file's absolute path and its offset when the command starts.
pub type InheritedFd = (i32, std::path::PathBuf, u64);

/// [`parse_strace`] of a command that started with `inherited` open (black-box
/// finding: `sh -c 'cat; ...' < data/a` lost every read of `a`).
pub fn parse_strace_inheriting<L: Lookup>(
    text: &str,
    root: &Path,
    cwd: &Path,
    inherited: &[InheritedFd],
    lookup: &mut L,
) -> (Trace, ParseStats) {
    let mut p = Parser {
        inherited: inherited.to_vec(),
        root: root.to_path_buf(),
        lookup,
        t0: None,
        births: HashMap::new(),
        procs: HashMap::new(),
        tables: Vec::new(),
        cwds: Vec::new(),
        ofds: Vec::new(),
        files: Vec::new(),
        file_ids: HashMap::new(),
        exe: HashMap::new(),
        reads: Vec::new(),
        in_transit: HashMap::new(),
        stats: ParseStats::default(),
        top: None,
        initial_cwd: Arc::from(cwd),
    };
    let calls = join_lines(text, &mut p.stats);
    p.t0 = calls.iter().map(|c| c.1).min();
    // Pass 1: who was born of whom, with what sharing.
    for (pid, _, line) in &calls {
        if let Some(c) = parse_call(line) {
            if let Some(child) = c.ret.filter(|&r| r > 0) {
                if let Some(b) = birth(&c, *pid) {
                    p.births.entry(child as u32).or_default().push_back(b);
                }
            }
        }
    }
    // Pass 2: everything else, in the order the calls completed.
    for (pid, ts, line) in &calls {
        if line == EXITED {
            p.procs.remove(pid);
            continue;
        }
        match parse_call(line) {
            Some(c) => {
                p.stats.calls += 1;
                p.call(*pid, *ts, &c);
            }
            None => p.stats.malformed += 1,
        }
    }
    let trace = p.build();
    (trace, p.stats)
}

/// Calls whose effect on the fd table or an offset happens when they start: the kernel
/// looks the fd up (and, for `close`, frees it) on entry. Every other split call takes
/// effect when it returns (an fd is handed out at the end of `openat`).
const EFFECT_AT_START: &[&str] = &[
    "read",
    "readv",
    "write",
    "writev",
    "sendfile",
    "sendfile64",
    "copy_file_range",
    "splice",
    "pread64",
    "preadv",
    "preadv2",
    "pwritev2",
    "lseek",
    "close",
    "close_range",
    "sendmsg",
];

/// The text [`join_lines`] gives a process's exit (`+++ exited with N +++`).
const EXITED: &str = "+++";

/// A joined call: `(pid, ts_us, call text)`.
type JoinedCall<'a> = (u32, u64, std::borrow::Cow<'a, str>);

/// Splits lines into `(pid, ts_us, call text)`, joining `<unfinished ...>` with its
/// `<... resumed>` and placing the joined call where it takes effect (see
/// [`EFFECT_AT_START`]); signals, exit notes and calls that never resumed are dropped.
fn join_lines<'a>(text: &'a str, stats: &mut ParseStats) -> Vec<JoinedCall<'a>> {
    // pid -> (start ts, head text, the slot reserved at the start, if any)
    let mut pending: HashMap<u32, (u64, &'a str, Option<usize>)> = HashMap::new();
    let mut out: Vec<Option<JoinedCall<'a>>> = Vec::new();
    // The monotonic time of the last line (see `split_prefix`).
    let mut mono: Option<u64> = None;
    for line in text.lines() {
        stats.lines += 1;
        let Some((pid, wall, delta, rest)) = split_prefix(line) else {
            continue;
        };
        let ts = match delta {
            Some(d) => *mono.insert(mono.map_or(wall, |m| m + d)),
            None => wall,
        };
        if rest.starts_with("+++") {
            // `+++ exited with 0 +++`, `+++ killed by SIGKILL +++`: the pid is free.
            out.push(Some((pid, ts, EXITED.into())));
            continue;
        }
        if rest.starts_with("---") {
            continue;
        }
        if let Some(head) = rest.strip_suffix("<unfinished ...>") {
            let name = head.split('(').next().unwrap_or_default();
            let slot = EFFECT_AT_START.contains(&name).then(|| {
                out.push(None);
                out.len() - 1
            });
            pending.insert(pid, (ts, head.strip_suffix(' ').unwrap_or(head), slot));
            continue;
        }
        if let Some(tail) = rest.strip_prefix("<... ") {
            // `<... read resumed>rest`: glue onto the pending head of this pid.
            let Some(end) = tail.find(" resumed>") else {
                continue;
            };
            let Some((start_ts, head, slot)) = pending.remove(&pid) else {
                continue;
            };
            let resumed = &tail[end + " resumed>".len()..];
            let call = Some((pid, start_ts, format!("{head}{resumed}").into()));
            match slot {
                Some(i) => out[i] = call,
                None => out.push(call),
            }
            continue;
        }
        out.push(Some((pid, ts, rest.into())));
    }
    out.into_iter().flatten().collect()
}

/// `PID  SECS.USECS [(+ SECS.USECS)] rest` → `(pid, wall µs, delta µs, rest)`.
///
/// The delta (strace `-r`) is the monotonic time since the previous line: the
/// recorder times calls by adding them up from the first line's wall time, so a step
/// of the wall clock while it records (NTP, chrony's `makestep`) neither reorders the
/// trace nor inserts a gap (black-box finding: a 1 h step back listed f6..f8 before
/// f1..f5 over a 3,599.5 s span). Logs without deltas are timed by the wall clock.
fn split_prefix(line: &str) -> Option<(u32, u64, Option<u64>, &str)> {
    let line = line.trim_start();
    let (pid, rest) = line.split_once(' ')?;
    let pid: u32 = pid.parse().ok()?;
    let rest = rest.trim_start();
    let (ts, rest) = rest.split_once(' ')?;
    let t = secs_to_us(ts)?;
    match rest.strip_prefix("(+") {
        Some(delta) => {
            let (d, rest) = delta.split_once(')')?;
            Some((pid, t, Some(secs_to_us(d.trim())?), rest.trim_start()))
        }
        None => Some((pid, t, None, rest)),
    }
}

/// `SECS.USECS` → microseconds.
fn secs_to_us(ts: &str) -> Option<u64> {
    let (s, us) = ts.split_once('.')?;
    let us = format!("{us:0<6}");
    Some(s.parse::<u64>().ok()? * 1_000_000 + us.get(..6)?.parse::<u64>().ok()?)
}

/// Parses `name(args) = ret ...`; the args are split at top-level commas, respecting
/// strings (with escapes) and brackets.
pub(crate) fn parse_call(s: &str) -> Option<Call<'_>> {
    let open = s.find('(')?;
    let name = &s[..open];
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    let bytes = s.as_bytes();
    let mut depth = 0i32;
    let mut in_str = false;
    let mut args = Vec::new();
    let mut start = open + 1;
    let mut i = open + 1;
    let mut close = None;
    while i < bytes.len() {
        let b = bytes[i];
        if in_str {
            match b {
                b'\\' => i += 1,
                b'"' => in_str = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_str = true,
                b'(' | b'[' | b'{' => depth += 1,
                b')' if depth == 0 => {
                    close = Some(i);
                    break;
                }
                b')' | b']' | b'}' => depth -= 1,
                b',' if depth == 0 => {
                    args.push(s[start..i].trim());
                    start = i + 1;
                }
                _ => {}
            }
        }
        i += 1;
    }
    let close = close?;
    let last = s[start..close].trim();
    if !last.is_empty() || !args.is_empty() {
        args.push(last);
    }
    let rest = s[close + 1..].trim_start().strip_prefix('=')?.trim_start();
    let tok = rest.split_whitespace().next()?;
    let ret = if tok == "?" {
        None
    } else if let Some(hex) = tok.strip_prefix("0x") {
        Some(i64::from_str_radix(hex, 16).ok()?)
    } else {
        Some(tok.parse().ok()?)
    };
    Some(Call { name, args, ret })
}

/// The sharing a successful `clone`/`clone3`/`fork`/`vfork` of `parent` asks for.
fn birth(c: &Call<'_>, parent: u32) -> Option<Birth> {
    let flags = match c.name {
        "clone" => c
            .args
            .iter()
            .find_map(|a| a.strip_prefix("flags="))
            .unwrap_or(""),
        "clone3" => {
            let a = c.args.first()?;
            let i = a.find("flags=")?;
            let f = &a[i + "flags=".len()..];
            &f[..f.find([',', '}']).unwrap_or(f.len())]
        }
        "fork" | "vfork" => "",
        _ => return None,
    };
    let has = |f: &str| flags.split('|').any(|x| x.trim() == f);
    Some(Birth {
        parent,
        share_files: has("CLONE_FILES"),
        share_fs: has("CLONE_FS"),
    })
}

/// An unquoted strace string (`"a\"b"` → `a"b`), with octal and C escapes: a path's
/// raw bytes, UTF-8 or not.
fn unquote(s: &str) -> Option<std::ffi::OsString> {
    let inner = s.strip_prefix('"')?;
    let inner = inner.strip_suffix("\"...").or(inner.strip_suffix('"'))?;
    let mut out = Vec::with_capacity(inner.len());
    let b = inner.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        i += 1;
        let c = *b.get(i)?;
        i += 1;
        match c {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'v' => out.push(0x0b),
            b'f' => out.push(0x0c),
            b'x' => {
                let h = inner.get(i..i + 2)?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                let mut n = 1;
                while n < 3 && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                    v = v * 8 + u32::from(b[i] - b'0');
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    use std::os::unix::ffi::OsStringExt;
    Some(std::ffi::OsString::from_vec(out))
}

/// The value of an offset argument strace prints as `[5000]` (or `[0] => [4096]`, the
/// value at entry first); `None` for `NULL`.
fn bracketed_num(s: &str) -> Option<u64> {
    let inner = s.strip_prefix('[')?;
    let end = inner.find(']')?;
    inner[..end].trim().parse().ok()
}

fn num(s: &str) -> Option<i64> {
    if let Some(h) = s.strip_prefix("0x") {
        i64::from_str_radix(h, 16).ok()
    } else {
        s.parse().ok()
    }
}

/// The descriptors a `pipe`, `pipe2` or `socketpair` made: its `[3, 4]` argument.
fn fd_pair(c: &Call<'_>) -> Vec<i64> {
    c.args
        .iter()
        .find(|s| s.starts_with('['))
        .map(|s| {
            s.trim_matches(['[', ']'])
                .split(',')
                .filter_map(|x| num(x.trim()))
                .collect()
        })
        .unwrap_or_default()
}

/// The descriptors a `sendmsg` sent or a `recvmsg` received: the numbers in
/// `cmsg_data=[...]` of its `SCM_RIGHTS` control messages.
fn scm_rights_fds(c: &Call<'_>) -> Vec<i64> {
    let Some(msg) = c.args.get(1) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut rest = *msg;
    while let Some(i) = rest.find("SCM_RIGHTS") {
        rest = &rest[i..];
        let Some(j) = rest.find("cmsg_data=[") else {
            break;
        };
        rest = &rest[j + "cmsg_data=[".len()..];
        let end = rest.find(']').unwrap_or(rest.len());
        out.extend(rest[..end].split(',').filter_map(|x| num(x.trim())));
        rest = &rest[end..];
    }
    out
}

/// `/a/./b/../c` → `/a/c` (lexically; symbolic links are the [`Lookup`]'s business).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(x) => out.push(x),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

impl<L: Lookup> Parser<'_, L> {
    /// The process `pid`, built on first sight from its birth record (or as the top
    /// process, the first one seen, in its own group).
    fn proc(&mut self, pid: u32) -> Proc {
        if let Some(p) = self.procs.get(&pid) {
            return *p;
        }
        // A child's first line may come before any of its parent's (a thread started
        // while the parent sat in `clone`): build the parent first, as it was then.
        let parent = self
            .births
            .get_mut(&pid)
            .and_then(|q| q.pop_front())
            .filter(|b| b.parent != pid);
        let p = match parent {
            Some(b) => {
                let pp = self.proc(b.parent);
                let files = if b.share_files {
                    pp.files
                } else {
                    self.tables.push(self.tables[pp.files].clone());
                    self.tables.len() - 1
                };
                let fs = if b.share_fs {
                    pp.fs
                } else {
                    self.cwds.push(self.cwds[pp.fs].clone());
                    self.cwds.len() - 1
                };
                Proc {
                    files,
                    fs,
                    pgid: pp.pgid,
                }
            }
            None => {
                // The top process (or one whose parent was never seen): a group of its own.
                let first = self.top.is_none();
                self.top.get_or_insert(pid);
                let mut table = HashMap::new();
                if first {
                    for (fd, path, offset) in std::mem::take(&mut self.inherited) {
                        let abs: Arc<Path> = Arc::from(path.as_path());
                        let file = self.file_of(&abs);
                        let ofd = self.new_ofd(Some(abs), file);
                        self.ofds[ofd].offset = offset;
                        table.insert(
                            fd,
                            Fd {
                                ofd,
                                cloexec: false,
                            },
                        );
                    }
                }
                self.tables.push(table);
                self.cwds.push(self.initial_cwd.clone());
                Proc {
                    files: self.tables.len() - 1,
                    fs: self.cwds.len() - 1,
                    pgid: pid,
                }
            }
        };
        // A child runs its parent's program until it calls execve.
        if let Some(exe) = parent.and_then(|b| self.exe.get(&b.parent)).cloned() {
            self.exe.insert(pid, exe);
        }
        self.stats.processes += 1;
        self.procs.insert(pid, p);
        p
    }

    fn fd(&self, p: Proc, fd: i64) -> Option<Fd> {
        self.tables[p.files].get(&i32::try_from(fd).ok()?).copied()
    }

    fn set_fd(&mut self, p: Proc, fd: i64, ofd: usize, cloexec: bool) {
        if let Ok(fd) = i32::try_from(fd) {
            self.tables[p.files].insert(fd, Fd { ofd, cloexec });
        }
    }

    /// The absolute path of `path` as `pid` names it, relative to `dirfd` (`AT_FDCWD` or
    /// an fd naming a directory).
    fn resolve(&self, p: Proc, dirfd: Option<&str>, path: &std::ffi::OsStr) -> Option<Arc<Path>> {
        let path = Path::new(path);
        if path.is_absolute() {
            return Some(Arc::from(normalize(path)));
        }
        let base: Arc<Path> = match dirfd {
            None | Some("AT_FDCWD") => self.cwds[p.fs].clone(),
            Some(d) => {
                let fd = self.fd(p, num(d)?)?;
                self.ofds[fd.ofd].abs.clone()?
            }
        };
        Some(Arc::from(normalize(&base.join(path))))
    }

    /// The file id of `abs` when it is a regular file under the root.
    fn file_of(&mut self, abs: &Arc<Path>) -> Option<u32> {
        if let Some(id) = self.file_ids.get(abs) {
            return *id;
        }
        // A file gone by the end of the run (the recorder looks files up then) is kept
        // under the name it was opened by, sized by what was read of it (black-box
        // finding: reads of files removed or renamed before the command ended were
        // dropped without a word).
        let found = match self.lookup.regular_file(abs) {
            Some((real, size)) => Some((real, size, false)),
            None => self.lookup.gone(abs).map(|real| (real, 0, true)),
        };
        let id = found.and_then(|(real, size, gone)| {
            let rel = trace_name(real.strip_prefix(&self.root).ok()?);
            if rel.is_empty() {
                return None;
            }
            self.files.push((rel, size, gone));
            Some((self.files.len() - 1) as u32)
        });
        self.file_ids.insert(abs.clone(), id);
        id
    }

    fn new_ofd(&mut self, abs: Option<Arc<Path>>, file: Option<u32>) -> usize {
        self.ofds.push(Ofd {
            abs,
            file,
            offset: 0,
            received: false,
            peer: None,
        });
        self.ofds.len() - 1
    }

    fn read(&mut self, p: Proc, ts: u64, fd: i64, at: Option<u64>, n: i64) {
        let Some(f) = self.fd(p, fd) else {
            if n > 0 {
                self.stats.reads_inherited += 1;
            }
            return;
        };
        let Ok(n) = u64::try_from(n) else { return };
        let o = &mut self.ofds[f.ofd];
        let offset = match at {
            Some(a) => a,
            None => {
                let off = o.offset;
                o.offset += n;
                off
            }
        };
        if n == 0 {
            return;
        }
        match o.file {
            Some(file) => {
                self.stats.reads += 1;
                self.reads.push(RawRead {
                    ts_ns: ts.saturating_sub(self.t0.unwrap_or(ts)) * 1000,
                    pgid: p.pgid,
                    file,
                    offset,
                    len: n,
                });
            }
            None if o.received => self.stats.reads_received += 1,
            None => self.stats.reads_elsewhere += 1,
        }
    }

    fn call(&mut self, pid: u32, ts: u64, c: &Call<'_>) {
        let p = self.proc(pid);
        let Some(ret) = c.ret else { return };
        if ret < 0 {
            return;
        }
        let a = |i: usize| c.args.get(i).copied();
        let arg_num = |i: usize| a(i).and_then(num);
        match c.name {
            "open" | "openat" | "creat" | "openat2" => {
                let (dirfd, pi, fi) = match c.name {
                    "open" | "creat" => (None, 0, 1),
                    _ => (a(0), 1, 2),
                };
                let Some(path) = a(pi).and_then(unquote) else {
                    return;
                };
                let abs = self.resolve(p, dirfd, &path);
                let file = abs.as_ref().and_then(|abs| self.file_of(abs));
                let cloexec = a(fi).is_some_and(|f| f.contains("O_CLOEXEC"));
                let ofd = self.new_ofd(abs, file);
                self.set_fd(p, ret, ofd, cloexec);
            }
            "close" => {
                if let Some(fd) = arg_num(0).and_then(|f| i32::try_from(f).ok()) {
                    self.tables[p.files].remove(&fd);
                }
            }
            "close_range" => {
                let (Some(lo), Some(hi)) = (arg_num(0), a(1)) else {
                    return;
                };
                if a(2).is_some_and(|f| f.contains("CLOSE_RANGE_CLOEXEC")) {
                    return; // only marks them; execve drops them
                }
                let hi = num(hi).unwrap_or(i64::from(i32::MAX));
                self.tables[p.files].retain(|&fd, _| i64::from(fd) < lo || i64::from(fd) > hi);
            }
            "dup" | "dup2" | "dup3" => {
                let Some(old) = arg_num(0).and_then(|f| self.fd(p, f)) else {
                    self.drop_fd(p, ret);
                    return;
                };
                let cloexec = c.name == "dup3" && a(2).is_some_and(|f| f.contains("O_CLOEXEC"));
                self.set_fd(p, ret, old.ofd, cloexec);
            }
            "fcntl" | "fcntl64" => match a(1) {
                Some(cmd @ ("F_DUPFD" | "F_DUPFD_CLOEXEC")) => {
                    match arg_num(0).and_then(|f| self.fd(p, f)) {
                        Some(old) => self.set_fd(p, ret, old.ofd, cmd == "F_DUPFD_CLOEXEC"),
                        None => self.drop_fd(p, ret),
                    }
                }
                Some("F_SETFD") => {
                    if let (Some(fd), Some(flag)) = (arg_num(0), a(2)) {
                        if let Some(e) = i32::try_from(fd)
                            .ok()
                            .and_then(|fd| self.tables[p.files].get_mut(&fd))
                        {
                            e.cloexec = flag.contains("FD_CLOEXEC") || flag == "1";
                        }
                    }
                }
                _ => {}
            },
            "read" | "readv" => {
                if let Some(fd) = arg_num(0) {
                    self.read(p, ts, fd, None, ret);
                }
            }
            // A write moves the offset a later read starts at (black-box finding: reads
            // after a write on an O_RDWR fd were recorded where the write began).
            "write" | "writev" => {
                if let (Some(f), Ok(n)) =
                    (arg_num(0).and_then(|f| self.fd(p, f)), u64::try_from(ret))
                {
                    self.ofds[f.ofd].offset += n;
                }
            }
            // `preadv2` at offset -1 reads at the OFD's offset and moves it, as `read`
            // (black-box finding: such reads were dropped, and later offsets were off).
            "pread64" | "preadv" | "preadv2" => match (arg_num(0), a(3).and_then(num)) {
                (Some(fd), Some(-1)) if c.name == "preadv2" => self.read(p, ts, fd, None, ret),
                (Some(fd), Some(at)) => {
                    if let Ok(at) = u64::try_from(at) {
                        self.read(p, ts, fd, Some(at), ret);
                    }
                }
                _ => {}
            },
            // So does `pwritev2` at -1 (a write at its own offset moves nothing).
            "pwritev2" => {
                if let (Some(f), Some(-1), Ok(n)) = (
                    arg_num(0).and_then(|f| self.fd(p, f)),
                    a(3).and_then(num),
                    u64::try_from(ret),
                ) {
                    self.ofds[f.ofd].offset += n;
                }
            }
            // A thread that unshares its fd table gets a private copy of it: what it
            // opens or closes from then on is not the other threads'.
            "unshare" if a(0).is_some_and(|f| f.split('|').any(|x| x.trim() == "CLONE_FILES")) => {
                let t = self.tables[p.files].clone();
                self.tables.push(t);
                let files = self.tables.len() - 1;
                if let Some(pr) = self.procs.get_mut(&pid) {
                    pr.files = files;
                }
            }
            // Linux AIO reads are not system calls strace sees either.
            "io_setup" => self.stats.aio_contexts += 1,
            // A descriptor received over a socket (`SCM_RIGHTS`) names a file the
            // recorder did not see opened: its reads are counted apart.
            "recvmsg" | "recvmmsg" => {
                let end = arg_num(0).and_then(|f| self.fd(p, f)).map(|f| f.ofd);
                for fd in scm_rights_fds(c) {
                    // Sent on the other end of a socketpair: the same open file
                    // description (one offset), as the kernel passes it.
                    let sent = end
                        .and_then(|e| self.in_transit.get_mut(&e))
                        .and_then(|q| q.pop_front());
                    let ofd = sent.unwrap_or_else(|| {
                        let ofd = self.new_ofd(None, None);
                        self.ofds[ofd].received = true;
                        ofd
                    });
                    self.set_fd(p, fd, ofd, false);
                }
            }
            // A copy out of a file: (the source fd's argument, its offset's argument);
            // a `NULL` offset reads at the OFD's and moves it.
            "sendfile" | "sendfile64" | "copy_file_range" | "splice" => {
                let (fd, off) = if c.name.starts_with("sendfile") {
                    (1, 2)
                } else {
                    (0, 1)
                };
                let at = a(off).and_then(bracketed_num);
                if let Some(fd) = arg_num(fd) {
                    self.read(p, ts, fd, at, ret);
                }
            }
            "mmap" => {
                let mapped = arg_num(4).and_then(|fd| self.fd(p, fd));
                if mapped.is_some_and(|f| self.ofds[f.ofd].file.is_some()) {
                    self.stats.file_maps += 1;
                    self.stats.file_map_bytes += a(1).and_then(num).map_or(0, |n| n.max(0) as u64);
                }
            }
            "lseek" => {
                if let Some(f) = arg_num(0).and_then(|f| self.fd(p, f)) {
                    self.ofds[f.ofd].offset = ret as u64;
                }
            }
            "execve" | "execveat" => {
                // The process gets a private table without its close-on-exec fds.
                let mut t = self.tables[p.files].clone();
                t.retain(|_, fd| !fd.cloexec);
                self.tables.push(t);
                let files = self.tables.len() - 1;
                if let Some(pr) = self.procs.get_mut(&pid) {
                    pr.files = files;
                }
                let path = a(if c.name == "execve" { 0 } else { 1 }).and_then(unquote);
                if let Some(path) = path {
                    let base = Path::new(&path)
                        .file_name()
                        .and_then(|n| n.to_str())
                        .unwrap_or("pg");
                    self.exe.insert(pid, base.to_string());
                }
            }
            "chdir" => {
                if let Some(abs) = a(0)
                    .and_then(unquote)
                    .and_then(|path| self.resolve(p, None, &path))
                {
                    self.cwds[p.fs] = abs;
                }
            }
            "fchdir" => {
                let abs = arg_num(0)
                    .and_then(|f| self.fd(p, f))
                    .and_then(|f| self.ofds[f.ofd].abs.clone());
                if let Some(abs) = abs {
                    self.cwds[p.fs] = abs;
                }
            }
            "setpgid" => {
                let (Some(target), Some(group)) = (arg_num(0), arg_num(1)) else {
                    return;
                };
                let target = if target == 0 { pid } else { target as u32 };
                let group = if group == 0 { target } else { group as u32 };
                self.proc(target);
                self.set_group(target, group);
            }
            "setsid" => self.set_group(pid, pid),
            "socketpair" => {
                // `socketpair(AF_UNIX, SOCK_STREAM, 0, [3, 4])`: two linked ends, so a
                // descriptor sent on one is known where it is received.
                let ends = fd_pair(c);
                if let [x, y] = ends[..] {
                    let (ox, oy) = (self.new_ofd(None, None), self.new_ofd(None, None));
                    self.ofds[ox].peer = Some(oy);
                    self.ofds[oy].peer = Some(ox);
                    self.set_fd(p, x, ox, false);
                    self.set_fd(p, y, oy, false);
                } else {
                    for fd in ends {
                        self.drop_fd(p, fd);
                    }
                }
            }
            "sendmsg" => {
                let peer = arg_num(0)
                    .and_then(|f| self.fd(p, f))
                    .and_then(|f| self.ofds[f.ofd].peer);
                if let Some(peer) = peer {
                    let sent: Vec<usize> = scm_rights_fds(c)
                        .into_iter()
                        .filter_map(|fd| self.fd(p, fd).map(|f| f.ofd))
                        .collect();
                    self.in_transit.entry(peer).or_default().extend(sent);
                }
            }
            "pipe" | "pipe2" => {
                // `pipe2([3, 4], 0)`: both fds now mean a pipe.
                for fd in fd_pair(c) {
                    self.drop_fd(p, fd);
                }
            }
            "socket" | "accept" | "accept4" | "eventfd2" | "epoll_create1" | "memfd_create"
            | "timerfd_create" | "signalfd4" | "inotify_init1" | "pidfd_open" => {
                self.drop_fd(p, ret);
            }
            // Reads submitted through an io_uring are not system calls strace sees.
            "io_uring_setup" => {
                self.stats.io_urings += 1;
                self.drop_fd(p, ret);
            }
            _ => {}
        }
    }

    /// `fd` now names something we do not follow.
    fn drop_fd(&mut self, p: Proc, fd: i64) {
        let ofd = self.new_ofd(None, None);
        self.set_fd(p, fd, ofd, false);
    }

    /// Moves `pid` and every thread sharing its fd table into `group`.
    fn set_group(&mut self, pid: u32, group: u32) {
        let Some(files) = self.procs.get(&pid).map(|p| p.files) else {
            return;
        };
        for pr in self.procs.values_mut() {
            if pr.files == files {
                pr.pgid = group;
            }
        }
    }

    fn build(&mut self) -> Trace {
        // A path's size is its size at look-up, or more if the run read past it (the
        // file grew while it ran): every row of a path carries one size.
        let mut sizes: Vec<u64> = self.files.iter().map(|f| f.1).collect();
        for r in &self.reads {
            let s = &mut sizes[r.file as usize];
            *s = (*s).max(r.offset + r.len);
        }
        let mut b = TraceBuilder::new();
        let mut jobs: HashMap<u32, u32> = HashMap::new();
        let mut paths: HashMap<u32, u32> = HashMap::new();
        for r in &self.reads {
            let job = *jobs.entry(r.pgid).or_insert_with(|| {
                let exe = self.exe.get(&r.pgid).map_or("pg", |s| s.as_str());
                let exe: String = exe
                    .chars()
                    .map(|c| {
                        if matches!(c, ',' | '"' | '\n' | '\r') {
                            '_'
                        } else {
                            c
                        }
                    })
                    .collect();
                b.job(&format!("{exe}-{}", r.pgid))
            });
            let path = *paths.entry(r.file).or_insert_with(|| {
                let (name, _, gone) = &self.files[r.file as usize];
                if *gone {
                    self.stats.files_gone += 1;
                }
                // Names the format cannot carry are an error of the recorder, not the run.
                b.path(name, sizes[r.file as usize])
                    .unwrap_or_else(|e| panic!("recorder bug: {e}"))
            });
            b.push(r.ts_ns, job, path, r.offset, r.len)
                .unwrap_or_else(|e| panic!("recorder bug: {e}"));
        }
        let mut t = b.finish();
        t.sort_by_time();
        t
    }
}

/// A file's path relative to the root as the trace names it. The CSV has no quoting, so
/// the characters it cannot carry (`,`, `"`, line breaks and other controls), `%` itself
/// and, in a name that is not UTF-8, every byte outside printable ASCII are written
/// `%XX`, byte by byte: a file named `a,b.bin` (an object key with a comma) is recorded
/// as `a%2Cb.bin` instead of being left out, and two different names never map to one.
fn trace_name(rel: &Path) -> String {
    use std::fmt::Write;
    use std::os::unix::ffi::OsStrExt;
    let escape = |out: &mut String, bytes: &[u8]| {
        for b in bytes {
            let _ = write!(out, "%{b:02X}");
        }
    };
    let bytes = rel.as_os_str().as_bytes();
    let mut out = String::with_capacity(bytes.len());
    match std::str::from_utf8(bytes) {
        Ok(name) => {
            for c in name.chars() {
                if matches!(c, ',' | '"' | '%') || c.is_control() {
                    escape(&mut out, c.encode_utf8(&mut [0; 4]).as_bytes());
                } else {
                    out.push(c);
                }
            }
        }
        Err(_) => {
            for &b in bytes {
                if b.is_ascii_graphic() && !matches!(b, b',' | b'"' | b'%') || b == b' ' {
                    out.push(char::from(b));
                } else {
                    escape(&mut out, &[b]);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path under `/data` is a regular file of 1 MB; nothing else exists.
    struct Fake;
    impl Lookup for Fake {
        fn regular_file(&mut self, abs: &Path) -> Option<(PathBuf, u64)> {
            use std::os::unix::ffi::OsStrExt;
            let s = abs.as_os_str().as_bytes();
            (s.starts_with(b"/data/") && !s.ends_with(b"/dir"))
                .then(|| (abs.to_path_buf(), 1_000_000))
        }
    }

    /// `(ts_ns, job, path, offset, len)` of each row.
    type Row = (u64, String, String, u64, u64);

    fn run(text: &str) -> (Vec<Row>, ParseStats) {
        let (t, st) = parse_strace(text, Path::new("/data"), Path::new("/data"), &mut Fake);
        let rows = t
            .records
            .iter()
            .map(|r| {
                (
                    r.ts_ns,
                    t.job_name(r).to_string(),
                    t.path_name(r).to_string(),
                    r.offset,
                    r.len,
                )
            })
            .collect();
        (rows, st)
    }

    /// Asserts the `(path, offset, len)` of the rows `text` records.
    fn assert_ranges(text: &str, want: &[(&str, u64, u64)]) {
        let got: Vec<_> = run(text).0.into_iter().map(|r| (r.2, r.3, r.4)).collect();
        let want: Vec<_> = want
            .iter()
            .map(|&(p, o, l)| (p.to_string(), o, l))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn parses_calls() {
        let c = parse_call(r#"read(3, ""..., 4096)    = 4096"#).expect("call");
        assert_eq!(c.name, "read");
        assert_eq!(c.args, vec!["3", r#"""..."#, "4096"]);
        assert_eq!(c.ret, Some(4096));
        let c =
            parse_call(r#"openat(AT_FDCWD, "a, b\")(.txt", O_RDONLY) = -1 ENOENT (No such file)"#)
                .expect("call");
        assert_eq!(c.args.len(), 3);
        assert_eq!(
            unquote(c.args[1]).as_deref(),
            Some(std::ffi::OsStr::new("a, b\")(.txt"))
        );
        assert_eq!(c.ret, Some(-1));
        let c = parse_call("read(3, 0x7f, 10) = ? ERESTARTSYS (To be restarted)").expect("call");
        assert_eq!(c.ret, None);
        let c = parse_call(
            "clone3({flags=CLONE_VM|CLONE_FILES|CLONE_THREAD, exit_signal=0} => {parent_tid=[7]}, 88) = 7",
        )
        .expect("call");
        assert_eq!(c.args.len(), 2);
        let b = birth(&c, 1).expect("birth");
        assert!(b.share_files && !b.share_fs);
        assert_eq!(
            unquote(r#""\303\251t\303\251\x41""#).as_deref(),
            Some(std::ffi::OsStr::new("étéA"))
        );
        assert!(parse_call("--- SIGCHLD {si_signo=SIGCHLD} ---").is_none());
    }

    /// Black-box finding (round 16): the wall clock stepped back 1 h while recording,
    /// and the trace listed the later reads first over a 3,599.5 s span. The `-r`
    /// deltas (monotonic) time the calls; a log without them keeps the wall clock.
    #[test]
    fn a_wall_clock_step_neither_reorders_nor_stretches_the_trace() {
        let text = "\
10 1000.000000 (+     0.000000) openat(AT_FDCWD, \"/data/f1\", O_RDONLY) = 3
10 1000.500000 (+     0.500000) read(3, \"\"..., 100) = 100
10 1001.000000 (+     0.500000) openat(AT_FDCWD, \"/data/f2\", O_RDONLY) = 4
10 -2599.500000 (+     0.500000) read(4, \"\"..., 100) = 100
10 -2599.000000 (+     0.500000) openat(AT_FDCWD, \"/data/f3\", O_RDONLY) = 5
10 -2598.500000 (+     0.500000) read(5, \"\"..., 100) = 100
";
        // A step back past the epoch would not even parse as wall time: shift it.
        let text = text.replace("-2599.", "1.").replace("-2598.", "2.");
        let (rows, _) = run(&text);
        let paths: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
        assert_eq!(paths, vec!["f1", "f2", "f3"], "in the order they happened");
        let span_ms = (rows[2].0 - rows[0].0) / 1_000_000;
        assert_eq!(span_ms, 2_000, "their real spacing");
    }

    #[test]
    fn follows_offsets_seeks_and_preads() {
        let rows = run(
            r#"100 1.000000 openat(AT_FDCWD, "a.bin", O_RDONLY|O_CLOEXEC) = 3
100 1.000010 read(3, ""..., 4096) = 4096
100 1.000020 read(3, ""..., 4096) = 100
100 1.000030 lseek(3, 5000, SEEK_SET) = 5000
100 1.000040 readv(3, [{iov_base="", iov_len=10}, {iov_base="", iov_len=20}], 2) = 30
100 1.000050 pread64(3, ""..., 50, 90000) = 50
100 1.000060 read(3, ""..., 10) = 10
100 1.000070 preadv(3, [{iov_base="", iov_len=8}], 1, 7) = 8
100 1.000080 read(3, "", 4096) = 0
100 1.000090 read(3, 0x7ffd, 4096) = -1 EINTR (Interrupted system call)
100 1.000100 read(3, 0x7ffd, 4096) = ? ERESTARTSYS (To be restarted if SA_RESTART is set)
100 1.000110 lseek(3, 0, SEEK_CUR) = 5040
100 1.000120 read(3, ""..., 1) = 1
100 1.000130 read(0, ""..., 10) = 10
"#,
        )
        .0;
        let got: Vec<_> = rows.iter().map(|r| (r.0, r.3, r.4)).collect();
        assert_eq!(
            got,
            vec![
                (10_000, 0, 4096),
                (20_000, 4096, 100),
                (40_000, 5000, 30),
                (50_000, 90000, 50),
                (60_000, 5030, 10),
                (70_000, 7, 8),
                (120_000, 5040, 1),
            ]
        );
        assert!(rows.iter().all(|r| r.1 == "pg-100" && r.2 == "a.bin"));
    }

    /// Black-box finding: on an O_RDWR fd, reads after a write were recorded at the
    /// offset where the write began; and reads of an inherited fd vanished silently.
    #[test]
    fn writes_move_the_offset_and_inherited_reads_are_counted() {
        let inherited = [(0, std::path::PathBuf::from("/data/in.bin"), 7)];
        let (t, _) = parse_strace_inheriting(
            "100 1.0 read(0, \"\"..., 10) = 10\n100 1.1 read(0, \"\"..., 5) = 5\n",
            Path::new("/data"),
            Path::new("/data"),
            &inherited,
            &mut Fake,
        );
        let got: Vec<_> = t
            .records
            .iter()
            .map(|r| (t.path_name(r).to_string(), r.offset, r.len))
            .collect();
        assert_eq!(
            got,
            vec![("in.bin".to_string(), 7, 10), ("in.bin".to_string(), 17, 5)]
        );
        let (rows, stats) = run(r#"100 1.000000 openat(AT_FDCWD, "a.bin", O_RDWR) = 3
100 1.000010 read(3, ""..., 100) = 100
100 1.000020 write(3, ""..., 50) = 50
100 1.000030 read(3, ""..., 100) = 100
100 1.000040 writev(3, [{iov_base="", iov_len=30}], 1) = 30
100 1.000050 pwrite64(3, ""..., 10, 0) = 10
100 1.000060 read(3, ""..., 10) = 10
100 1.000070 read(0, ""..., 4096) = 4096
"#);
        let got: Vec<_> = rows.iter().map(|r| (r.3, r.4)).collect();
        assert_eq!(got, vec![(0, 100), (150, 100), (280, 10)]);
        assert_eq!(stats.reads_inherited, 1);
    }

    #[test]
    fn dup_shares_an_offset_and_close_ends_it() {
        assert_ranges(
            r#"7 1.0 openat(AT_FDCWD, "/data/x", O_RDONLY) = 3
7 1.1 dup(3) = 4
7 1.2 read(4, ""..., 100) = 100
7 1.3 read(3, ""..., 100) = 100
7 1.4 fcntl(3, F_DUPFD_CLOEXEC, 0) = 9
7 1.5 dup2(3, 12) = 12
7 1.6 dup3(3, 13, O_CLOEXEC) = 13
7 1.7 close(3) = 0
7 1.8 read(9, ""..., 5) = 5
7 1.9 read(12, ""..., 5) = 5
7 2.0 read(13, ""..., 5) = 5
7 2.1 read(3, ""..., 5) = 5
7 2.2 openat(AT_FDCWD, "/elsewhere/y", O_RDONLY) = 12
7 2.3 read(12, ""..., 5) = 5
"#,
            &[
                ("x", 0, 100),
                ("x", 100, 100),
                ("x", 200, 5),
                ("x", 205, 5),
                ("x", 210, 5),
            ],
        );
    }

    #[test]
    fn forked_children_inherit_fds_and_share_offsets() {
        let (rows, st) = run(r#"10 1.0 openat(AT_FDCWD, "f", O_RDONLY) = 3
10 1.1 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD, child_tidptr=0x7f) = 11
11 1.2 read(3, ""..., 10) = 10
11 1.3 close(3) = 0
10 1.4 read(3, ""..., 10) = 10
11 1.5 openat(AT_FDCWD, "g", O_RDONLY) = 3
11 1.6 read(3, ""..., 7) = 7
10 1.7 read(3, ""..., 10) = 10
"#);
        let got: Vec<_> = rows.iter().map(|r| (r.2.as_str(), r.3, r.4)).collect();
        // The child's read moved the shared offset; its close did not close the parent's fd.
        assert_eq!(
            got,
            vec![("f", 0, 10), ("f", 10, 10), ("g", 0, 7), ("f", 20, 10)]
        );
        assert!(rows.iter().all(|r| r.1 == "pg-10"), "one group: {rows:?}");
        assert_eq!(st.processes, 2);
    }

    #[test]
    fn threads_share_the_table_and_split_calls_join() {
        // The thread appears before its parent's clone3 returns; it opens on the shared
        // table, and two reads interleave as unfinished/resumed halves.
        let got = run(r#"20 1.000000 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD, exit_signal=0}, 88 <unfinished ...>
21 1.000100 openat(AT_FDCWD, "t", O_RDONLY|O_CLOEXEC) = 5
20 1.000200 <... clone3 resumed> => {parent_tid=[21]}, 88) = 21
20 1.000300 read(5,  <unfinished ...>
21 1.000400 pread64(5,  <unfinished ...>
20 1.000500 <... read resumed>""..., 64) = 64
21 1.000600 <... pread64 resumed>""..., 16, 4096) = 16
21 1.000700 read(5, ""..., 64) = 64
21 1.000800 +++ exited with 0 +++
"#)
        .0;
        let got: Vec<_> = got.iter().map(|r| (r.0, r.3, r.4)).collect();
        assert_eq!(
            got,
            vec![(300_000, 0, 64), (400_000, 4096, 16), (700_000, 64, 64)]
        );
    }

    #[test]
    fn copies_out_of_a_file_are_reads() {
        // GNU cp's copy_file_range, shutil.copyfile's sendfile with an offset, a web
        // server's sendfile at the file's offset, splice at an offset and at the OFD's.
        assert_ranges(
            r#"40 1.000000 openat(AT_FDCWD, "a", O_RDONLY) = 3
40 1.000100 copy_file_range(3, NULL, 4, NULL, 9223372035781033984, 0) = 3000
40 1.000200 copy_file_range(3, NULL, 4, NULL, 9223372035781033984, 0) = 0
40 1.000300 copy_file_range(3, [5000], 4, [0], 1000, 0) = 1000
40 1.000400 sendfile(8, 3, [0] => [300], 8388608) = 300
40 1.000500 sendfile(8, 3, NULL, 100) = 100
40 1.000600 splice(3, [7000], 6, NULL, 4096, 0) = 4096
40 1.000700 splice(3, NULL, 6, NULL, 50, 0) = 50
40 1.000800 splice(6, NULL, 3, NULL, 50, 0) = 50
"#,
            &[
                ("a", 0, 3000),
                ("a", 5000, 1000),
                ("a", 0, 300),
                ("a", 3000, 100),
                ("a", 7000, 4096),
                ("a", 3100, 50),
            ],
        );
    }

    #[test]
    fn maps_of_files_under_the_root_are_counted() {
        let (rows, st) = run(r#"41 1.000000 openat(AT_FDCWD, "a", O_RDONLY) = 3
41 1.000100 mmap(NULL, 3000000, PROT_READ, MAP_SHARED, 3, 0) = 0x7f4b03c00000
41 1.000200 openat(AT_FDCWD, "/usr/lib/x.so", O_RDONLY|O_CLOEXEC) = 4
41 1.000300 mmap(NULL, 8192, PROT_READ, MAP_PRIVATE|MAP_DENYWRITE, 4, 0) = 0x7f4b040e2000
41 1.000400 mmap(NULL, 4096, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7f4b040e0000
"#);
        assert!(rows.is_empty());
        assert_eq!((st.file_maps, st.file_map_bytes), (1, 3_000_000));
        let (_, st) = run("42 1.000000 io_uring_setup(64, {flags=0, sq_thread_cpu=0, sq_thread_idle=0, sq_entries=64, cq_entries=128}) = 5\n");
        assert_eq!(st.io_urings, 1);
    }

    #[test]
    fn a_close_takes_effect_when_it_starts() {
        // Thread 31 closes fd 3; the kernel frees it on entry, thread 32's openat gets
        // 3 and reads it, and strace shows the close returning only after that openat.
        assert_ranges(
            r#"30 1.000000 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD, exit_signal=0}, 88) = 31
30 1.000010 clone3({flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD, exit_signal=0}, 88) = 32
31 1.000100 openat(AT_FDCWD, "f", O_RDONLY|O_CLOEXEC) = 3
31 1.000200 read(3, ""..., 10) = 10
31 1.000300 close(3 <unfinished ...>
32 1.000400 openat(AT_FDCWD, "g", O_RDONLY|O_CLOEXEC <unfinished ...>
32 1.000500 <... openat resumed>) = 3
31 1.000600 <... close resumed>) = 0
32 1.000700 read(3,  <unfinished ...>
32 1.000900 <... read resumed>""..., 7) = 7
"#,
            &[("f", 0, 10), ("g", 0, 7)],
        );
    }

    #[test]
    fn jobs_follow_process_groups() {
        let rows = run(
            r#"30 1.0 execve("/usr/bin/bash", ["bash"], 0x1 /* 3 vars */) = 0
30 1.1 clone(child_stack=NULL, flags=SIGCHLD) = 31
30 1.2 clone(child_stack=NULL, flags=SIGCHLD) = 32
31 1.3 setpgid(0, 0) = 0
31 1.4 execve("/usr/bin/python3", ["python3"], 0x1 /* 3 vars */) = 0
32 1.5 setsid() = 32
32 1.6 execve("/usr/bin/sqlite3", ["sqlite3"], 0x1 /* 3 vars */) = 0
31 1.7 clone(child_stack=NULL, flags=SIGCHLD) = 33
33 1.8 openat(AT_FDCWD, "a", O_RDONLY) = 3
33 1.9 read(3, ""..., 1) = 1
32 2.0 openat(AT_FDCWD, "b", O_RDONLY) = 3
32 2.1 read(3, ""..., 1) = 1
30 2.2 openat(AT_FDCWD, "c", O_RDONLY) = 3
30 2.3 read(3, ""..., 1) = 1
"#,
        )
        .0;
        let jobs: Vec<_> = rows.iter().map(|r| (r.2.as_str(), r.1.as_str())).collect();
        assert_eq!(
            jobs,
            vec![("a", "python3-31"), ("b", "sqlite3-32"), ("c", "bash-30")]
        );
    }

    #[test]
    fn paths_resolve_against_cwd_dirfds_and_exec_drops_cloexec() {
        assert_ranges(
            r#"40 1.0 chdir("/data/sub") = 0
40 1.1 openat(AT_FDCWD, "../x", O_RDONLY) = 3
40 1.2 openat(AT_FDCWD, "/data/dir", O_RDONLY|O_DIRECTORY) = 4
40 1.3 openat(4, "y", O_RDONLY|O_CLOEXEC) = 5
40 1.4 open("./z", O_RDONLY) = 6
40 1.5 read(3, ""..., 1) = 1
40 1.6 read(5, ""..., 2) = 2
40 1.7 read(6, ""..., 3) = 3
40 1.8 openat(AT_FDCWD, "/etc/passwd", O_RDONLY) = 7
40 1.9 read(7, ""..., 3) = 3
40 2.0 execve("/bin/cat", ["cat"], 0x1 /* 1 var */) = 0
40 2.1 read(3, ""..., 4) = 4
40 2.2 read(5, ""..., 4) = 4
40 2.3 pipe2([5, 6], O_CLOEXEC) = 0
40 2.4 read(6, ""..., 4) = 4
"#,
            &[("x", 0, 1), ("dir/y", 0, 2), ("sub/z", 0, 3), ("x", 1, 4)],
        );
    }

    /// Names the CSV cannot carry are escaped, not dropped; UTF-8 names stay readable.
    #[test]
    fn names_with_commas_quotes_or_odd_bytes_are_escaped() {
        assert_ranges(
            r#"100 1.000000 openat(AT_FDCWD, "a,b.bin", O_RDONLY) = 3
100 1.000010 read(3, ""..., 10) = 10
100 1.000020 openat(AT_FDCWD, "q\"x%.bin", O_RDONLY) = 4
100 1.000030 read(4, ""..., 20) = 20
100 1.000040 openat(AT_FDCWD, "\303\251t\303\251.bin", O_RDONLY) = 5
100 1.000050 read(5, ""..., 30) = 30
100 1.000060 openat(AT_FDCWD, "\377x.bin", O_RDONLY) = 6
100 1.000070 read(6, ""..., 40) = 40
"#,
            &[
                ("a%2Cb.bin", 0, 10),
                ("q%22x%25.bin", 0, 20),
                ("été.bin", 0, 30),
                ("%FFx.bin", 0, 40),
            ],
        );
        use std::os::unix::ffi::OsStrExt;
        let raw = std::ffi::OsStr::from_bytes(b"bad\xff\n.bin");
        assert_eq!(trace_name(Path::new(raw)), "bad%FF%0A.bin");
    }

    #[test]
    fn tolerates_noise() {
        let (rows, st) = run("garbage\n\n50 1.0 read(3, \"\"..., 4) = 4\n50 1.1 <... read resumed>) = 4\n50 1.2 weird line = x\n");
        assert!(rows.is_empty());
        assert_eq!(st.lines, 5);
        assert_eq!(st.malformed, 1);
    }

    /// Black-box finding: a pid the kernel handed out again kept the dead process's fd
    /// table, so the new process's reads of `b` were recorded as reads of `a`.
    #[test]
    fn a_recycled_pid_is_a_new_process() {
        let text = "\
10 1.0 clone(child_stack=NULL, flags=SIGCHLD) = 20
20 1.1 openat(AT_FDCWD, \"/data/a\", O_RDONLY) = 3
20 1.2 read(3, \"\"..., 10) = 10
20 1.3 +++ exited with 0 +++
10 1.4 openat(AT_FDCWD, \"/data/b\", O_RDONLY) = 3
10 1.5 clone(child_stack=NULL, flags=SIGCHLD) = 20
20 1.6 read(3, \"\"..., 20) = 20
20 1.7 +++ killed by SIGKILL +++
";
        assert_ranges(text, &[("a", 0, 10), ("b", 0, 20)]);
        assert_eq!(run(text).1.processes, 3);
    }

    /// `preadv2`/`pwritev2` at offset -1 use and move the file offset (black-box
    /// finding: the read was dropped and every later offset was off by it).
    #[test]
    fn preadv2_and_pwritev2_at_minus_one_use_the_file_offset() {
        let text = "\
1 1.0 openat(AT_FDCWD, \"/data/a\", O_RDWR) = 3
1 1.1 read(3, \"\"..., 100) = 100
1 1.2 preadv2(3, [{iov_base=\"\"..., iov_len=200}], 1, -1, 0) = 200
1 1.3 pwritev2(3, [{iov_base=\"\"..., iov_len=30}], 1, -1, 0) = 30
1 1.4 pwritev2(3, [{iov_base=\"\"..., iov_len=30}], 1, 5000, 0) = 30
1 1.5 read(3, \"\"..., 50) = 50
1 1.6 preadv2(3, [{iov_base=\"\"..., iov_len=10}], 1, 7, RWF_NOWAIT) = 10
";
        assert_ranges(
            text,
            &[("a", 0, 100), ("a", 100, 200), ("a", 330, 50), ("a", 7, 10)],
        );
    }

    /// A thread that unshares its fd table (`unshare(CLONE_FILES)`) closes and opens in
    /// its own copy (black-box finding: the other threads' reads were recorded against
    /// the file it opened under the same number).
    #[test]
    fn unshare_gives_a_thread_its_own_fd_table() {
        let text = "\
1 1.0 openat(AT_FDCWD, \"/data/a\", O_RDONLY) = 3
1 1.1 read(3, \"\"..., 100) = 100
1 1.2 clone(child_stack=0x1, flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_THREAD) = 2
2 1.3 unshare(CLONE_FILES) = 0
2 1.4 close(3) = 0
2 1.5 openat(AT_FDCWD, \"/data/b\", O_RDONLY) = 3
2 1.6 read(3, \"\"..., 33) = 33
1 1.7 read(3, \"\"..., 100) = 100
";
        assert_ranges(text, &[("a", 0, 100), ("b", 0, 33), ("a", 100, 100)]);
    }

    /// A descriptor passed over a socketpair (`SCM_RIGHTS`) is the sender's open file,
    /// offset shared (black-box finding: its reads were dropped as "inherited").
    #[test]
    fn a_descriptor_passed_over_a_socketpair_is_followed() {
        let text = "\
1 1.0 socketpair(AF_UNIX, SOCK_STREAM, 0, [3, 4]) = 0
1 1.1 clone(child_stack=NULL, flags=SIGCHLD) = 2
2 1.2 openat(AT_FDCWD, \"/data/b\", O_RDONLY) = 5
2 1.3 read(5, \"\"..., 10) = 10
2 1.4 sendmsg(3, {msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base=\"x\", iov_len=1}], msg_iovlen=1, msg_control=[{cmsg_len=20, cmsg_level=SOL_SOCKET, cmsg_type=SCM_RIGHTS, cmsg_data=[5]}], msg_controllen=24, msg_flags=0}, 0) = 1
2 1.5 +++ exited with 0 +++
1 1.6 recvmsg(4, {msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base=\"x\", iov_len=1}], msg_iovlen=1, msg_control=[{cmsg_len=20, cmsg_level=SOL_SOCKET, cmsg_type=SCM_RIGHTS, cmsg_data=[6]}], msg_controllen=24, msg_flags=0}, 0) = 1
1 1.7 read(6, \"\"..., 1000) = 1000
";
        assert_ranges(text, &[("b", 0, 10), ("b", 10, 1000)]);
    }

    /// Descriptors received over a socket and AIO contexts are counted, so the recorder
    /// can say why their reads are missing (they were counted as inherited, or not at
    /// all).
    #[test]
    fn received_descriptors_and_aio_are_counted() {
        let text = "\
1 1.0 socketpair(AF_UNIX, SOCK_STREAM, 0, [3, 4]) = 0
1 1.1 recvmsg(3, {msg_name=NULL, msg_namelen=0, msg_iov=[{iov_base=\"x\", iov_len=1}], msg_iovlen=1, msg_control=[{cmsg_len=20, cmsg_level=SOL_SOCKET, cmsg_type=SCM_RIGHTS, cmsg_data=[5]}], msg_controllen=24, msg_flags=0}, 0) = 1
1 1.2 read(5, \"\"..., 1000) = 1000
1 1.3 read(5, \"\"..., 1000) = 1000
1 1.4 io_setup(8, [140000]) = 0
1 1.5 read(9, \"\"..., 10) = 10
";
        let (rows, st) = run(text);
        assert!(rows.is_empty());
        assert_eq!(st.reads_received, 2);
        assert_eq!(st.reads_inherited, 1);
        assert_eq!(st.aio_contexts, 1);
    }

    /// Files removed or renamed before the run ended are kept under the name they were
    /// opened by, sized by what was read (they were dropped).
    #[test]
    fn files_gone_by_the_end_keep_their_reads() {
        struct Gone;
        impl Lookup for Gone {
            fn regular_file(&mut self, abs: &Path) -> Option<(PathBuf, u64)> {
                (abs == Path::new("/data/keep")).then(|| (abs.to_path_buf(), 1_000))
            }
            fn gone(&mut self, abs: &Path) -> Option<PathBuf> {
                (abs != Path::new("/data/keep")).then(|| abs.to_path_buf())
            }
        }
        let text = "\
1 1.0 openat(AT_FDCWD, \"/data/keep\", O_RDONLY) = 3
1 1.1 read(3, \"\"..., 1000) = 1000
1 1.2 openat(AT_FDCWD, \"/data/tmp\", O_RDONLY) = 4
1 1.3 pread64(4, \"\"..., 500, 4000) = 500
1 1.4 openat(AT_FDCWD, \"/elsewhere/x\", O_RDONLY) = 5
1 1.5 read(5, \"\"..., 10) = 10
";
        let (t, st) = parse_strace(text, Path::new("/data"), Path::new("/data"), &mut Gone);
        let rows: Vec<_> = t
            .records
            .iter()
            .map(|r| {
                (
                    t.path_name(r).to_string(),
                    r.offset,
                    r.len,
                    t.sizes[r.path as usize],
                )
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                ("keep".to_string(), 0, 1000, 1000),
                ("tmp".to_string(), 4000, 500, 4500)
            ]
        );
        assert_eq!((st.files_gone, st.reads_elsewhere), (1, 1));
    }
}
