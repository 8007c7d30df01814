//! `pruefstand priority <job> <N>`: changes a pending (or interrupted) job's priority;
//! higher runs first.

use std::path::PathBuf;
use std::process::ExitCode;

use pruefstand_core::queue::{Queue, Transition};
use pruefstand_core::root::Root;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The job id (see `pruefstand queue`).
    pub(crate) job: String,
    /// The new priority; higher runs first, equal ones in the order queued.
    #[arg(allow_negative_numbers = true)]
    pub(crate) priority: i32,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let queue = Queue::open(&root)?;
    let id = queue.find(&args.job)?.id;
    let job = queue.transition(id, Transition::Prioritise { priority: args.priority })?;
    outln!("job {id}: priority {}", job.priority);
    Ok(ExitCode::SUCCESS)
}
