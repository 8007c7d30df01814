//! `pruefstand setup`: create the managed Python venv (agentdojo) now, instead of on
//! the first run, and print where it is.

use std::process::ExitCode;

use pruefstand_gym::pyenv::{AGENTDOJO_VERSION, PyEnv};

#[derive(clap::Args)]
pub(crate) struct Args {}

pub(crate) fn main(_args: Args) -> anyhow::Result<ExitCode> {
    let pyenv = PyEnv::ensure()?;
    outln!("agentdojo {AGENTDOJO_VERSION} venv: {}", pyenv.python.display());
    outln!("gym scripts: {}", pyenv.scripts.display());
    Ok(ExitCode::SUCCESS)
}
