//! `pruefstand status`: what the daemon does — not running, idle, waiting for the GPU
//! and why, or running a job with cases done/total and an ETA (a job on a cluster: its
//! shards done/running/pending; a training job: its training's step, loss and ETA, and
//! once it ended, the newest training's last step and loss). Reads the state the
//! daemon publishes (`.pruefstand/daemon.json`) and a training's events
//! (`train::progress`); `--watch` follows both (inotify) with a
//! progress bar until the first job it saw running has ended, then prints that job's
//! end (`job N: done, approved`) and exits with its verdict's code (`run`'s).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::client::{daemon_running, how_to_start};
use crate::daemon::state::{self, Activity, DaemonState, Overview};
use crate::train::progress::JobTraining;
use pruefstand_core::queue::Queue;
use pruefstand_core::root::Root;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The state as JSON: `daemon` (running, not_running), `pending` (jobs waiting),
    /// `paused`, `state` (what the daemon published: idle, paused, waiting, running with
    /// done/total cases and ETA, stopping; null without a daemon), `shards` (a job
    /// on a cluster) and `training` (the running training job's step, steps, loss and
    /// ETA, else the newest training's).
    #[arg(long)]
    pub(crate) json: bool,
    /// Follow the daemon with a progress bar until the job it runs (or the next one it
    /// starts) ends; then its verdict, and exit with its code (0 approved, 10
    /// rejected, 11 inconclusive, 12 invalid, 2 failed or cancelled).
    #[arg(long, conflicts_with = "json")]
    pub(crate) watch: bool,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
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
    if let Some(training) = &overview.training {
        outln!("{}", training.line());
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
    // A night's jobs: which waits for which (`start-night`).
    for job in jobs.iter().filter(|j| !j.state.is_final()) {
        if let Some(chain) = job.chain() {
            outln!(
                "job {} ({} on {}, {}): {chain}",
                job.id,
                pruefstand_core::util::cut(&job.version, 40),
                pruefstand_core::util::cut(&job.plan, 40),
                job.state.as_str()
            );
        }
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
    /// A running job whose cases are counted, or a training whose steps are: a bar of
    /// `unit`s.
    Bar { done: u64, total: u64, unit: &'static str, message: String },
    /// Anything else, a job still starting among it: a spinner and the line.
    Line(String),
}

/// A bar only for a job whose plan's cases are counted: never one at 0/0 (full, to
/// indicatif) or at the last job's position. While the running job trains (`training`:
/// its training's progress), the bar counts its steps.
fn view(running: bool, activity: Option<&Activity>, training: Option<&JobTraining>) -> View {
    let training = match activity {
        Some(Activity::Running(p)) if running => training.filter(|t| t.job == p.job && t.in_progress()),
        _ => None,
    };
    if let Some(t) = training {
        return match t.progress.steps {
            Some(steps) if steps > 0 => {
                View::Bar { done: t.progress.step, total: steps, unit: "steps", message: t.line() }
            }
            _ => View::Line(t.line()),
        };
    }
    match (running, activity) {
        (true, Some(Activity::Running(p))) if p.total > 0 => {
            let eta = p.eta_s.map(|s| format!("ETA {}", state::human_secs(s))).unwrap_or_default();
            View::Bar {
                done: p.done as u64,
                total: p.total as u64,
                unit: "cases",
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

/// The training of the job the daemon runs, if it is a training job whose training
/// started.
fn running_training(queue: &Queue, running: bool, published: Option<&DaemonState>) -> Option<JobTraining> {
    let Some(DaemonState { activity: Activity::Running(p), .. }) = published else { return None };
    JobTraining::of(&queue.load(p.job).ok()?, running)
}

/// Whether a changed file of a training's folder is news to the watch: its events, not
/// its trainer's log (written many times a step) nor its checkpoints.
fn is_training_events(path: &Path) -> bool {
    path.file_name() == Some(std::ffi::OsStr::new(crate::train::request::EVENTS))
}

fn watch(queue: &Queue) -> anyhow::Result<ExitCode> {
    use pruefstand_core::watch::{Change, Folder};
    // The daemon's writes in `.pruefstand/` (our own reads of the state and the lock are
    // none to the queue's watch), and a training's events once one runs.
    let mut wakeups = queue.wakeups(&[Folder::Daemon], |change| match change {
        Change::Elsewhere(path) => is_training_events(path),
        _ => true,
    })?;
    let bar = indicatif::ProgressBar::new(0);
    let running_style = indicatif::ProgressStyle::with_template("{spinner} {bar:40} {pos}/{len} {prefix}  {msg}")
        .expect("valid template");
    let other_style = indicatif::ProgressStyle::with_template("{spinner} {msg}").expect("valid template");
    // Without a terminal (a log, a pipe) the bar stays hidden: print each change as a line.
    let plain = bar.is_hidden();
    let mut last_line = String::new();
    // The first job seen running: the watch ends with its verdict.
    let mut watched = None;
    // The training folder watched for its events, once the running job trains.
    let mut watched_training: Option<PathBuf> = None;
    loop {
        let (running, published) = current(queue)?;
        if let Some(DaemonState { activity: Activity::Running(p), .. }) = &published {
            watched = watched.or(Some(p.job));
        }
        let training = running_training(queue, running, published.as_ref());
        if let Some(dir) = training.as_ref().map(|t| &t.dir)
            && watched_training.as_ref() != Some(dir)
        {
            // Unwatched, the steps still show at the next state change or time-out.
            match wakeups.watch.add(dir) {
                Ok(()) => watched_training = Some(dir.clone()),
                Err(e) => tracing::debug!("{e:#}"),
            }
        }
        if let Some(job) = watched.map(|id| queue.load(id)).transpose()?.filter(|job| job.state.is_final()) {
            bar.finish_and_clear();
            outln!("job {}: {}", job.id, crate::client::describe(&job));
            return Ok(ExitCode::from(job.exit_code()));
        }
        let view = view(running, published.as_ref().map(|s| &s.activity), training.as_ref());
        if plain {
            let line = match &view {
                View::Bar { unit: "steps", message, .. } => message.clone(),
                View::Bar { .. } => published.as_ref().map(|s| s.activity.line()).unwrap_or_default(),
                View::Line(line) => line.clone(),
            };
            if line != last_line {
                outln!("{line}");
                last_line = line;
            }
        }
        match view {
            View::Bar { done, total, unit, message } => {
                bar.set_style(running_style.clone());
                bar.set_prefix(unit);
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
        let starting = view(true, Some(&running(0, 0)), None);
        assert_eq!(starting, View::Line("running job 3 (v on p): starting, the cases not yet counted".into()));
        let View::Bar { done, total, unit, .. } = view(true, Some(&running(4, 11)), None) else { panic!("a bar") };
        assert_eq!((done, total, unit), (4, 11, "cases"));
        assert_eq!(view(false, Some(&running(4, 11)), None), View::Line("daemon not running".into()));
        assert_eq!(view(true, Some(&Activity::Idle), None), View::Line(Activity::Idle.line()));
    }

    /// Job 3's training (`v-sft`) after `events`, the job in `state`.
    fn training(events: &str, state: pruefstand_core::queue::State) -> JobTraining {
        use crate::train::progress::Progress;
        JobTraining { job: 3, state, version: "v-sft".into(), dir: "/t".into(), progress: Progress::of_events(events) }
    }

    #[test]
    fn a_training_jobs_watch_counts_its_steps_until_it_is_trained_then_its_cases() {
        use pruefstand_core::queue::State;
        let start = r#"{"event":"start","steps":8,"resumed_from":0}"#;
        let step = format!("{start}\n{}", r#"{"event":"step","step":3,"steps":8,"loss":0.6123,"seconds":25.0}"#);
        let checking = training("", State::Running);
        let line = "training v-sft (job 3): starting: its rows are checked against the model server";
        assert_eq!(view(true, Some(&running(0, 0)), Some(&checking)), View::Line(line.into()));
        let View::Bar { done, total, unit, message } =
            view(true, Some(&running(0, 0)), Some(&training(&step, State::Running)))
        else {
            panic!("a bar")
        };
        assert_eq!((done, total, unit), (3, 8, "steps"));
        assert_eq!(message, "training v-sft (job 3): step 3/8, loss 0.6123, ETA 2 min 05 s");
        // Trained: the judging run's cases.
        let done =
            format!("{step}\n{}", r#"{"event":"done","adapter":"a","sha256":{},"losses":[0.7,0.6,0.5],"rows_used":1}"#);
        let View::Bar { unit, .. } = view(true, Some(&running(2, 11)), Some(&training(&done, State::Running))) else {
            panic!("a bar")
        };
        assert_eq!(unit, "cases");
        // Another job's training is not this job's.
        let mut other = training(&step, State::Running);
        other.job = 4;
        assert!(matches!(view(true, Some(&running(2, 11)), Some(&other)), View::Bar { unit: "cases", .. }));
        let ended = training(&done, State::Done);
        assert_eq!(ended.line(), "training v-sft (job 3, done): done, step 3/3, loss 0.5000");
    }
}
