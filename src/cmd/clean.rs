//! `pruefstand clean [--keep N]`: removes ended jobs (done, failed, cancelled) from the
//! queue, all but the N newest. Their run directories under `reports/` stay: only the
//! queue's records (job.json, snapshot, log) go.

use std::path::PathBuf;
use std::process::ExitCode;

use pruefstand_core::queue::Queue;
use pruefstand_core::root::Root;

#[derive(clap::Args)]
pub struct Args {
    /// Keep this many of the newest ended jobs.
    #[arg(long, default_value_t = 0)]
    pub keep: usize,
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let removed = Queue::open(&root)?.clean(args.keep)?;
    let ids: Vec<String> = removed.iter().map(u64::to_string).collect();
    match removed.len() {
        0 => outln!("nothing to clean"),
        n => outln!("removed {n} ended job{}: {}", if n == 1 { "" } else { "s" }, ids.join(" ")),
    }
    Ok(ExitCode::SUCCESS)
}
