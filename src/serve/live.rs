//! `serve`'s live feed: what the page shows, kept current from inotify on the queue's
//! folders (`.pruefstand/` and `.pruefstand/jobs/`, neither recursive) — the daemon's
//! published state, the pause marker and every job change — never from a timer. One
//! thread wakes on those events, reads the state with the reader `status` uses
//! ([`Overview`]) and the job list, and publishes two feeds (`status` and `jobs`, JSON
//! text) that change only when their text does; `/events` streams them. At rest the
//! thread sleeps in `recv`. Not the HTTP side (`serve`) nor the page (`serve::page`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;

use anyhow::Context;
use serde_json::json;
use tokio::sync::watch;

use crate::daemon::state::{self, Activity, Overview};
use pruefstand_core::queue::{self, Job, Queue};
use pruefstand_core::watch::{Folder, Watch};
use pruefstand_store::RunDir;

use super::files::url_of;

/// The latest text of each feed; a subscriber sees every change it has not seen.
#[derive(Clone)]
pub struct Feeds {
    pub status: watch::Receiver<Arc<str>>,
    pub jobs: watch::Receiver<Arc<str>>,
}

/// Keeps the feed going; dropped, the thread ends and the feeds close (so every
/// `/events` stream ends: a graceful shutdown does not wait for open pages).
pub struct Live {
    _watcher: Watch,
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
pub fn start(queue: Queue, reports: PathBuf) -> anyhow::Result<(Live, Feeds)> {
    use pruefstand_core::watch::Change as Seen;
    let (tx, rx) = mpsc::channel();
    // The queue's watch: our own reads (the feed reads these files, the lock read-only)
    // are no change.
    let watcher = queue.watch(&[Folder::Daemon, Folder::Jobs], move |seen| {
        let change = if seen == Seen::Daemon { Change::State } else { Change::Jobs };
        let _ = tx.send(change);
    })?;
    let mut feed = Feed::new(queue, reports);
    let (status_tx, status_rx) = watch::channel(feed.status_text());
    let (jobs_tx, jobs_rx) = watch::channel(feed.jobs_text());
    std::thread::Builder::new()
        .name("serve-feed".into())
        .spawn(move || feed.follow(rx, status_tx, jobs_tx))
        .context("starting the feed thread")?;
    Ok((Live { _watcher: watcher }, Feeds { status: status_rx, jobs: jobs_rx }))
}

struct Feed {
    queue: Queue,
    reports: PathBuf,
    jobs: Vec<Job>,
    overview: Option<Overview>,
    errors: ErrorTally,
}

impl Feed {
    fn new(queue: Queue, reports: PathBuf) -> Feed {
        let mut feed = Feed { queue, reports, jobs: Vec::new(), overview: None, errors: ErrorTally::default() };
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
    }

    /// The `status` feed: `status --json`, its one line, and of the running job: the
    /// ETA in words, the cases with an error so far, the run its cases go to (below
    /// `reports/`) and whether that is its reference's run.
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
        })
    }
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
        let cases = dir.path().join(RunFile::Cases.name());
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
