//! `pruefstand status`: what the daemon does — not running, idle, waiting for the GPU
//! and why, or running a job with cases done/total and an ETA (a job on a cluster: its
//! shards done/running/pending). Reads the state the
//! daemon publishes (`.pruefstand/daemon.json`); `--watch` follows it (inotify) with a
//! progress bar until the first job it saw running has ended, then prints that job's
//! end (`job N: done, approved`) and exits with its verdict's code (`run`'s).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::client::{daemon_running, how_to_start};
use crate::daemon::state::{self, Activity, DaemonState, Overview};
use pruefstand_core::queue::Queue;
use pruefstand_core::root::Root;

#[derive(clap::Args)]
pub struct Args {
    /// The state as JSON: `daemon` (running, not_running), `pending` (jobs waiting),
    /// `paused`, `state` (what the daemon published: idle, paused, waiting, running with
    /// done/total cases and ETA, stopping; null without a daemon) and `shards` (a job
    /// on a cluster).
    #[arg(long)]
    pub json: bool,
    /// Follow the daemon with a progress bar until the job it runs (or the next one it
    /// starts) ends; then its verdict, and exit with its code (0 approved, 10
    /// rejected, 11 inconclusive, 12 invalid, 2 failed or cancelled).
    #[arg(long, conflicts_with = "json")]
    pub watch: bool,
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let queue = Queue::open(&root)?;
    if args.watch {
        return watch(&queue);
    }
    let jobs = queue.list()?;
    let overview = Overview::read(&queue, &jobs)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&overview.to_json())?);
        return Ok(ExitCode::SUCCESS);
    }
    match (overview.running, &overview.published) {
        (true, Some(state)) => outln!(
            "daemon: pid {}, since {}\n{}",
            state.pid,
            pruefstand_core::util::local_time(&state.since),
            state.activity.line()
        ),
        (true, None) => outln!("daemon: starting"),
        (false, _) => outln!("daemon: not running; start one: {}", how_to_start(&root)),
    }
    if !overview.running {
        for job in jobs.iter().filter(|j| j.state == pruefstand_core::queue::State::Running) {
            outln!(
                "job {} ({} on {}): {} — it was running when its daemon went away; it resumes when one starts",
                job.id,
                pruefstand_core::util::cut(&job.version, 40),
                pruefstand_core::util::cut(&job.plan, 40),
                crate::client::DAEMON_GONE
            );
        }
    }
    for job in jobs.iter().filter(|j| j.state == pruefstand_core::queue::State::Interrupted) {
        outln!(
            "job {} ({} on {}): interrupted — it resumes into its run folder when a daemon starts",
            job.id,
            pruefstand_core::util::cut(&job.version, 40),
            pruefstand_core::util::cut(&job.plan, 40),
        );
    }
    if let Some(counts) = overview.shards {
        outln!("{}", counts.line());
    }
    outln!("pending jobs: {}", overview.pending);
    if overview.paused {
        outln!("the queue is paused: no job starts until `pruefstand resume`");
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a daemon holds the lock, and its published state (stale when it does not).
fn current(queue: &Queue) -> anyhow::Result<(bool, Option<DaemonState>)> {
    Ok((daemon_running(queue)?, state::read(&queue.daemon_state_file())))
}

/// What `--watch` draws on a terminal.
#[derive(Debug, PartialEq)]
enum View {
    /// A running job whose cases are counted: a bar.
    Bar { done: u64, total: u64, message: String },
    /// Anything else, a job still starting among it: a spinner and the line.
    Line(String),
}

/// A bar only for a job whose plan's cases are counted: never one at 0/0 (full, to
/// indicatif) or at the last job's position.
fn view(running: bool, activity: Option<&Activity>) -> View {
    match (running, activity) {
        (true, Some(Activity::Running(p))) if p.total > 0 => {
            let eta = p.eta_s.map(|s| format!("ETA {}", state::human_secs(s))).unwrap_or_default();
            View::Bar {
                done: p.done as u64,
                total: p.total as u64,
                message: match &p.reference {
                    Some(reference) => {
                        format!("job {} ({} on {}), reference {reference} first {eta}", p.job, p.version, p.plan)
                    }
                    None => format!("job {} ({} on {}) {eta}", p.job, p.version, p.plan),
                },
            }
        }
        (true, Some(activity)) => View::Line(activity.line()),
        (true, None) => View::Line("daemon starting".to_string()),
        (false, _) => View::Line("daemon not running".to_string()),
    }
}

fn watch(queue: &Queue) -> anyhow::Result<ExitCode> {
    // The daemon's writes in `.pruefstand/`: our own reads of the state and the lock are
    // none to the queue's watch.
    let wakeups = queue.wakeups(&[pruefstand_core::watch::Folder::Daemon], |_| true)?;
    let bar = indicatif::ProgressBar::new(0);
    let running_style =
        indicatif::ProgressStyle::with_template("{spinner} {bar:40} {pos}/{len} cases  {msg}").expect("valid template");
    let other_style = indicatif::ProgressStyle::with_template("{spinner} {msg}").expect("valid template");
    // Without a terminal (a log, a pipe) the bar stays hidden: print each change as a line.
    let plain = bar.is_hidden();
    let mut last_line = String::new();
    // The first job seen running: the watch ends with its verdict.
    let mut watched = None;
    loop {
        let (running, published) = current(queue)?;
        if let Some(DaemonState { activity: Activity::Running(p), .. }) = &published {
            watched = watched.or(Some(p.job));
        }
        if let Some(job) = watched.map(|id| queue.load(id)).transpose()?.filter(|job| job.state.is_final()) {
            bar.finish_and_clear();
            outln!("job {}: {}", job.id, crate::client::describe(&job));
            return Ok(ExitCode::from(job.exit_code()));
        }
        if plain {
            let line = match view(running, published.as_ref().map(|s| &s.activity)) {
                View::Bar { .. } => published.as_ref().map(|s| s.activity.line()).unwrap_or_default(),
                View::Line(line) => line,
            };
            if line != last_line {
                outln!("{line}");
                last_line = line;
            }
        }
        match view(running, published.as_ref().map(|s| &s.activity)) {
            View::Bar { done, total, message } => {
                bar.set_style(running_style.clone());
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(message);
            }
            View::Line(line) => {
                bar.set_style(other_style.clone());
                bar.set_position(0);
                bar.set_message(line);
            }
        }
        bar.tick();
        // Wakes on the daemon's writes; the timeout only notices a daemon that died.
        wakeups.wait(Some(Duration::from_secs(5)))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::state::tests::running;

    #[test]
    fn the_watch_draws_no_bar_until_the_cases_are_counted() {
        let starting = view(true, Some(&running(0, 0)));
        assert_eq!(starting, View::Line("running job 3 (v on p): starting, the cases not yet counted".into()));
        let View::Bar { done, total, .. } = view(true, Some(&running(4, 11))) else { panic!("a bar") };
        assert_eq!((done, total), (4, 11));
        assert_eq!(view(false, Some(&running(4, 11))), View::Line("daemon not running".into()));
        assert_eq!(view(true, Some(&Activity::Idle)), View::Line(Activity::Idle.line()));
    }
}
