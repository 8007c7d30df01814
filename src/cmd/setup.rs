//! `pruefstand setup`: create the managed Python venv (agentdojo) now, instead of on
//! the first run, and print where it is.

use std::process::ExitCode;

use crate::pyenv::{AGENTDOJO_VERSION, PyEnv};

#[derive(clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> anyhow::Result<ExitCode> {
    let pyenv = PyEnv::ensure()?;
    println!("agentdojo {AGENTDOJO_VERSION} venv: {}", pyenv.python.display());
    println!("gym scripts: {}", pyenv.scripts.display());
    Ok(ExitCode::SUCCESS)
}
