//! The daemon's published state, `.pruefstand/daemon.json`: what `pruefstand status`
//! shows. Replaced atomically on every change (progress at most a few times a second),
//! and mirrored to systemd as a `STATUS=` line.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::gym;
use pruefstand_core::eta::Eta;
use pruefstand_core::queue;

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct DaemonState {
    pub(crate) pid: u32,
    pub(crate) since: String,
    pub(crate) updated_at: String,
    #[serde(flatten)]
    pub(crate) activity: Activity,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum Activity {
    Starting,
    Idle,
    /// `pruefstand pause`: no job starts until `resume` (a running one finishes).
    Paused,
    /// A job is pending but a guard holds it back.
    Waiting {
        next_job: u64,
        reason: String,
    },
    Running(JobProgress),
    /// The disk is full: the job (if one ran) resumes once `path` has space again.
    WaitingForSpace {
        job: Option<u64>,
        path: PathBuf,
        free_bytes: u64,
    },
    Stopping {
        reason: String,
    },
    /// Written on a clean exit; a crashed daemon leaves its last state, which `status`
    /// recognises by the free daemon lock.
    Stopped,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct JobProgress {
    pub(crate) job: u64,
    pub(crate) version: String,
    pub(crate) plan: String,
    /// The run the cases go to now (the reference's first, when it needs one).
    pub(crate) run_dir: Option<PathBuf>,
    pub(crate) done: usize,
    pub(crate) total: usize,
    pub(crate) eta_s: Option<f64>,
    pub(crate) started_at: String,
    /// The reference version whose cases run now (the reference's run comes first when
    /// the job needs one); absent while the job's own cases run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reference: Option<String>,
}

impl Activity {
    /// One line, for `status` and systemd's STATUS=.
    pub(crate) fn line(&self) -> String {
        match self {
            Activity::Starting => "starting".into(),
            Activity::Idle => "idle: the queue is empty".into(),
            Activity::Paused => "paused: no job starts until `pruefstand resume`".into(),
            Activity::Waiting { next_job, reason } => format!("waiting for the GPU (job {next_job} next): {reason}"),
            Activity::Running(p) => {
                let eta = p.eta_s.map(|s| format!(", ETA {}", human_secs(s))).unwrap_or_default();
                let of = p
                    .run_dir
                    .as_deref()
                    .and_then(Path::file_name)
                    .map(|n| format!(" [{}]", n.to_string_lossy()))
                    .unwrap_or_default();
                // Until the gym has counted the plan's cases there is no x/y to give.
                let done = match p.total {
                    0 => "starting, the cases not yet counted".to_string(),
                    total => format!("{}/{total} cases", p.done),
                };
                let phase = p.reference.as_ref().map(|r| format!(", reference {r} first")).unwrap_or_default();
                format!("running job {} ({} on {}){phase}: {done}{eta}{of}", p.job, p.version, p.plan)
            }
            Activity::WaitingForSpace { job, path, free_bytes } => {
                let then = job.map(|id| format!("; job {id} resumes then")).unwrap_or_default();
                format!("waiting for disk space: {} has {} free{then}", path.display(), human_bytes(*free_bytes))
            }
            Activity::Stopping { reason } => format!("stopping: {reason}"),
            Activity::Stopped => "stopped".into(),
        }
    }
}

pub(crate) fn human_secs(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

/// A size in words: `0 B`, `12.0 KiB`, `3.5 GiB`.
fn human_bytes(bytes: u64) -> String {
    let mut value = bytes as f64;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if value < 1024.0 {
            return if unit == "B" { format!("{bytes} B") } else { format!("{value:.1} {unit}") };
        }
        value /= 1024.0;
    }
    format!("{value:.1} TiB")
}

/// Writes the state file and STATUS= lines; works out the ETA from progress.
pub(super) struct Publisher {
    path: PathBuf,
    state: DaemonState,
    last_write: Option<Instant>,
    /// (run dir, cases done) at the first progress report of a run, and its cases'
    /// finish times: the rate counts only cases run by this daemon, not the ones resumed.
    rate: Option<(PathBuf, usize, Eta)>,
    /// The running job's own run folder: progress in another is its reference's.
    own_run: Option<PathBuf>,
}

const PROGRESS_EVERY: Duration = Duration::from_millis(250);

impl Publisher {
    pub(crate) fn new(path: PathBuf) -> Publisher {
        let now = queue::now();
        let state =
            DaemonState { pid: std::process::id(), since: now.clone(), updated_at: now, activity: Activity::Starting };
        Publisher { path, state, last_write: None, rate: None, own_run: None }
    }

    pub(crate) fn set(&mut self, activity: Activity) {
        if let Activity::Running(p) = &activity {
            self.own_run = p.run_dir.clone();
        }
        if activity != self.state.activity {
            self.state.activity = activity;
            self.write(true);
        }
    }

    pub(crate) fn progress(&mut self, run_dir: &Path, counts: gym::Counts) {
        let Activity::Running(progress) = &mut self.state.activity else { return };
        let gym::Counts { done, total, in_flight } = counts;
        let now = Instant::now();
        if self.rate.as_ref().is_none_or(|(dir, _, _)| dir != run_dir) {
            self.rate = Some((run_dir.to_path_buf(), done, Eta::new(now)));
        }
        let (_, done0, eta) = self.rate.as_mut().expect("set above");
        eta.observe(done.saturating_sub(*done0), in_flight, now);
        progress.eta_s = eta.remaining_s(total.saturating_sub(done), now);
        let own = self.own_run.as_deref().is_some_and(|own| same_dir(own, run_dir));
        progress.reference = (!own).then(|| reference_name(run_dir));
        progress.run_dir = Some(run_dir.to_path_buf());
        progress.done = done;
        progress.total = total;
        let due = self.last_write.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) || done == total;
        if due {
            self.write(false);
        }
    }

    fn write(&mut self, changed: bool) {
        self.state.updated_at = queue::now();
        self.last_write = Some(Instant::now());
        let line = self.state.activity.line();
        if changed {
            tracing::info!("{line}");
        }
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Status(&line)]);
        let text = match serde_json::to_vec_pretty(&self.state) {
            Ok(text) => text,
            Err(err) => return tracing::warn!("cannot serialise the daemon state: {err}"),
        };
        if let Err(err) =
            queue::write_private(&self.path, &text).or_else(|err| overwrite_in_place(&self.path, &text, err))
        {
            tracing::warn!("cannot publish the daemon state: {err:#}");
        }
    }
}

