//! `pruefstand sim-serve` (stub, being written).
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not yet implemented")
}
