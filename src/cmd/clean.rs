//! `pruefstand clean [--keep N] [--force]`: removes ended jobs (done, failed, cancelled)
//! from the queue, all but the N newest. Their run directories under `reports/` stay:
//! only the queue's records (job.json, snapshot, log, notifications) go. A job whose
//! notification is still owed (the daemon retries it, or sends it at its next start)
//! is kept and named, unless `--force` drops the notification with it.

use std::path::PathBuf;
use std::process::ExitCode;

use pruefstand_core::queue::Queue;
use pruefstand_core::root::Root;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Keep this many of the newest ended jobs.
    #[arg(long, default_value_t = 0)]
    pub(crate) keep: usize,
    /// Also remove ended jobs whose notifications are still owed (they are never sent).
    #[arg(long)]
    pub(crate) force: bool,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let queue = Queue::open(&root)?;
    let mut spared = Vec::new();
    let removed = queue.clean(args.keep, |job| {
        let owed = if args.force || !job.state.is_final() { Vec::new() } else { owed_hooks(&queue, job) };
        let spare = !owed.is_empty();
        if spare {
            spared.push(format!(
                "kept job {}: its notification to {} is still owed (the daemon sends it); `pruefstand clean --force` removes it unsent",
                job.id,
                owed.join(", ")
            ));
        }
        spare
    })?;
    for line in &spared {
        tracing::warn!("{line}");
    }
    let ids: Vec<String> = removed.iter().map(u64::to_string).collect();
    match removed.len() {
        0 => outln!("nothing to clean"),
        n => outln!("removed {n} ended job{}: {}", if n == 1 { "" } else { "s" }, ids.join(" ")),
    }
    Ok(ExitCode::SUCCESS)
}

/// The hooks a job's notifications are still owed to, by name (`"team"`); none when its
/// folder holds no ledger, or one that cannot be read (then nothing can be sent).
fn owed_hooks(queue: &Queue, job: &pruefstand_core::queue::Job) -> Vec<String> {
    match crate::hooks::Ledger::read(&queue.job_dir(job.id)) {
        Ok(Some(ledger)) => ledger.owed().into_iter().map(|(name, _)| format!("hook {name:?}")).collect(),
        _ => Vec::new(),
    }
}
