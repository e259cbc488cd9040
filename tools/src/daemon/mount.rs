//! The one place a mount is built: `[[mounts]]` of `strata serve` and `strata mount`
//! both come here with a [`MountConfig`], so they prefetch, pass through and cache
//! metadata alike.

use anyhow::Context;
use strata_cache_core::{BackingStore, ObjectReader};
use strata_fs::{MountHandle, MountOptions, PassthroughOptions};

use super::cache::Core;
use crate::config::{parse_size, MountConfig, PrefetchMode};

impl PrefetchMode {
    /// Applies the mode to a core's options (the benchmarks set up their mounts with
    /// it too).
    pub fn apply(self, core: &mut strata_fs::CoreOptions) {
        core.predictors = match self {
            PrefetchMode::Window => None,
            PrefetchMode::Predictors => {
                Some(std::sync::Arc::new(strata_fs::Predictors::standard()))
            }
        };
    }
}

/// The filesystem options `m` asks for on `core` (`fsname`: the store URL, shown in
/// the mount table).
pub fn mount_options(m: &MountConfig, core: &Core, fsname: &str) -> anyhow::Result<MountOptions> {
    let mut opts = MountOptions {
        allow_other: m.allow_other,
        fsname: fsname.to_string(),
        read_ahead_kb: Some(m.read_ahead_kb),
        ..Default::default()
    };
    opts.core.metadata_ttl = m.metadata_ttl.duration();
    m.prefetch.apply(&mut opts.core);
    let pt_max = parse_size(&m.passthrough_max).context("passthrough_max")?;
    // Copies live within the disk budget (its passthrough share): none without one.
    if pt_max > 0 && core.passthrough_budget > 0 {
        let mut pt = PassthroughOptions::new(core.cache_dir.join("passthrough"));
        pt.max_object = pt_max;
        pt.budget = core.passthrough_budget;
        opts.core.passthrough = Some(pt);
    }
    if m.allow_overwrite || m.allow_delete {
        anyhow::ensure!(
            m.allow_writes,
            "allow_overwrite and allow_delete need allow_writes"
        );
    }
    if m.allow_writes {
        // One staging directory per mount point (emptied when the mount starts), in
        // the cache dir so a written file can become its passthrough copy by a rename.
        let name: String = m
            .mountpoint
            .to_string_lossy()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let mut w = strata_fs::WriteOptions::new(core.cache_dir.join("staging").join(name));
        w.allow_overwrite = m.allow_overwrite;
        w.allow_delete = m.allow_delete;
        opts.core.writes = Some(w);
    }
    Ok(opts)
}

/// Mounts `m.prefix` of `store` (named `url`) at `m.mountpoint` on `core`'s engine,
/// reading blocks other nodes own through `peers` in a cache group. Must run inside
/// the daemon's tokio runtime.
pub fn mount(
    m: &MountConfig,
    core: &Core,
    store: &BackingStore,
    url: &str,
    peers: Option<std::sync::Arc<dyn strata_cache_core::PeerSource>>,
) -> anyhow::Result<MountHandle> {
    let opts = mount_options(m, core, url)?;
    let mut reader = ObjectReader::new(core.engine.clone(), store.clone(), core.block_size)?
        .with_granularity(core.granularity);
    if let Some(p) = peers {
        reader = reader.with_peers(p);
    }
    std::fs::create_dir_all(&m.mountpoint)
        .with_context(|| format!("creating {}", m.mountpoint.display()))?;
    strata_fs::spawn(reader, &m.prefix, &m.mountpoint, opts)
        .with_context(|| format!("mounting {url} at {}", m.mountpoint.display()))
}
