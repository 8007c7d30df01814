//! `pruefstand restart <job>`: puts a done, failed or cancelled job back into the queue
//! with its result and crash count cleared; it resumes into its run directory, so the
//! cases it has recorded are not run again. Its tries go on counting (`queue`'s `try`),
//! and `took` sums them all.
//!
//! The job runs its snapshot again: a file it pinned at `start` (an adapter's export, a
//! chat template) that has changed since is refused here, naming it.
//!
//! A notification of the ended try still owed is dropped (its retries stop): the new
//! try's result is what is news, sent under its own key `<job>-<try>-<outcome>`.

use std::path::PathBuf;
use std::process::ExitCode;

use pruefstand_core::queue::{Queue, Transition};
use pruefstand_core::root::Root;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The job id (see `pruefstand queue`).
    pub(crate) job: String,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let queue = Queue::open(&root)?;
    let found = queue.find(&args.job)?;
    let id = found.id;
    // What the job pinned at `start` must still be there, as it was: a file changed
    // since is named now, not when the daemon picks the job up again. (A job that has
    // not ended is refused by the transition, in its words.)
    if found.state.is_final() {
        for pin in &found.snapshot.pinned {
            pin.check().map_err(|err| err.context(format!("job {id} is not restarted")))?;
        }
    }
    let job = queue.transition(id, Transition::Restart)?;
    drop_owed_notifications(&queue, id)?;
    let next = job.starts.max(job.attempt) + 1;
    match &job.run_dir {
        Some(dir) => outln!("job {id} back in the queue for try {next}; it resumes into {}", dir.display()),
        None => outln!("job {id} back in the queue for try {next}"),
    }
    crate::client::note_without_daemon(&root, &queue)?;
    Ok(ExitCode::SUCCESS)
}

/// Removes the job's ledger when a notification in it is still owed, and says so: a
/// daemon retrying it finds it gone and stops.
fn drop_owed_notifications(queue: &Queue, id: u64) -> anyhow::Result<()> {
    use anyhow::Context;
    let dir = queue.job_dir(id);
    let Ok(Some(ledger)) = crate::hooks::Ledger::read(&dir) else { return Ok(()) };
    let owed: Vec<String> = ledger.owed().into_iter().map(|(name, _)| format!("hook {name:?}")).collect();
    if owed.is_empty() {
        return Ok(());
    }
    let path = dir.join(crate::hooks::LEDGER_FILE);
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    outln!(
        "the last try's notification to {} is dropped unsent: the new try's result is sent instead",
        owed.join(", ")
    );
    Ok(())
}
