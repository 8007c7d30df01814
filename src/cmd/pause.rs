//! `pruefstand pause` and `pruefstand resume`: the daemon starts no new job while the
//! queue is paused (a running one continues to its end). The pause is a file in
//! `.pruefstand/`, so it outlasts a daemon restart; `status` and `queue` show it.

use std::path::PathBuf;
use std::process::ExitCode;

use pruefstand_core::queue::Queue;
use pruefstand_core::root::Root;

#[derive(clap::Args)]
pub(crate) struct Args {}

/// Pauses (`paused`) or resumes the queue.
pub(crate) fn main(root: Option<PathBuf>, paused: bool) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let queue = Queue::open(&root)?;
    queue.set_paused(paused)?;
    if paused {
        outln!("queue paused: no job starts until `pruefstand resume` (a running one finishes)");
    } else {
        outln!("queue resumed");
    }
    Ok(ExitCode::SUCCESS)
}
