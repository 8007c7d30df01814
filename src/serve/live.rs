//! `serve`'s live feed: what the page shows, kept current from inotify on the queue's
//! folders (`.pruefstand/` and `.pruefstand/jobs/`, neither recursive) — the daemon's
//! published state, the pause marker and every job change — and, while a training job
//! trains, on its training folder (its `trainer-events.jsonl`) — never from a timer. One
//! thread wakes on those events, reads the state with the reader `status` uses
//! ([`Overview`], a training's progress with it) and the job list, and publishes two
//! feeds (`status` and `jobs`, JSON text) that change only when their text does;
//! `/events` streams them. At rest the thread sleeps in `recv`. Not the HTTP side
//! (`serve`) nor the page (`serve::page`).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};

use anyhow::Context;
use serde_json::json;
use tokio::sync::watch;

use crate::daemon::state::{self, Activity, Overview};
use crate::train::progress::JobTraining;
use pruefstand_core::queue::{self, Job, Queue};
use pruefstand_core::watch::{Folder, Watch};
use pruefstand_store::RunDir;

use super::files::url_of;

/// The latest text of each feed; a subscriber sees every change it has not seen.
#[derive(Clone)]
pub(super) struct Feeds {
    pub(crate) status: watch::Receiver<Arc<str>>,
    pub(crate) jobs: watch::Receiver<Arc<str>>,
}

/// Keeps the feed going; dropped, the thread ends and the feeds close (so every
/// `/events` stream ends: a graceful shutdown does not wait for open pages).
pub(crate) struct Live {
    /// The feed holds it weakly (to watch a training's folder): this is its one owner.
    _watcher: Arc<Mutex<Watch>>,
}

#[derive(Clone, Copy, PartialEq)]
enum Change {
    /// Something in `jobs/` (a job's file, `.changed`).
    Jobs,
    /// `daemon.json`, the pause marker, the daemon lock (closed by a daemon that
    /// ended without a word), …
    State,
}

/// Starts watching and the feed thread; the feeds are published before it returns.
pub(crate) fn start(queue: Queue, reports: PathBuf) -> anyhow::Result<(Live, Feeds)> {
    use pruefstand_core::watch::Change as Seen;
    let (tx, rx) = mpsc::channel();
    // The queue's watch: our own reads (the feed reads these files, the lock read-only)
    // are no change.
    let watcher = queue.watch(&[Folder::Daemon, Folder::Jobs], move |seen| {
        let change = match seen {
            Seen::Jobs | Seen::Job(_) | Seen::JobFolder(_) | Seen::Unknown => Change::Jobs,
            Seen::Daemon => Change::State,
            Seen::Elsewhere(path) if is_training_events(&path) => Change::State,
            // The rest of a training's folder: its trainer's log, written many times a
            // step, and its checkpoints.
            Seen::Elsewhere(_) => return,
        };
        let _ = tx.send(change);
    })?;
    let watcher = Arc::new(Mutex::new(watcher));
    let mut feed = Feed::new(queue, reports, Arc::downgrade(&watcher));
    let (status_tx, status_rx) = watch::channel(feed.status_text());
    let (jobs_tx, jobs_rx) = watch::channel(feed.jobs_text());
    std::thread::Builder::new()
        .name("serve-feed".into())
        .spawn(move || feed.follow(rx, status_tx, jobs_tx))
        .context("starting the feed thread")?;
    Ok((Live { _watcher: watcher }, Feeds { status: status_rx, jobs: jobs_rx }))
}

/// A training's event lines (any other file of its folder is no news to the feed).
fn is_training_events(path: &Path) -> bool {
    path.file_name() == Some(std::ffi::OsStr::new(crate::train::request::EVENTS))
}

struct Feed {
    queue: Queue,
    reports: PathBuf,
    jobs: Vec<Job>,
    overview: Option<Overview>,
    errors: ErrorTally,
    /// To watch the running training's folder; gone once `Live` is dropped.
    watcher: Weak<Mutex<Watch>>,
    /// The training folder watched now.
    training_dir: Option<PathBuf>,
}

