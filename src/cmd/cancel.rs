//! `pruefstand cancel <job>`: a pending job is cancelled at once; for a running one the
//! request is recorded and the daemon stops the run (gym and model) — this waits until
//! it has. A job on a cluster has its job array cancelled (`scancel`) too.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::client::{daemon_running, wait_final};
use pruefstand_core::queue::{Queue, State, Transition};
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
    let job = queue.transition(id, Transition::Cancel)?;
    if job.state == State::Cancelled {
        outln!("job {id} cancelled");
        return Ok(ExitCode::SUCCESS);
    }
    if !daemon_running(&queue)? {
        // No daemon follows the job's array: end it here, or it runs on unwatched.
        if let Some(run_dir) = &job.run_dir {
            for array in crate::cluster::cancel_arrays(&pruefstand_store::RunDir::open(run_dir)?)? {
                outln!("job {id}: array {array} cancelled (scancel)");
            }
        }
        outln!("job {id}: cancel recorded; no daemon runs, the job ends as cancelled when one starts");
        return Ok(ExitCode::SUCCESS);
    }
    tracing::info!("job {id} is running: the daemon stops it");
    let job = wait_final(&queue, id, |_| {})?;
    outln!(
        "job {id} {}",
        if job.state == State::Cancelled {
            "cancelled".to_string()
        } else {
            format!("ended first: {}", job.state.as_str())
        }
    );
    Ok(ExitCode::SUCCESS)
}
