//! `pruefstand run <version>`: benchmark a version on a plan and judge it — the main
//! job. Prints the run directory, the headline figures and the verdict; the exit
//! status is the verdict's (README: exit codes).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::pyenv::PyEnv;
use crate::root::Root;
use crate::run::{self, RunRequest};
use crate::spec::Version;

#[derive(clap::Args)]
pub struct Args {
    /// A version name from the root's versions/ (e.g. demo-kandidat) or a spec file.
    pub version: String,
    /// `schnell`, `voll` or a plan file.
    #[arg(long, default_value = "schnell")]
    pub plan: String,
    /// Parallel gym workers (default: the plan's).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// The run directory itself; an existing one of the same plan is resumed.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let version = Version::load(&root.versions(), &args.version)?;
    let pyenv = PyEnv::ensure()?;
    let finished = run::run(
        &root,
        &pyenv,
        RunRequest { version: &version, plan: &args.plan, jobs: args.jobs, out: args.out, control: None },
    )?;
    if let Some((dir, made_now)) = &finished.reference {
        let how = if *made_now { "run now" } else { "reused" };
        println!("reference: {} ({how})", dir.display());
    }
    crate::cmd::gym::print_summary(&finished.run_dir, &finished.executed.telemetry);
    let judgement = &finished.judgement;
    for rule in &judgement.rules {
        println!("  {} {:<16} {:<14} {}", rule.id, rule.name, rule.status.as_str(), rule.reason);
    }
    println!("verdict: {}", judgement.verdict.as_str());
    Ok(ExitCode::from(judgement.verdict.exit_code()))
}
