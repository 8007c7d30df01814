//! `pruefstand wait <job>`: wait for a queued or running job to end (the queue's watch,
//! no polling), print what `start --wait` prints at its end and exit with the verdict's
//! code — for a job queued earlier, or by another shell. Not the queueing (`start`).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::client::{print_end, say_progress, wait_final};
use pruefstand_core::queue::Queue;
use pruefstand_core::root::Root;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The job id (see `pruefstand queue`).
    pub(crate) job: String,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let queue = Queue::open(&root)?;
    let id = queue.find(&args.job)?.id;
    let job = wait_final(&queue, id, say_progress)?;
    Ok(print_end(&job))
}
