//! `pruefstand run` (stub, being written).
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn main(_root: Option<PathBuf>, _args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not yet implemented")
}
