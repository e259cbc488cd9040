//! `strata trace gen|import|record`: write replay traces (see [`strata_replay::trace`]).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use strata_replay::trace::{self, gen::Workload};

#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Generate a synthetic workload trace (deterministic for a seed).
    Gen(GenArgs),
    /// Convert an external trace to the replay format.
    Import(ImportArgs),
    /// Run a command under strace and write the reads it makes of regular files under
    /// --root (fds followed across dup/fork/threads/exec and over socketpairs; one job
    /// per process group).
    ///
    /// Paths are resolved when the command ends: a file removed or renamed by then keeps
    /// the name it was opened by, and a symbolic link repointed during the run names its
    /// last target. Reads through mmap, io_uring and Linux AIO are not system calls
    /// strace sees (counted and warned about), nor are descriptors received from
    /// processes not traced. Two threads reading one shared offset at once may swap
    /// their offsets. Processes the command leaves in the background are traced for
    /// 2 s after it exits (or until Ctrl-C), then run on untraced; the command's exit
    /// status is passed on.
    Record(RecordArgs),
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Output CSV (gzip'd if it ends in .gz).
    #[arg(long)]
    pub out: PathBuf,
    /// Only reads of files under this directory are kept, with paths relative to it.
    #[arg(long, default_value = ".")]
    pub root: PathBuf,
    /// Keep strace's own output here (else it goes to a temporary file, then away).
    #[arg(long)]
    pub strace_log: Option<PathBuf>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub cmd: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct GenArgs {
    #[arg(long, value_enum)]
    pub workload: Workload,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output CSV (gzip'd if it ends in .gz).
    #[arg(long)]
    pub out: PathBuf,
    /// Multiplies the default counts (files, shards, sessions, reads).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ImportFormat {
    /// Mooncake FAST'25 JSON lines (`timestamp`, `hash_ids` of 512-token blocks).
    Mooncake,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    #[arg(long, value_enum)]
    pub format: ImportFormat,
    /// Input file (gzip'd if it ends in .gz).
    pub input: PathBuf,
    /// Bytes of one KV block (512 tokens x the model's KV bytes per token).
    #[arg(long)]
    pub block_bytes: u64,
    /// KV namespace in the paths (`kv/<namespace>/<hash>`).
    #[arg(long, default_value = "mooncake")]
    pub namespace: String,
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(cmd: TraceCommand) -> anyhow::Result<()> {
    match cmd {
        TraceCommand::Gen(a) => {
            trace::gen::check_scale(a.scale).map_err(anyhow::Error::msg)?;
            let t = trace::gen::generate(a.workload, a.seed, a.scale);
            trace::write_file(&t, &a.out)
                .with_context(|| format!("writing {}", a.out.display()))?;
            summary(&t, &a.out);
        }
        TraceCommand::Import(a) => {
            let t = match a.format {
                ImportFormat::Mooncake => {
                    trace::mooncake::import_file(&a.input, a.block_bytes, &a.namespace)
                }
            }
            .with_context(|| format!("importing {}", a.input.display()))?;
            trace::write_file(&t, &a.out)
                .with_context(|| format!("writing {}", a.out.display()))?;
            summary(&t, &a.out);
        }
        TraceCommand::Record(a) => record(a)?,
    }
    Ok(())
}

fn record(a: RecordArgs) -> anyhow::Result<()> {
    // The command may run for hours: an --out that cannot be written is found out now,
    // not after it ends.
    trace::check_writable(&a.out)
        .with_context(|| format!("--out {} cannot be written", a.out.display()))?;
    let rec = trace::record::record(&a.root, &a.cmd, a.strace_log.as_deref())?;
    let failed = (!rec.succeeded()).then(|| format!("the command failed ({})", rec.status));
    let st = &rec.stats;
    // Reads strace cannot see (through a mapping, through an io_uring): say so wherever
    // the trace misses them.
    let mut unseen = Vec::new();
    if st.file_maps > 0 {
        unseen.push(format!(
            "{} mappings of files under the root ({:.1} MB): reads through them are page \
             faults strace cannot see and are not in the trace",
            st.file_maps,
            st.file_map_bytes as f64 / 1e6
        ));
    }
    if st.io_urings > 0 {
        unseen.push(format!(
            "{} io_uring instances: reads submitted through them are not system calls strace \
             sees and are not in the trace",
            st.io_urings
        ));
    }
    if st.aio_contexts > 0 {
        unseen.push(format!(
            "{} Linux AIO contexts (io_setup): reads submitted through them (io_submit) are \
             not system calls strace decodes and are not in the trace",
            st.aio_contexts
        ));
    }
    if st.reads_received > 0 {
        unseen.push(format!(
            "{} reads of descriptors received over a socket (SCM_RIGHTS): the recorder does \
             not know their files, so they are not in the trace",
            st.reads_received
        ));
    }
    if st.reads_inherited > 0 {
        unseen.push(format!(
            "{} reads of descriptors the command inherited that name no file the recorder \
             could see (a pipe or a terminal on stdin, say): not in the trace",
            st.reads_inherited
        ));
    }
    let unseen = (!unseen.is_empty()).then(|| unseen.join("; "));
    if rec.trace.records.is_empty() {
        let msg = format!(
            "no reads of regular files under {} were recorded ({} other reads, {} processes){}{}",
            rec.root.display(),
            st.reads_elsewhere,
            st.processes,
            unseen
                .as_ref()
                .map(|m| format!("; {m}"))
                .unwrap_or_default(),
            failed
                .as_ref()
                .map(|f| format!("; {f}"))
                .unwrap_or_default()
        );
        // A command that failed is reported with its own status even with nothing
        // recorded: a caller (a script, CI) must still see that it crashed, and how.
        if failed.is_some() {
            return Err(crate::cli::ExitWith {
                code: rec.shell_status(),
                msg,
            }
            .into());
        }
        anyhow::bail!(msg);
    }
    trace::write_file(&rec.trace, &a.out)
        .with_context(|| format!("writing {}", a.out.display()))?;
    summary(&rec.trace, &a.out);
    eprintln!(
        "strace: {} lines, {} calls, {} processes; {} reads kept, {} of other files or fds, \
         {} lines not understood",
        st.lines, st.calls, st.processes, st.reads, st.reads_elsewhere, st.malformed
    );
    if let Some(m) = unseen {
        eprintln!("warning: {m}");
    }
    if st.left_background {
        eprintln!(
            "note: the command exited leaving processes in the background; they were traced \
             for 2 s more (or until Ctrl-C), and run on untraced"
        );
    }
    if st.files_gone > 0 {
        eprintln!(
            "note: {} files read were gone (removed or renamed) when the command ended: \
             they keep the names they were opened by, sized by the furthest byte read",
            st.files_gone
        );
    }
    if let Some(f) = failed {
        return Err(crate::cli::ExitWith {
            code: rec.shell_status(),
            msg: format!("{f}; the trace of what it read is in {}", a.out.display()),
        }
        .into());
    }
    Ok(())
}

fn summary(t: &trace::Trace, out: &std::path::Path) {
    let bytes: u128 = t.records.iter().map(|r| u128::from(r.len)).sum();
    // Unique bytes enumerate blocks: only for a trace a replay could hold.
    let unique = match t.check_replayable(1 << 20) {
        Ok(()) => format!("{:.1} MB unique", t.unique_bytes(1 << 20) as f64 / 1e6),
        Err(e) => format!("not replayable: {e}"),
    };
    eprintln!(
        "wrote {}: {} reads, {} jobs, {} paths, {:.1} MB read, {unique} (1 MiB blocks)",
        out.display(),
        t.records.len(),
        t.jobs.len(),
        t.paths.len(),
        bytes as f64 / 1e6,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gen_writes_a_readable_trace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("kv.csv.gz");
        run(TraceCommand::Gen(GenArgs {
            workload: Workload::KvPrefix,
            seed: 3,
            out: out.clone(),
            scale: 0.05,
        }))
        .expect("gen");
        let t = trace::read_file(&out).expect("read back");
        assert!(!t.records.is_empty());
        assert!(t.paths.iter().all(|p| p.starts_with("kv/")));
        assert!(run(TraceCommand::Gen(GenArgs {
            workload: Workload::KvPrefix,
            seed: 3,
            out,
            scale: 0.0,
        }))
        .is_err());
        // NaN, infinity and counts that overflow memory are refused before generating.
        for scale in [f64::NAN, f64::INFINITY, 1e30, 1e6, -1.0] {
            let out = dir.path().join("big.csv");
            let e = run(TraceCommand::Gen(GenArgs {
                workload: Workload::Shards,
                seed: 1,
                out: out.clone(),
                scale,
            }))
            .expect_err("refused");
            assert!(e.to_string().contains("--scale"), "{scale}: {e}");
            assert!(!out.exists());
        }
    }
}
