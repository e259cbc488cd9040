//! `strata demo`: the README's main job on an embedded default.

#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

pub fn run(_args: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("strata demo is being built")
}
