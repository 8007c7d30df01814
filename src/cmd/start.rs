//! `pruefstand start <version>`: validate the spec and the plan, snapshot both into a
//! queued job and print its id. With `--wait`, follow the job (the queue's watch, no
//! polling), print what `run` prints at its end (summary, rules, report, verdict) and
//! exit with `run`'s verdict codes; following and printing are `client`'s, as for `wait`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::client::{note_without_daemon, print_end, say_progress, wait_final};
use crate::hooks;
use pruefstand_core::queue::{Prepared, Queue};
use pruefstand_core::root::Root;
use pruefstand_judge::contamination;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A version name from the root's versions/ or a spec file.
    pub(crate) version: String,
    /// `schnell`, `voll` or a plan file.
    #[arg(long, default_value = "schnell")]
    pub(crate) plan: String,
    /// Higher runs first; equal priorities run in the order queued.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub(crate) priority: i32,
    /// Wait for the verdict and exit with its code (0 approved, 10 rejected, 11
    /// inconclusive, 12 invalid, 2 failed or cancelled).
    #[arg(long)]
    pub(crate) wait: bool,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    hooks::validate(&root)?;
    let queue = Queue::open(&root)?;
    let prepared = queue.prepare(&root, &args.version, &args.plan)?;
    refuse_held_out_clash(&prepared)?;
    let job = queue.enqueue(prepared, args.priority, None)?;
    outln!("{}", job.id);
    tracing::info!("queued job {}: {} on {} (priority {})", job.id, job.version, job.plan, job.priority);
    note_without_daemon(&root, &queue)?;
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let job = wait_final(&queue, job.id, say_progress)?;
    Ok(print_end(&job))
}

/// The held-out guard `run` applies before its first case, at `start` already: a plan
/// holding out a family the adapter's exports hold is refused in `check --plan`'s words,
/// and nothing is queued (a nightly job would otherwise run the whole plan to an
/// invalid verdict).
fn refuse_held_out_clash(prepared: &Prepared) -> anyhow::Result<()> {
    let version = &prepared.version;
    let paths = version.training_data();
    if paths.is_empty() {
        return Ok(());
    }
    let exports = pruefstand_report::export::trained_exports(&paths)?;
    let trained_on: Vec<String> = version.spec.trained_on.iter().map(|f| f.get_ref().clone()).collect();
    let plan = &prepared.profile.name;
    match contamination::refusal(plan, &version.name, &prepared.held_out(), &trained_on, &exports) {
        Some(refusal) => anyhow::bail!("refused, nothing queued: {refusal}"),
        None => Ok(()),
    }
}
