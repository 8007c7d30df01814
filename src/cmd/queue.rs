//! `pruefstand queue`: the jobs of this bench root, oldest first.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::queue::Queue;
use crate::root::Root;

#[derive(clap::Args)]
pub struct Args {
    /// The jobs as JSON (job.json of each).
    #[arg(long)]
    pub json: bool,
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let jobs = Queue::open(&root)?.list()?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&jobs)?);
        return Ok(ExitCode::SUCCESS);
    }
    if jobs.is_empty() {
        outln!("no jobs");
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:>4}  {:<11} {:>4}  {:<20} {:<8} {:>3}  {:<12}  {}",
        "id",
        "state",
        "prio",
        "version",
        "plan",
        "try",
        "verdict",
        "queued / run dir / error"
    );
    for job in jobs {
        let detail = match (&job.error, &job.run_dir) {
            (Some(error), _) => error.lines().next().unwrap_or("").to_string(),
            (None, Some(dir)) => dir.display().to_string(),
            (None, None) => job.enqueued_at.clone(),
        };
        outln!(
            "{:>4}  {:<11} {:>4}  {:<20} {:<8} {:>3}  {:<12}  {detail}",
            job.id,
            job.state.as_str(),
            job.priority,
            job.version,
            job.plan,
            job.attempt,
            job.verdict.map_or("", |v| v.as_str()),
        );
    }
    Ok(ExitCode::SUCCESS)
}