/// Whether two paths name one folder (the gym may report it spelt otherwise).
fn same_dir(a: &Path, b: &Path) -> bool {
    a == b || a.canonicalize().ok().is_some_and(|a| b.canonicalize().ok() == Some(a))
}

/// The version a reference's run folder belongs to: runs sit in
/// `reports/<version>/<plan>/<run>`.
fn reference_name(run_dir: &Path) -> String {
    let version = run_dir.parent().and_then(Path::parent).and_then(Path::file_name);
    version.map_or_else(|| "the reference".to_string(), |v| v.to_string_lossy().into_owned())
}

/// On a full disk the atomic replace has no room for its temporary file, yet the state
/// must say that the daemon waits for space: it is written over the old file instead,
/// within the blocks that file already holds, padded with spaces (still JSON).
fn overwrite_in_place(path: &Path, text: &[u8], err: anyhow::Error) -> anyhow::Result<()> {
    use std::io::{Seek, Write};
    use std::os::unix::fs::MetadataExt;
    let mut file = std::fs::OpenOptions::new().write(true).open(path).map_err(|_| err)?;
    let meta = file.metadata()?;
    anyhow::ensure!(
        text.len() as u64 <= meta.blocks() * 512,
        "{}: no room for the state, the disk is full",
        path.display()
    );
    let mut bytes = text.to_vec();
    bytes.resize(bytes.len().max(meta.len() as usize), b' ');
    file.rewind()?;
    file.write_all(&bytes).with_context(|| format!("writing {}", path.display()))
}

/// Reads the published state (`None` when no daemon ever wrote one).
pub(crate) fn read(path: &Path) -> Option<DaemonState> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// What `pruefstand status --json` prints and `pruefstand serve` streams: whether a
/// daemon holds the lock, the state it published, the pending jobs, the pause, a
/// cluster job's shards and a training job's progress. One reader for both.
#[derive(Clone, Debug)]
pub(crate) struct Overview {
    pub(crate) running: bool,
    /// The published state (stale when no daemon runs).
    pub(crate) published: Option<DaemonState>,
    pub(crate) pending: usize,
    pub(crate) paused: bool,
    pub(crate) shards: Option<crate::cluster::ShardCounts>,
    /// The running training job's progress, else the newest training's.
    pub(crate) training: Option<crate::train::progress::JobTraining>,
}

