//! `pruefstand run <version>`: benchmark a version on a plan and judge it — the main
//! job. Prints the run directory, the headline figures and the verdict; the exit
//! status is the verdict's (README: exit codes).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use crate::pyenv::PyEnv;
use crate::root::Root;
use crate::run::{self, RunControl};
use crate::spec::Version;

#[derive(clap::Args)]
pub struct Args {
    /// A version name from the root's versions/ (e.g. demo-kandidat) or a spec file.
    pub version: String,
    /// `schnell`, `voll` or a plan file.
    #[arg(long, default_value = "schnell")]
    pub plan: String,
    /// Hold this many cases in flight (default: as many as the model server has room
    /// for, up to `[run] max_in_flight`).
    #[arg(long, value_parser = crate::cmd::jobs_parser())]
    pub jobs: Option<usize>,
    /// The run directory itself; an existing one of the same plan is resumed.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run every case of the plan even when it stops early once decided (`voll`); with
    /// --out, continues a run that stopped early to the whole plan.
    #[arg(long)]
    pub full: bool,
}

pub async fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let version = Version::load(&root.versions(), &args.version)?;
    let pyenv = PyEnv::ensure()?;
    // Ctrl-C or SIGTERM stops the run cleanly: the gym is killed, the model server
    // stopped and removed, every finished case kept for `--out` to resume.
    let mut control = RunControl::default();
    control.stop_abandons_start = true;
    let control = Arc::new(control);
    let signals = tokio::spawn({
        let control = control.clone();
        async move {
            let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            control.stop();
        }
    });
    let finished = run::run(&root, &pyenv, &control, &version, &args.plan, args.jobs, args.out, args.full).await;
    signals.abort();
    let finished = finished?;
    if let Some((dir, made_now)) = &finished.reference {
        let how = if *made_now { "run now" } else { "reused" };
        outln!("reference: {} ({how})", dir.display());
    }
    crate::cmd::gym::print_summary(&finished.run_dir, &finished.executed.telemetry);
    let judgement = &finished.judgement;
    for rule in &judgement.rules {
        outln!("  {} {:<16} {:<14} {}", rule.id, rule.name, rule.status.as_str(), rule.reason);
    }
    outln!("verdict: {}", judgement.verdict.as_str());
    Ok(ExitCode::from(judgement.verdict.exit_code()))
}
