//! `pruefstand queue`: the jobs of this bench root, oldest first, with when each started
//! and ended, how long it took, and the headline figures of a finished one.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::daemon::state::human_secs;
use crate::queue::{self, Headline, Job, Queue};
use crate::root::Root;
use crate::util::local_time;

#[derive(clap::Args)]
pub struct Args {
    /// The jobs as JSON (job.json of each).
    #[arg(long)]
    pub json: bool,
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let queue = Queue::open(&root)?;
    let jobs = queue.list()?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&jobs)?);
        return Ok(ExitCode::SUCCESS);
    }
    if queue.is_paused() {
        outln!("the queue is paused (`pruefstand resume` lets jobs start again)");
    }
    if jobs.is_empty() {
        outln!("no jobs");
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:>4}  {:<11} {:>4}  {:<20} {:<8} {:>3}  {:<12}  {:<19}  {:<19}  {:>9}  {:<26}  {}",
        "id",
        "state",
        "prio",
        "version",
        "plan",
        "try",
        "verdict",
        "started",
        "finished",
        "took",
        "ASR  util@atk  util",
        "run dir / error"
    );
    let now = chrono::Utc::now();
    for job in jobs {
        let detail = match (&job.error, &job.run_dir) {
            (Some(error), _) => error.lines().next().unwrap_or("").to_string(),
            (None, Some(dir)) => dir.display().to_string(),
            (None, None) => format!("queued {}", local_time(&job.enqueued_at)),
        };
        let (started, finished) = queue::started_finished(&job);
        outln!(
            "{:>4}  {:<11} {:>4}  {:<20} {:<8} {:>3}  {:<12}  {:<19}  {:<19}  {:>9}  {:<26}  {detail}",
            job.id,
            job.state.as_str(),
            job.priority,
            job.version,
            job.plan,
            job.starts.max(job.attempt),
            job.verdict.map_or("", |v| v.as_str()),
            started.map(local_time).unwrap_or_default(),
            finished.map(local_time).unwrap_or_default(),
            took(&job, now),
            job.figures.as_ref().map(headline).unwrap_or_default(),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Every try's running time summed (restarts and resumes included).
fn took(job: &Job, now: chrono::DateTime<chrono::Utc>) -> String {
    queue::running_secs(job, now).map(human_secs).unwrap_or_default()
}

/// `ASR  util@atk  util` as percentages, `–` for a figure not measured.
fn headline(h: &Headline) -> String {
    let pct = |rate: Option<f64>| rate.map_or("–".to_string(), |r| format!("{:.0} %", r * 100.0));
    format!("{:<5} {:<8} {}", pct(h.asr), pct(h.utility_under_attack), pct(h.utility))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headline_figures_read_as_percentages() {
        let h = Headline { asr: Some(0.391), utility: Some(1.0), utility_under_attack: None };
        assert_eq!(headline(&h), "39 %  –        100 %");
    }
}