impl Feed {
    fn new(queue: Queue, reports: PathBuf, watcher: Weak<Mutex<Watch>>) -> Feed {
        let mut feed = Feed {
            queue,
            reports,
            jobs: Vec::new(),
            overview: None,
            errors: ErrorTally::default(),
            watcher,
            training_dir: None,
        };
        feed.reload_jobs();
        feed.reload_status();
        feed
    }

    /// Blocks on the watcher's events until it is dropped.
    fn follow(&mut self, rx: mpsc::Receiver<Change>, status: watch::Sender<Arc<str>>, jobs: watch::Sender<Arc<str>>) {
        while let Ok(first) = rx.recv() {
            let mut changes = vec![first];
            changes.extend(rx.try_iter());
            if changes.contains(&Change::Jobs) {
                self.reload_jobs();
                publish(&jobs, self.jobs_text());
            }
            self.reload_status();
            publish(&status, self.status_text());
        }
    }

    fn reload_jobs(&mut self) {
        match self.queue.list() {
            Ok(jobs) => self.jobs = jobs,
            Err(err) => tracing::warn!("reading the queue: {err:#}"),
        }
    }

    fn reload_status(&mut self) {
        match Overview::read(&self.queue, &self.jobs) {
            Ok(overview) => self.overview = Some(overview),
            Err(err) => tracing::warn!("reading the daemon's state: {err:#}"),
        }
        if let Some(Activity::Running(p)) = self.overview.as_ref().and_then(Overview::activity)
            && let Some(run_dir) = &p.run_dir
        {
            self.errors.update(run_dir);
        }
        self.follow_training();
    }

    /// Watches the folder of the training that runs now (its steps are written there,
    /// not under `.pruefstand/`), and stops watching one whose job no longer runs.
    fn follow_training(&mut self) {
        let training = self.overview.as_ref().and_then(|o| o.training.as_ref());
        let dir = training.filter(|t| t.state == queue::State::Running).map(|t| t.dir.clone());
        if dir == self.training_dir {
            return;
        }
        let Some(watcher) = self.watcher.upgrade() else { return };
        let mut watcher = pruefstand_core::util::lock(&watcher);
        if let Some(old) = self.training_dir.take() {
            watcher.remove(&old);
        }
        if let Some(dir) = dir {
            match watcher.add(&dir) {
                Ok(()) => self.training_dir = Some(dir),
                // Tried again at the next change; its steps show at the daemon's next word.
                Err(err) => tracing::warn!("watching the training folder {}: {}", dir.display(), err.root_cause()),
            }
        }
    }

    /// The `status` feed: `status --json`, its one line, and of the running job: the
    /// ETA in words, the cases with an error so far, the run its cases go to (below
    /// `reports/`) and whether that is its reference's run; and a training's progress
    /// in words (`training`: the running training job's, else the newest training's).
    fn status_text(&self) -> Arc<str> {
        let Some(overview) = &self.overview else {
            return Arc::from(json!({ "status": null, "line": "cannot read the daemon's state" }).to_string());
        };
        let line = match (overview.running, &overview.published) {
            (true, Some(published)) => published.activity.line(),
            (true, None) => "starting".to_string(),
            (false, _) => {
                "the daemon is not running (`pruefstand daemon` or `systemctl --user start pruefstand`)".into()
            }
        };
        let (mut eta, mut errors, mut run, mut reference) = (None, None, None, None);
        if let Some(Activity::Running(p)) = overview.activity() {
            eta = p.eta_s.map(state::human_secs);
            if let Some(dir) = &p.run_dir {
                errors = (*dir == self.errors.run_dir).then_some(self.errors.errors);
                run = Some(dir.strip_prefix(&self.reports).unwrap_or(dir).display().to_string());
                // The job's own run is the candidate's; cases going elsewhere make its reference.
                let job = self.jobs.iter().find(|j| j.id == p.job);
                reference = job.and_then(|j| j.run_dir.as_ref()).map(|own| own != dir);
            }
        }
        let shards = overview.shards.map(|s| s.line());
        Arc::from(
            json!({
                "status": overview.to_json(),
                "line": line,
                "eta": eta,
                "errors": errors,
                "run": run,
                "reference": reference,
                "shards": shards,
                "training": overview.training.as_ref().map(training_words),
            })
            .to_string(),
        )
    }

