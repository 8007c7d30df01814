//! `pruefstand restart <job>`: puts a done, failed or cancelled job back into the queue
//! with its result and crash count cleared; it resumes into its run directory, so the
//! cases it has recorded are not run again. Its tries go on counting (`queue`'s `try`),
//! and `took` sums them all.

use std::path::PathBuf;
use std::process::ExitCode;

use pruefstand_core::queue::{Queue, Transition};
use pruefstand_core::root::Root;

#[derive(clap::Args)]
pub struct Args {
    /// The job id (see `pruefstand queue`).
    pub job: String,
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let queue = Queue::open(&root)?;
    let id = queue.find(&args.job)?.id;
    let job = queue.transition(id, Transition::Restart)?;
    let next = job.starts.max(job.attempt) + 1;
    match &job.run_dir {
        Some(dir) => outln!("job {id} back in the queue for try {next}; it resumes into {}", dir.display()),
        None => outln!("job {id} back in the queue for try {next}"),
    }
    crate::cmd::start::note_without_daemon(&root, &queue)?;
    Ok(ExitCode::SUCCESS)
}