impl Overview {
    /// Reads the lock, the state file and the pause marker; `jobs` is the queue's list
    /// (the caller may have it already).
    pub(crate) fn read(queue: &queue::Queue, jobs: &[queue::Job]) -> anyhow::Result<Overview> {
        let running = lock_held(queue)?;
        let published = read(&queue.daemon_state_file());
        let shards = match (running, &published) {
            (true, Some(DaemonState { activity: Activity::Running(p), .. })) => shard_counts(queue, p.job),
            _ => None,
        };
        Ok(Overview {
            running,
            published,
            pending: jobs.iter().filter(|j| j.state == queue::State::Pending).count(),
            paused: queue.is_paused(),
            shards,
            training: crate::train::progress::JobTraining::shown(jobs, running),
        })
    }

    /// The state that counts: the published one while a daemon runs.
    pub(crate) fn activity(&self) -> Option<&Activity> {
        self.published.as_ref().filter(|_| self.running).map(|s| &s.activity)
    }

    /// `status --json`.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "daemon": if self.running { "running" } else { "not_running" },
            "pending": self.pending,
            "paused": self.paused,
            "state": if self.running { serde_json::to_value(&self.published).unwrap_or_default() } else { serde_json::Value::Null },
            "shards": self.shards,
            "training": self.training,
        })
    }
}

/// Whether a daemon holds the daemon lock. Looked at through a read-only descriptor:
/// its close is no write, so a watcher of `.pruefstand/` (`serve`) is not woken by its
/// own look. No lock file: no daemon ever ran here.
pub(crate) fn lock_held(queue: &queue::Queue) -> anyhow::Result<bool> {
    use nix::fcntl::{Flock, FlockArg};
    let path = queue.daemon_lock_file();
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(anyhow::Error::new(err).context(format!("opening {}", path.display()))),
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(_) => Ok(false),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(true),
        Err((_, err)) => Err(anyhow::Error::new(err).context("looking at the daemon lock")),
    }
}

/// A running job's shards on the cluster, as the daemon's last look saw them.
fn shard_counts(queue: &queue::Queue, job: u64) -> Option<crate::cluster::ShardCounts> {
    let run_dir = queue.load(job).ok()?.run_dir?;
    crate::cluster::ArrayState::load(&pruefstand_store::RunDir::open(run_dir).ok()?)
        .ok()
        .flatten()
        .map(|state| state.counts)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Job 3 of `v` on `p`, `done` of `total` cases.
    pub(crate) fn running(done: usize, total: usize) -> Activity {
        Activity::Running(JobProgress {
            job: 3,
            version: "v".into(),
            plan: "p".into(),
            run_dir: None,
            done,
            total,
            eta_s: None,
            started_at: String::new(),
            reference: None,
        })
    }

    #[test]
    fn a_full_disk_says_where_and_how_much_is_free() {
        let waiting =
            Activity::WaitingForSpace { job: Some(4), path: "/srv/bench/.pruefstand".into(), free_bytes: 12 * 1024 };
        assert_eq!(
            waiting.line(),
            "waiting for disk space: /srv/bench/.pruefstand has 12.0 KiB free; job 4 resumes then"
        );
        assert_eq!(human_bytes(0), "0 B");
    }

    #[test]
    fn a_job_whose_cases_are_not_counted_yet_is_starting_not_at_0_of_0() {
        assert_eq!(running(0, 0).line(), "running job 3 (v on p): starting, the cases not yet counted");
        assert_eq!(running(2, 11).line(), "running job 3 (v on p): 2/11 cases");
    }

    #[test]
    fn the_references_cases_are_named_as_the_references() {
        let dir = tempfile::tempdir().unwrap();
        let mut publisher = Publisher::new(dir.path().join("daemon.json"));
        let Activity::Running(mut p) = running(0, 0) else { unreachable!() };
        p.run_dir = Some("/b/reports/v/p/run-1".into());
        publisher.set(Activity::Running(p));
        let counts = |done| gym::Counts { done, total: 11, in_flight: 1 };
        publisher.progress(Path::new("/b/reports/base/p/run-0"), counts(2));
        assert_eq!(publisher.state.activity.line(), "running job 3 (v on p), reference base first: 2/11 cases [run-0]");
        publisher.progress(Path::new("/b/reports/v/p/run-1"), counts(1));
        assert_eq!(publisher.state.activity.line(), "running job 3 (v on p): 1/11 cases [run-1]");
    }
}