    /// The `jobs` feed: each job's row, newest first, with a link to its report once
    /// there is one, and whether the trend index exists.
    fn jobs_text(&self) -> Arc<str> {
        let rows: Vec<_> = self.jobs.iter().rev().map(|job| self.row(job)).collect();
        let index = self.reports.join(pruefstand_report::INDEX_FILE).is_file().then_some("/reports/index.html");
        Arc::from(json!({ "jobs": rows, "index": index }).to_string())
    }

    fn row(&self, job: &Job) -> serde_json::Value {
        let (started, finished) = queue::started_finished(job);
        let report = job
            .run_dir
            .as_deref()
            .map(|dir| RunDir::new(dir).report_path())
            .filter(|report| report.is_file())
            .and_then(|report| url_of(&self.reports, &report.canonicalize().ok()?));
        json!({
            "id": job.id,
            "state": job.state.as_str(),
            "priority": job.priority,
            "version": job.version,
            "plan": job.plan,
            "attempt": job.attempt,
            "verdict": job.verdict.map(|v| v.as_str()),
            "summary": job.summary,
            "error": job.error.as_deref().and_then(|e| e.lines().next()),
            "enqueued": job.enqueued_at,
            "started": started,
            "finished": finished,
            "report": report,
            "training": JobTraining::of(job, false).map(|t| t.progress.line()),
        })
    }
}

/// A training's progress as the page shows it: the line `status` prints, and the step,
/// loss and ETA in words for its fields.
fn training_words(t: &JobTraining) -> serde_json::Value {
    let p = &t.progress;
    json!({
        "job": t.job,
        "line": t.line(),
        "in_progress": t.in_progress(),
        "step": p.step,
        "steps": p.steps,
        "loss": p.loss.map(|loss| format!("{loss:.4}")),
        "eta": p.eta_s.map(crate::train::trainer::span),
    })
}

fn publish(feed: &watch::Sender<Arc<str>>, text: Arc<str>) {
    feed.send_if_modified(|current| {
        let changed = **current != *text;
        if changed {
            *current = text;
        }
        changed
    });
}

/// Cases with an error in the running run's `cases.jsonl`, read on from where the last
/// look stopped (only whole lines).
#[derive(Default)]
struct ErrorTally {
    run_dir: PathBuf,
    offset: u64,
    errors: usize,
}

impl ErrorTally {
    fn update(&mut self, run_dir: &Path) {
        if self.run_dir != run_dir {
            *self = ErrorTally { run_dir: run_dir.to_path_buf(), offset: 0, errors: 0 };
        }
        let Ok(tail) = RunDir::open(run_dir).and_then(|run| run.read_cases_from(self.offset)) else { return };
        if tail.restarted {
            self.errors = 0;
        }
        self.offset = tail.next_offset;
        self.errors += tail.records.iter().filter(|record| record.error.is_some()).count();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_store::RunFile;

    #[test]
    fn errors_are_counted_from_whole_lines_and_restart_with_a_new_run() {
        let dir = tempfile::tempdir().unwrap();
        let cases = pruefstand_store::RunDir::new(dir.path()).test_file(RunFile::Cases);
        let record = |error: Option<&str>| {
            let case = pruefstand_core::case::Case::clean("banking", "user_task_0");
            let mut record = pruefstand_core::case::CaseRecord::of(&case, Some(true), None);
            record.error = error.map(str::to_string);
            serde_json::to_string(&record).unwrap() + "\n"
        };
        let (ok, boom, half) = (record(None), record(Some("boom")), record(Some("half")));
        std::fs::write(&cases, format!("{ok}{boom}{}", &half[..half.len() - 5])).unwrap();
        let mut tally = ErrorTally::default();
        tally.update(dir.path());
        assert_eq!(tally.errors, 1);
        std::fs::write(&cases, format!("{ok}{boom}{half}")).unwrap();
        tally.update(dir.path());
        assert_eq!(tally.errors, 2, "the half line counted once whole");
        std::fs::write(&cases, &ok).unwrap();
        tally.update(dir.path());
        assert_eq!(tally.errors, 0, "a shorter file is read anew");
    }
}
