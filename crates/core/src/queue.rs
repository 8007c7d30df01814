//! The durable job queue: plain files under `<root>/.pruefstand/` (user-only, 0700
//! folders and 0600 files), the source of truth for what runs and what ran.
//!
//! ```text
//! .pruefstand/
//!   queue.lock          flock held for every read-modify-write of a job (short)
//!   daemon.lock         flock held by the one running daemon (its pid inside)
//!   daemon.json         the daemon's published state (`status` reads it)
//!   next-id             the last job id handed out
//!   tmp/                jobs being assembled (renamed into jobs/ when complete)
//!   paused              present while the queue is paused (`pause`/`resume`)
//!   locks/gpu.lock      the bench lock: held while a GPU-backed run runs (`benchlock`)
//!   jobs/<id>/job.json  the job: state, attempts, run dir, verdict, history
//!   jobs/<id>/log       the daemon's lines about the job (`pruefstand log`)
//!   jobs/<id>/notifications.json  its hooks' notifications, each delivered or still owed
//!   jobs/<id>/snapshot/version/<name>.toml   the spec text as it was at `start`
//!   jobs/<id>/snapshot/plan/<name>.toml      the profile text as it was at `start`
//!   jobs/<id>/snapshot/plan/found/<n>.json   its `[[found]]` family files, copied
//!   jobs/<id>/snapshot/reference/<name>.toml the reference's spec (and its own
//!                                            reference's, down the chain) at `start`
//! ```
//!
//! A job holds or pins everything its spec and plan name, resolved at `start` where
//! `run` resolves it (against the spec's or the plan's own folder), so a job runs what
//! `start` checked: the plan's found families are copied (the copied plan names the
//! copies); the files a spec names beside itself (an adapter's exports and their
//! manifests, a chat template, a tool-parser plugin) stay where they are, read through
//! the folder the spec was queued from (`Snapshot::origins`), each pinned by its sha256
//! (`Snapshot::pinned`) and checked again when the job starts.
//!
//! Every change is a whole-file atomic replace (temporary file, fsync, rename, fsync of
//! the folder); a new job appears by renaming its finished folder into `jobs/`, so a
//! crash never leaves a half-queued job. All state changes go through [`Job::apply`],
//! the one place that knows which transitions are legal.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::files;
use crate::plan::{FoundFile, Profile};
use crate::record::Verdict;
use crate::root::Root;
use crate::spec::{Origins, ServedFileKind, Version};
use crate::util;

/// Starts of one job, crashes included, before it is given up as failed.
pub const MAX_ATTEMPTS: u32 = 3;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Pending,
    Running,
    Done,
    Failed,
    Cancelled,
    /// Stopped by a SIGTERM or found running after a crash; goes back to pending when a
    /// daemon starts, and resumes into the same run directory.
    Interrupted,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Done => "done",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
            State::Interrupted => "interrupted",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Cancelled)
    }
}

/// What can happen to a job.
#[derive(Debug, Clone)]
pub enum Transition {
    /// pending → running, into this run directory (kept across attempts).
    Start { run_dir: PathBuf },
    /// running → done.
    Finish { verdict: Verdict, summary: String, figures: Headline },
    /// pending | running → failed.
    Fail { error: String },
    /// `pruefstand cancel` on a pending or interrupted job: cancelled at once; on a
    /// running one only the request is recorded, the daemon stops it.
    Cancel,
    /// running → cancelled, once the daemon has stopped the run.
    Stopped,
    /// running → interrupted: a SIGTERM (`crashed: false`, which does not use up an
    /// attempt) or a crash found at start-up.
    Interrupt { reason: String, crashed: bool },
    /// interrupted → pending.
    Requeue,
    /// pending | interrupted: a new priority (`pruefstand priority`).
    Prioritise { priority: i32 },
    /// done | failed | cancelled → pending, with its attempts and result cleared; it
    /// resumes into its run directory (`pruefstand restart`).
    Restart,
    /// Any state → failed: the job's file no longer loads, and the daemon writes it
    /// again from its last copy ([`Queue::replace_damaged`]). A verdict it reached stays.
    Damaged { error: String },
}

/// The figures a finished job shows in `queue` and its hooks (rates, 0–1): `asr` is the
/// ASR of all attacks, `decisive` the figure R2 judged, by its name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Headline {
    pub asr: Option<f64>,
    pub utility: Option<f64>,
    pub utility_under_attack: Option<f64>,
    /// The judgement's `figures.decisive`; absent in jobs of older builds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decisive: Option<Box<crate::record::Decisive>>,
}

/// The snapshot taken at `start`: later edits of the spec or profile never change a
/// queued job.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Snapshot {
    /// Relative to the job folder.
    pub spec: PathBuf,
    pub spec_source: PathBuf,
    /// sha256 of the spec text, and the spec's own (canonical) hash.
    pub spec_sha256: String,
    pub spec_hash: String,
    pub plan: PathBuf,
    pub plan_source: PathBuf,
    /// sha256 of the plan text as read (the copy differs where it names the copied
    /// found families).
    pub plan_sha256: String,
    /// The folder (relative to the job folder) holding the reference's spec as it was
    /// at `start`, where the job's references are found; absent without a reference
    /// (and in jobs queued before references were snapshotted: then `versions/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub references: Option<PathBuf>,
    /// By version name (the job's and its references'), the folder its spec was
    /// queued from: the files a spec names relative to its folder are found there.
    /// Empty in jobs queued before it was kept (their files then resolve in the
    /// snapshot, as they did).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub origins: BTreeMap<String, PathBuf>,
    /// The files outside the snapshot the specs name, each by its sha256 at `start`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<Pinned>,
    /// The plan's `[[found]]` family files, each copied into the snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub found: Vec<Copied>,
}

/// A file a job's spec names, pinned when the job was queued: the job starts only while
/// the file still has this sha256.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Pinned {
    /// Absolute, as the run reads it (links are not resolved: the run follows them too).
    pub path: PathBuf,
    pub sha256: String,
    /// Which field of which version names it, for the error when it changed.
    pub named_by: String,
}

impl Pinned {
    /// The file at `path` as it is now, named by `named_by`.
    fn take(path: PathBuf, named_by: String) -> anyhow::Result<Pinned> {
        let sha256 = files::sha256_regular(&path).with_context(|| named_by.clone())?;
        Ok(Pinned { path, sha256, named_by })
    }

    /// Whether the file is still what it was when pinned; an error naming it, and both
    /// hashes, when it is not.
    pub fn check(&self) -> anyhow::Result<()> {
        let now = files::sha256_regular(&self.path)
            .with_context(|| format!("{}, pinned when the job was queued, is gone or unreadable", self.named_by))?;
        anyhow::ensure!(
            now == self.sha256,
            "{} changed since the job was queued: {} has sha256 {now}, it had {} then; queue the version again \
             (`pruefstand start`) to run it on the file as it is now",
            self.named_by,
            self.path.display(),
            self.sha256
        );
        Ok(())
    }
}

/// A file copied into a job's snapshot: from where, to where (relative to the job
/// folder) and its sha256.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Copied {
    pub source: PathBuf,
    pub copy: PathBuf,
    pub sha256: String,
}

/// A job as `start` asked for it, read and checked but not yet queued
/// ([`Queue::prepare`], then [`Queue::enqueue`]): the caller can refuse it in between.
pub struct Prepared {
    pub version: Version,
    pub plan_path: PathBuf,
    pub profile: Profile,
    plan_text: String,
    spec_text: String,
    /// The plan's `[[found]]` families, read and checked against their pins.
    pub found: Vec<FoundFile>,
    origins: BTreeMap<String, PathBuf>,
    pinned: Vec<Pinned>,
}

impl Prepared {
    /// The families the plan holds out: its `held_out` and its held-out found families
    /// (their attacks, as a run records them).
    pub fn held_out(&self) -> Vec<String> {
        let found = self.found.iter().zip(&self.profile.found).filter(|(_, section)| section.held_out);
        let found = found.map(|(file, _)| file.family.attack());
        self.profile.held_out.iter().map(|f| f.get_ref().clone()).chain(found).collect()
    }

    /// The families a run of this plan may hand to a training: those it runs and its
    /// found families, less those it holds out (an export refuses those, and an
    /// environment never offers them).
    pub fn trained_on(&self) -> std::collections::BTreeSet<String> {
        let held: std::collections::BTreeSet<String> = self.held_out().into_iter().collect();
        let mut runs: std::collections::BTreeSet<String> =
            self.profile.attacks.iter().map(|a| a.get_ref().clone()).collect();
        for suite in &self.profile.suites {
            runs.extend(suite.attacks.iter().flatten().map(|a| a.get_ref().clone()));
        }
        runs.extend(self.found.iter().map(|file| file.family.attack()));
        runs.retain(|family| !held.contains(family));
        runs
    }

    /// Pins the found family in `file` into this job's plan as seen (`held_out =
    /// false`): its cases run attacked under it, and an export of the run trains on them.
    /// `start-night` carries the family the last night's campaign found into the next
    /// night's rows this way. The plan file is untouched; the job's copy of the plan
    /// gets the section (the family's file copied into the snapshot like any other).
    /// False when the plan pins the same bytes as seen already; an error when it holds
    /// them out (what the gate keeps unseen is never trained on), or when the file is no
    /// found family.
    pub fn pin_found_as_seen(&mut self, file: &Path) -> anyhow::Result<bool> {
        let file = std::path::absolute(file).with_context(|| format!("the found family {}", file.display()))?;
        let bytes = files::read_regular(&file, files::MAX_FOUND_FAMILY_BYTES, "a found family")?;
        let sha256 = util::sha256_hex(&bytes);
        for (pinned, section) in self.found.iter().zip(&self.profile.found) {
            if util::sha256_hex(&pinned.bytes) != sha256 {
                continue;
            }
            anyhow::ensure!(
                !section.held_out,
                "{} holds the found family {} ({}) out: what the gate keeps unseen is not trained on",
                self.plan_path.display(),
                pinned.family.name,
                file.display()
            );
            return Ok(false);
        }
        let path = file.to_str().with_context(|| format!("{}: not UTF-8", file.display()))?;
        // A JSON string is a TOML basic string (the same escapes).
        let section = format!(
            "\n# pinned as seen by start-night\n[[found]]\nfile = {}\nsha256 = \"{sha256}\"\nheld_out = false\n",
            serde_json::to_string(path)?
        );
        let text = format!("{}{section}", self.plan_text);
        let profile = Profile::parse(&self.plan_path, &text)?;
        self.found = crate::plan::read_found(&self.plan_path, &profile, &text)?;
        (self.profile, self.plan_text) = (profile, text);
        Ok(true)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct HistoryEntry {
    pub at: String,
    pub state: State,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// `jobs/<id>/job.json`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Job {
    pub id: u64,
    pub version: String,
    pub plan: String,
    /// Higher runs first; equal priorities run in enqueue order.
    pub priority: i32,
    pub enqueued_at: String,
    pub state: State,
    /// Starts that crashed or are in progress (a clean SIGTERM gives its attempt back);
    /// at [`MAX_ATTEMPTS`] the job is given up as failed.
    pub attempt: u32,
    /// Every start of the job, across resumes and restarts (never given back): the
    /// queue's `try`. Absent from jobs queued before it was counted.
    #[serde(default)]
    pub starts: u32,
    pub run_dir: Option<PathBuf>,
    pub verdict: Option<Verdict>,
    /// The judgement's one-line summary.
    pub summary: Option<String>,
    /// The headline figures of a finished job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figures: Option<Headline>,
    pub error: Option<String>,
    /// Set by `cancel` on a running job; the daemon acts on it.
    #[serde(default)]
    pub cancel_requested: bool,
    pub snapshot: Snapshot,
    pub history: Vec<HistoryEntry>,
    /// A training job's training folder (`reports/<new>/training/<id>/`), recorded by
    /// the daemon as the training starts: where `status` and `serve` read its progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_dir: Option<PathBuf>,
    /// A training job (`pruefstand start-training`): what to train from the job's
    /// version, as the trainer's order reads it (opaque here). The daemon trains, then
    /// judges the version the training made on the job's plan: one job, one verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<serde_json::Value>,
    /// A link of a chain (`pruefstand start-night`): this job waits for job `after` to
    /// be done with a valid verdict, and fails — stopping the chain — when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// The chain's name (a night's), the same on each of its jobs: its morning report
    /// is `reports/nights/<night>/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub night: Option<String>,
}

impl Job {
    /// Its place in a chain, in words (`night 20261207-kandidat, after job 3`); none
    /// for a job of no chain.
    pub fn chain(&self) -> Option<String> {
        let night = self.night.as_deref()?;
        Some(match self.after {
            Some(after) => format!("night {night}, after job {after}"),
            None => format!("night {night}, its first job"),
        })
    }

    /// The one place job states change. An illegal transition is an error and leaves
    /// the job as it was.
    pub fn apply(&mut self, transition: Transition) -> anyhow::Result<()> {
        use State::*;
        let (to, note) = match (self.state, &transition) {
            (Pending, Transition::Start { run_dir }) => {
                if self.attempt >= MAX_ATTEMPTS {
                    bail!("job {} was started {} times already; giving up", self.id, self.attempt);
                }
                // (A job from before `starts` was counted has had at least `attempt`.)
                self.starts = self.starts.max(self.attempt) + 1;
                self.attempt += 1;
                self.run_dir = Some(run_dir.clone());
                (Running, format!("try {} into {}", self.starts, run_dir.display()))
            }
            (Running, Transition::Finish { verdict, summary, figures }) => {
                self.verdict = Some(*verdict);
                self.summary = Some(summary.clone());
                self.figures = Some(figures.clone());
                (Done, verdict.as_str().to_string())
            }
            (Pending | Running | Interrupted, Transition::Fail { error }) => {
                self.error = Some(error.clone());
                (Failed, error.clone())
            }
            (Pending | Interrupted, Transition::Cancel) => (Cancelled, "cancelled before it ran".into()),
            (Running, Transition::Cancel) => {
                self.cancel_requested = true;
                return Ok(());
            }
            (Running, Transition::Stopped) => (Cancelled, "cancelled while running".into()),
            (Running, Transition::Interrupt { reason, crashed }) => {
                if !crashed {
                    self.attempt = self.attempt.saturating_sub(1);
                }
                (Interrupted, reason.clone())
            }
            (Interrupted, Transition::Requeue) => (Pending, "back in the queue".into()),
            (Pending | Interrupted, Transition::Prioritise { priority }) => {
                self.priority = *priority;
                self.history.push(HistoryEntry { at: now(), state: self.state, note: format!("priority {priority}") });
                return Ok(());
            }
            (Done | Failed | Cancelled, Transition::Restart) => {
                self.attempt = 0;
                self.verdict = None;
                self.summary = None;
                self.figures = None;
                self.error = None;
                self.cancel_requested = false;
                (Pending, "restarted".into())
            }
            (_, Transition::Damaged { error }) => {
                self.error = Some(error.clone());
                (Failed, error.clone())
            }
            (state, transition) => bail!("{}", refusal(self.id, state, transition)),
        };
        self.state = to;
        self.history.push(HistoryEntry { at: now(), state: to, note });
        Ok(())
    }

    pub fn exit_code(&self) -> u8 {
        match (self.state, self.verdict) {
            (State::Done, Some(verdict)) => verdict.exit_code(),
            _ => util::EXIT_COULD_NOT_RUN,
        }
    }
}

/// Why `transition` does not apply to a job in `state`, in the words of the command
/// that asked for it.
fn refusal(id: u64, state: State, transition: &Transition) -> String {
    let is = match state {
        State::Done | State::Failed | State::Cancelled => format!("job {id} has ended ({})", state.as_str()),
        state => format!("job {id} is {}", state.as_str()),
    };
    match transition {
        Transition::Cancel => format!("{is}: there is nothing to cancel"),
        Transition::Prioritise { .. } => {
            format!("{is}: only a pending or interrupted job's priority can change")
        }
        Transition::Restart => format!("{is}: only a done, failed or cancelled job can be restarted"),
        other => format!("{is}: cannot apply {other:?}"),
    }
}

/// When the job first started and when it ended (RFC 3339), from its history: across
/// restarts, as its tries are.
pub fn started_finished(job: &Job) -> (Option<&str>, Option<&str>) {
    let started = job.history.iter().find(|h| h.state == State::Running).map(|h| h.at.as_str());
    let finished = job.history.last().filter(|h| h.state.is_final()).map(|h| h.at.as_str());
    (started, finished)
}

/// How long the job has run, in seconds: every try summed (each from its start to the
/// next change of state, or to `now` while it runs), without the waits between them.
/// None before its first start.
pub fn running_secs(job: &Job, now: chrono::DateTime<chrono::Utc>) -> Option<f64> {
    let parse = |at: &str| chrono::DateTime::parse_from_rfc3339(at).ok().map(|t| t.with_timezone(&chrono::Utc));
    let mut total = None;
    let mut since = None;
    for entry in &job.history {
        match (entry.state, since) {
            (State::Running, None) => since = Some(parse(&entry.at)),
            (State::Running, Some(_)) => {}
            (_, Some(start)) => {
                if let (Some(start), Some(end)) = (start, parse(&entry.at)) {
                    *total.get_or_insert(0.0) += (end - start).num_milliseconds() as f64 / 1000.0;
                }
                since = None;
            }
            (_, None) => {}
        }
    }
    if let Some(Some(start)) = since.filter(|_| job.state == State::Running) {
        *total.get_or_insert(0.0) += (now - start).num_milliseconds() as f64 / 1000.0;
    }
    total.map(|s: f64| s.max(0.0))
}

/// Which final jobs `clean --keep N` removes: all but the `keep` newest (by id) of the
/// done, failed and cancelled ones. Pending, running and interrupted jobs stay.
pub(crate) fn to_clean(jobs: &[Job], keep: usize) -> Vec<u64> {
    let mut ended: Vec<u64> = jobs.iter().filter(|j| j.state.is_final()).map(|j| j.id).collect();
    ended.sort_unstable();
    let remove = ended.len().saturating_sub(keep);
    ended.truncate(remove);
    ended
}

/// Now, as every stored time is written: RFC 3339 in UTC, to the millisecond.
pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The queue of one bench root.
#[derive(Clone, Debug)]
pub struct Queue {
    pub dir: PathBuf,
}

/// The exclusive queue lock; released on drop.
pub struct QueueLock(#[allow(dead_code)] nix::fcntl::Flock<File>);

impl Queue {
    /// The queue of `root`, its folders created user-only.
    pub fn open(root: &Root) -> anyhow::Result<Queue> {
        let queue = Queue { dir: root.path.join(".pruefstand") };
        for dir in [queue.dir.clone(), queue.jobs_dir(), queue.dir.join("tmp")] {
            private_dir(&dir)?;
        }
        Ok(queue)
    }

    pub(crate) fn jobs_dir(&self) -> PathBuf {
        self.dir.join("jobs")
    }

    pub fn job_dir(&self, id: u64) -> PathBuf {
        self.jobs_dir().join(id.to_string())
    }

    pub fn daemon_state_file(&self) -> PathBuf {
        self.dir.join("daemon.json")
    }

    pub fn daemon_lock_file(&self) -> PathBuf {
        self.dir.join("daemon.lock")
    }

    /// The job's own log, written by the daemon while it runs the job.
    pub fn log_file(&self, id: u64) -> PathBuf {
        self.job_dir(id).join("log")
    }

    fn pause_file(&self) -> PathBuf {
        self.dir.join("paused")
    }

    /// Whether the queue is paused: the daemon starts no job until `resume`.
    pub fn is_paused(&self) -> bool {
        self.pause_file().exists()
    }

    /// Pauses or resumes the queue. The marker is a file, so a paused daemon stays
    /// paused across restarts; the daemon learns of the change through `jobs/.changed`.
    pub fn set_paused(&self, paused: bool) -> anyhow::Result<()> {
        let path = self.pause_file();
        if paused {
            write_private(&path, now().as_bytes())?;
        } else if let Err(err) = std::fs::remove_file(&path)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            return Err(err).with_context(|| format!("removing {}", path.display()));
        }
        self.touch();
        Ok(())
    }

    /// Removes the folders of ended jobs (`to_clean`) under the queue lock, but those
    /// `spare` keeps (named by the caller: a notification still owed); their run
    /// directories under `reports/` stay. Returns the ids removed.
    pub fn clean(&self, keep: usize, mut spare: impl FnMut(&Job) -> bool) -> anyhow::Result<Vec<u64>> {
        let _lock = self.lock()?;
        let jobs = self.list()?;
        let ended: Vec<Job> = jobs.into_iter().filter(|job| !spare(job)).collect();
        let ids = to_clean(&ended, keep);
        for id in &ids {
            let dir = self.job_dir(*id);
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        sync_dir(&self.jobs_dir())?;
        self.touch();
        Ok(ids)
    }

    pub fn lock(&self) -> anyhow::Result<QueueLock> {
        crate::blocking::assert_may_block("Queue::lock (a flock)");
        let file = open_private(&self.dir.join("queue.lock"))?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .context("locking the queue")?;
        Ok(QueueLock(lock))
    }

    /// Reads and checks what `start` names: the spec (and its references), the plan,
    /// the plan's found families, and the files the specs name (each pinned now). A bad
    /// spec or plan is an error naming file:line:col; nothing is queued yet.
    pub fn prepare(&self, root: &Root, version_arg: &str, plan_arg: &str) -> anyhow::Result<Prepared> {
        let version = Version::load(&root.versions(), version_arg)?;
        let (plan_path, profile, plan_text) = Profile::load_named(&root.path, plan_arg)?;
        let found = crate::plan::read_found(&plan_path, &profile, &plan_text)?;
        let spec_text =
            std::fs::read_to_string(&version.path).with_context(|| format!("reading {}", version.path.display()))?;
        let mut origins = BTreeMap::new();
        let mut pinned = Vec::new();
        for each in std::iter::once(Ok(version.clone())).chain(reference_chain(&version)) {
            let each = each?;
            let folder = std::path::absolute(&each.files_dir)
                .with_context(|| format!("the folder of {}", each.path.display()))?;
            pinned.extend(pins(&each, &folder)?);
            origins.insert(each.name.clone(), folder);
        }
        Ok(Prepared { version, plan_path, profile, plan_text, spec_text, found, origins, pinned })
    }

    /// Snapshots a prepared job and queues it; returns it. `link`: its place in a chain.
    pub fn enqueue(&self, prepared: Prepared, priority: i32, link: Option<ChainLink>) -> anyhow::Result<Job> {
        self.enqueue_job(prepared, priority, None, link)
    }

    /// Queues a training job: `order` is what to train (opaque here), and `inputs` the
    /// files it reads (exports and their manifests), pinned now like a spec's files. A
    /// chained training reads rows its chain has yet to make: those are not pinned.
    pub fn enqueue_training(
        &self,
        mut prepared: Prepared,
        priority: i32,
        order: serde_json::Value,
        inputs: &[PathBuf],
        link: Option<ChainLink>,
    ) -> anyhow::Result<Job> {
        for path in inputs {
            let path = std::path::absolute(path).with_context(|| format!("the export {}", path.display()))?;
            prepared.pinned.push(Pinned::take(path.clone(), format!("the training's input {}", path.display()))?);
        }
        self.enqueue_job(prepared, priority, Some(order), link)
    }

    fn enqueue_job(
        &self,
        prepared: Prepared,
        priority: i32,
        training: Option<serde_json::Value>,
        link: Option<ChainLink>,
    ) -> anyhow::Result<Job> {
        let (night, after) = link.map_or((None, None), |l| (Some(l.night), l.after));
        let Prepared { version, plan_path, profile, plan_text, spec_text, found, origins, pinned } = prepared;
        // The plan's own name (checked when it was read), not its file's: the name becomes
        // a folder under reports/ and text in chat hooks.
        let plan_name = profile.name.clone();

        let _lock = self.lock()?;
        let id = self.next_id()?;
        let staging = tempfile::Builder::new()
            .prefix(&format!("{id}."))
            .tempdir_in(self.dir.join("tmp"))
            .context("staging a job")?;
        private_dir(&staging.path().join("snapshot"))?;
        let spec_rel = PathBuf::from("snapshot/version").join(format!("{}.toml", version.name));
        let plan_rel = PathBuf::from("snapshot/plan").join(format!("{plan_name}.toml"));
        let references = snapshot_references(&version, &staging.path().join(REFERENCES_DIR))?;
        let spec_text = match &version.spec.reference {
            Some(named) => named_reference(&spec_text, named, &version.path)?,
            None => spec_text,
        };
        write_private(&staging.path().join(&spec_rel), spec_text.as_bytes())?;
        let plan_sha256 = util::sha256_hex(plan_text.as_bytes());
        let (snapshot_plan, copies) = copy_found(&plan_text, &profile, &found, &plan_path, &plan_rel)?;
        for (copy, bytes) in copies.iter().zip(&found) {
            write_private(&staging.path().join(&copy.copy), &bytes.bytes)?;
        }
        write_private(&staging.path().join(&plan_rel), snapshot_plan.as_bytes())?;
        let job = Job {
            id,
            version: version.name.clone(),
            plan: plan_name,
            priority,
            enqueued_at: now(),
            state: State::Pending,
            attempt: 0,
            starts: 0,
            run_dir: None,
            verdict: None,
            summary: None,
            figures: None,
            error: None,
            cancel_requested: false,
            snapshot: Snapshot {
                spec: spec_rel,
                spec_source: absolute(&version.path),
                spec_sha256: util::sha256_hex(spec_text.as_bytes()),
                spec_hash: version.hash.clone(),
                plan: plan_rel,
                plan_source: absolute(&plan_path),
                plan_sha256,
                references: references.then(|| PathBuf::from(REFERENCES_DIR)),
                origins,
                pinned,
                found: copies,
            },
            history: vec![HistoryEntry { at: now(), state: State::Pending, note: "queued".into() }],
            training_dir: None,
            training,
            after,
            night,
        };
        write_private(&staging.path().join("job.json"), &json_bytes(&job)?)?;
        let staged = staging.keep();
        sync_dir(&staged)?;
        let target = self.job_dir(id);
        std::fs::rename(&staged, &target).with_context(|| format!("queueing {}", target.display()))?;
        sync_dir(&self.jobs_dir())?;
        Ok(job)
    }

    /// Ids are handed out under the queue lock, so they also give the FIFO order.
    fn next_id(&self) -> anyhow::Result<u64> {
        let path = self.dir.join("next-id");
        let last = match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse::<u64>().unwrap_or_else(|_| {
                tracing::warn!("{}: not a number ({text:?}); continuing after the highest job folder", path.display());
                0
            }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => 0,
            Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
        };
        // Never reuse an id whose folder exists (next-id lost, damaged or restored from a
        // backup) — read from the folder names, so a damaged job.json cannot block this.
        let highest = std::fs::read_dir(self.jobs_dir())
            .with_context(|| format!("listing {}", self.jobs_dir().display()))?
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let id = (last + 1).max(highest + 1);
        write_private(&path, id.to_string().as_bytes())?;
        Ok(id)
    }

    pub fn load(&self, id: u64) -> anyhow::Result<Job> {
        let path = self.job_dir(id).join("job.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                bail!("there is no job {id} (`pruefstand queue` lists the jobs)")
            }
            Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
        };
        let job: Job = serde_json::from_str(&text).with_context(|| format!("{}: not a job", path.display()))?;
        // The folder names the job: a file claiming another id would have every
        // command (and `clean`'s delete) act on the wrong job.
        anyhow::ensure!(job.id == id, "{}: says it is job {}, but lies in job {id}'s folder", path.display(), job.id);
        Ok(job)
    }

    /// All jobs, by id. A damaged job file is reported and skipped, never deleted.
    pub fn list(&self) -> anyhow::Result<Vec<Job>> {
        let mut jobs = Vec::new();
        let entries =
            std::fs::read_dir(self.jobs_dir()).with_context(|| format!("reading {}", self.jobs_dir().display()))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.parse::<u64>().ok().filter(|id| id.to_string() == n)) else {
                continue;
            };
            match self.load(id) {
                Ok(job) => jobs.push(job),
                Err(err) => warn_once(&self.job_dir(id).join("job.json"), &format!("skipping job {id}: {err:#}")),
            }
        }
        jobs.sort_by_key(|j| j.id);
        Ok(jobs)
    }

    /// The job to run next: highest priority, then the oldest — of those not waiting
    /// for an earlier link of their chain.
    pub fn next_pending(&self) -> anyhow::Result<Option<Job>> {
        let jobs = self.list()?;
        let ready = |j: &&Job| j.after.is_none_or(|after| matches!(link(&jobs, after), Link::Ready));
        Ok(jobs
            .iter()
            .filter(|j| j.state == State::Pending)
            .filter(ready)
            .min_by_key(|j| (std::cmp::Reverse(j.priority), j.id))
            .cloned())
    }

    /// Pending jobs whose chain has stopped: the job they wait for ended without a
    /// valid verdict (failed, cancelled, invalid) or is gone; each with why.
    pub fn stopped_chains(&self) -> anyhow::Result<Vec<(Job, String)>> {
        let jobs = self.list()?;
        Ok(jobs
            .iter()
            .filter(|j| j.state == State::Pending)
            .filter_map(|j| match link(&jobs, j.after?) {
                Link::Stopped(why) => Some((j.clone(), format!("chain stopped: {why}"))),
                Link::Ready | Link::Waiting => None,
            })
            .collect())
    }

    /// Applies a transition under the queue lock to the job as stored now, and
    /// stores the result; returns it.
    pub fn transition(&self, id: u64, transition: Transition) -> anyhow::Result<Job> {
        let _lock = self.lock()?;
        let mut job = self.load(id)?;
        job.apply(transition)?;
        self.store(&job)?;
        Ok(job)
    }

    /// Records a training job's training folder (`Job::training_dir`), under the queue
    /// lock, as its training starts; returns the job.
    pub fn record_training_dir(&self, id: u64, dir: &Path) -> anyhow::Result<Job> {
        let _lock = self.lock()?;
        let mut job = self.load(id)?;
        job.training_dir = Some(dir.to_path_buf());
        self.store(&job)?;
        Ok(job)
    }

    /// Writes `job` (the daemon's last copy, [`Transition::Damaged`] applied) over a
    /// job file that no longer loads, under the queue lock; the damaged file is kept
    /// beside it as `job.json.damaged`.
    pub fn replace_damaged(&self, job: &Job) -> anyhow::Result<()> {
        let _lock = self.lock()?;
        let path = self.job_dir(job.id).join("job.json");
        anyhow::ensure!(self.load(job.id).is_err(), "{}: loads; not replacing it", path.display());
        let kept = path.with_file_name("job.json.damaged");
        if let Err(err) = std::fs::rename(&path, &kept)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            return Err(err).with_context(|| format!("keeping {} as {}", path.display(), kept.display()));
        }
        self.store(job)
    }

    fn store(&self, job: &Job) -> anyhow::Result<()> {
        write_private(&self.job_dir(job.id).join("job.json"), &json_bytes(job)?)?;
        self.touch();
        Ok(())
    }

    /// Bumps `jobs/.changed`: a watch of the queue (`crate::watch`: the daemon, `serve`,
    /// `start --wait`, `wait`, `cancel`) watches `jobs/`, not every job folder, and this
    /// is how a change inside one reaches it. Its content is irrelevant, so it is neither
    /// atomic nor synced.
    fn touch(&self) {
        use std::io::Write;
        if let Ok(mut file) = open_private(&self.jobs_dir().join(".changed")) {
            let _ = file.write_all(now().as_bytes());
        }
    }

    /// Resolves `<job>` as typed: an id.
    pub fn find(&self, arg: &str) -> anyhow::Result<Job> {
        let id: u64 = arg
            .trim()
            .parse()
            .with_context(|| format!("{} is not a job id (see `pruefstand queue`)", crate::input::quoted(arg)))?;
        self.load(id)
    }

    /// The job's snapshot as a loaded version (references resolve against the root's
    /// versions/, as for `run`) and the snapshot profile's path. Every file the job
    /// pinned is checked first: one changed since `start` is an error naming it.
    pub fn materialise(&self, root: &Root, job: &Job) -> anyhow::Result<(Version, PathBuf)> {
        for pin in &job.snapshot.pinned {
            pin.check().with_context(|| format!("job {}", job.id))?;
        }
        let dir = self.job_dir(job.id);
        let spec = dir.join(&job.snapshot.spec);
        let versions = job.snapshot.references.as_ref().map_or_else(|| root.versions(), |refs| dir.join(refs));
        let origins = Origins::new(job.snapshot.origins.clone());
        let version = Version::load_in(&versions, &spec.to_string_lossy(), origins)
            .with_context(|| format!("job {}: its spec snapshot", job.id))?;
        Ok((version, dir.join(&job.snapshot.plan)))
    }
}

/// A warning about a damaged file, once for each state of the file (its size and time
/// of change): `queue`, `serve` and the daemon list the jobs often, and one damaged file
/// must not fill their logs.
fn warn_once(path: &Path, text: &str) {
    static WARNED: std::sync::Mutex<std::collections::BTreeMap<PathBuf, (Option<std::time::SystemTime>, u64)>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    let meta = std::fs::metadata(path).ok();
    let state = (meta.as_ref().and_then(|m| m.modified().ok()), meta.as_ref().map_or(0, |m| m.len()));
    if util::lock(&WARNED).insert(path.to_path_buf(), state) != Some(state) {
        tracing::warn!("{text}");
    }
}

fn json_bytes<T: Serialize>(value: &T) -> anyhow::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Where a job's references are snapshotted, in its folder.
const REFERENCES_DIR: &str = "snapshot/reference";

/// The folder beside a job's plan copy where its found families are copied.
const FOUND_DIR: &str = "found";

/// `version`'s reference, that one's, and so on down the chain, each loaded as `run`
/// would load it; a chain that comes back to a version already seen ends there.
fn reference_chain(version: &Version) -> impl Iterator<Item = anyhow::Result<Version>> {
    let mut seen = vec![version.name.clone()];
    let mut current = Some(version.clone());
    std::iter::from_fn(move || {
        let loaded = current.take()?.load_reference()?;
        match loaded {
            Ok(reference) if seen.contains(&reference.name) => None,
            Ok(reference) => {
                seen.push(reference.name.clone());
                current = Some(reference.clone());
                Some(Ok(reference))
            }
            Err(err) => Some(Err(err)),
        }
    })
}

/// The files `version` names outside its spec, each pinned as the run will read it:
/// `folder` (the spec's own, absolute) joined with the path the spec gives.
fn pins(version: &Version, folder: &Path) -> anyhow::Result<Vec<Pinned>> {
    let name = &version.name;
    let mut pins = Vec::new();
    for export in version.spec.adapter.iter().flat_map(|a| &a.trained_on_exports) {
        let path = folder.join(export.get_ref());
        let manifest = PathBuf::from(format!("{}{EXPORT_MANIFEST_SUFFIX}", path.display()));
        pins.push(Pinned::take(path.clone(), format!("adapter.trained_on_exports of version {name}"))?);
        pins.push(Pinned::take(manifest, format!("the manifest of {name}'s export {}", path.display()))?);
    }
    for manifest in version.spec.adapter.iter().flat_map(|a| &a.trained_online) {
        let path = folder.join(manifest.get_ref());
        if let Some(dataset) = crate::spec::dataset_of(&path) {
            pins.push(Pinned::take(
                dataset.clone(),
                format!("the dataset of {name}'s environment {}", path.display()),
            )?);
        }
        pins.push(Pinned::take(path, format!("adapter.trained_online of version {name}"))?);
    }
    for kind in ServedFileKind::ALL {
        if let Some(file) = version.spec.model.served_file(kind) {
            let path = folder.join(file.get_ref());
            pins.push(Pinned::take(path, format!("model.{} of version {name}", kind.field()))?);
        }
    }
    Ok(pins)
}

/// An export's manifest beside it, as `pruefstand export` names it.
const EXPORT_MANIFEST_SUFFIX: &str = ".manifest.json";

/// The plan text as the snapshot holds it — each `[[found]]` file named as its copy,
/// `found/<n>.json` beside the plan's copy — and the copies (relative to the job folder).
fn copy_found(
    text: &str,
    profile: &Profile,
    found: &[FoundFile],
    plan_path: &Path,
    plan_rel: &Path,
) -> anyhow::Result<(String, Vec<Copied>)> {
    let mut text = text.to_string();
    let mut copies = Vec::new();
    // From the last to the first, so the spans before each stay where they were.
    for (n, (section, file)) in profile.found.iter().zip(found).enumerate().rev() {
        let name = format!("{FOUND_DIR}/{}.json", n + 1);
        let span = section.file.span();
        anyhow::ensure!(text.get(span.clone()).is_some(), "{}: the found file's place in it", plan_path.display());
        text = format!("{}{name:?}{}", &text[..span.start], &text[span.end..]);
        let copy = plan_rel.parent().unwrap_or(Path::new("")).join(&name);
        copies.push(Copied { source: absolute(&file.path), copy, sha256: util::sha256_hex(&file.bytes) });
    }
    copies.reverse();
    Ok((text, copies))
}

/// Copies `version`'s reference — and that one's reference, down the chain — into
/// `dir` as `<name>.toml`, each as it is now (a reference given as a path resolved now,
/// against this working directory), each one's own reference named by name. Whether
/// there was one.
fn snapshot_references(version: &Version, dir: &Path) -> anyhow::Result<bool> {
    let mut current = version.clone();
    let mut copied: Vec<String> = Vec::new();
    while let Some(loaded) = current.load_reference() {
        let reference = loaded.with_context(|| format!("the reference of {}", current.path.display()))?;
        if copied.contains(&reference.name) || reference.name == version.name {
            break;
        }
        let text = crate::input::read_config(&reference.path)
            .with_context(|| format!("reading the reference {}", reference.path.display()))?;
        let text = match &reference.spec.reference {
            Some(named) => named_reference(&text, named, &reference.path)?,
            None => text,
        };
        write_private(&dir.join(format!("{}.toml", reference.name)), text.as_bytes())?;
        copied.push(reference.name.clone());
        current = reference;
    }
    Ok(!copied.is_empty())
}

/// The spec text with its `reference` given by name (the file's stem) where it was a
/// path: in the snapshot every reference lies beside the others, found by name.
fn named_reference(text: &str, reference: &toml::Spanned<String>, spec: &Path) -> anyhow::Result<String> {
    if !crate::input::Named::is_path(reference.get_ref()) {
        return Ok(text.to_string());
    }
    let path = Path::new(reference.get_ref());
    let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let span = reference.span();
    anyhow::ensure!(text.get(span.clone()).is_some(), "{}: the reference's place in the file", spec.display());
    Ok(format!("{}{name:?}{}", &text[..span.start], &text[span.end..]))
}

fn absolute(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// A job's place in a chain (`pruefstand start-night`): the chain's name and the job
/// it waits for (none for the first).
pub struct ChainLink {
    pub night: String,
    pub after: Option<u64>,
}

/// Where a chained job stands on the job it waits for.
enum Link {
    Ready,
    Waiting,
    Stopped(String),
}

fn link(jobs: &[Job], after: u64) -> Link {
    let Some(job) = jobs.iter().find(|j| j.id == after) else {
        return Link::Stopped(format!("job {after}, which it waits for, is gone"));
    };
    match (job.state, job.verdict) {
        (State::Done, Some(Verdict::Invalid)) => {
            Link::Stopped(format!("job {after} is invalid: {}", job.summary.as_deref().unwrap_or("no summary")))
        }
        (State::Done, _) => Link::Ready,
        (State::Failed, _) => {
            Link::Stopped(format!("job {after} failed: {}", job.error.as_deref().unwrap_or("no error recorded")))
        }
        (State::Cancelled, _) => Link::Stopped(format!("job {after} was cancelled")),
        (State::Pending | State::Running | State::Interrupted, _) => Link::Waiting,
    }
}

/// Creates `dir` (and parents) and makes it 0700.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("restricting {}", dir.display()))
}

fn open_private(path: &Path) -> anyhow::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .read(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

/// `util::write_atomic`, made 0600 before it becomes visible.
pub fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        private_dir(parent)?;
    }
    util::write_atomic(path, contents)?;
    // The temporary file is created 0600 by tempfile, so the renamed file is too; this
    // only repairs files from older writers.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("syncing {}", dir.display()))
}

/// Opens the daemon lock without blocking: `Some(lock)` when no daemon holds it.
pub fn try_daemon_lock(queue: &Queue) -> anyhow::Result<Option<nix::fcntl::Flock<File>>> {
    let file = open_private(&queue.daemon_lock_file())?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, err)) => Err(err).context("locking the daemon lock"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job {
            id: 1,
            version: "v".into(),
            plan: "p".into(),
            priority: 0,
            enqueued_at: now(),
            state: State::Pending,
            attempt: 0,
            starts: 0,
            run_dir: None,
            verdict: None,
            summary: None,
            figures: None,
            error: None,
            cancel_requested: false,
            snapshot: Snapshot {
                spec: "s".into(),
                spec_source: "s".into(),
                spec_sha256: String::new(),
                spec_hash: String::new(),
                plan: "p".into(),
                plan_source: "p".into(),
                plan_sha256: String::new(),
                references: None,
                origins: BTreeMap::new(),
                pinned: Vec::new(),
                found: Vec::new(),
            },
            history: Vec::new(),
            training_dir: None,
            training: None,
            after: None,
            night: None,
        }
    }

    #[test]
    fn a_job_resumes_through_interrupted_and_finishes() {
        let mut j = job();
        j.apply(Transition::Start { run_dir: "r".into() }).unwrap();
        j.apply(Transition::Interrupt { reason: "SIGTERM".into(), crashed: false }).unwrap();
        assert!(j.apply(Transition::Start { run_dir: "r".into() }).is_err(), "interrupted must be requeued first");
        j.apply(Transition::Requeue).unwrap();
        j.apply(Transition::Start { run_dir: "r".into() }).unwrap();
        j.apply(Transition::Finish {
            verdict: Verdict::Approved,
            summary: String::new(),
            figures: Headline::default(),
        })
        .unwrap();
        assert_eq!((j.state, j.attempt, j.exit_code()), (State::Done, 1, 0));
        assert!(j.apply(Transition::Cancel).is_err(), "a finished job stays finished");
    }

    #[test]
    fn cancel_of_a_running_job_is_a_request() {
        let mut j = job();
        j.apply(Transition::Start { run_dir: "r".into() }).unwrap();
        j.apply(Transition::Cancel).unwrap();
        assert_eq!((j.state, j.cancel_requested), (State::Running, true));
        j.apply(Transition::Stopped).unwrap();
        assert_eq!(j.state, State::Cancelled);
    }

    #[test]
    fn a_damaged_next_id_continues_after_the_highest_job_folder() {
        let dir = tempfile::tempdir().unwrap();
        let queue = Queue { dir: dir.path().to_path_buf() };
        for id in ["3", "7"] {
            std::fs::create_dir_all(queue.jobs_dir().join(id)).unwrap();
        }
        std::fs::write(dir.path().join("next-id"), "garbage\u{0}").unwrap();
        assert_eq!(queue.next_id().unwrap(), 8);
        assert_eq!(queue.next_id().unwrap(), 9);
        std::fs::write(dir.path().join("next-id"), "41").unwrap();
        assert_eq!(queue.next_id().unwrap(), 42);
    }

    #[test]
    fn priority_changes_while_waiting_only() {
        let mut j = job();
        j.apply(Transition::Prioritise { priority: 5 }).unwrap();
        assert_eq!((j.state, j.priority), (State::Pending, 5));
        j.apply(Transition::Start { run_dir: "r".into() }).unwrap();
        let err = j.apply(Transition::Prioritise { priority: 1 }).unwrap_err().to_string();
        assert_eq!(j.priority, 5);
        assert!(err.contains("job 1 is running") && err.contains("pending"), "{err}");
    }

    #[test]
    fn a_restarted_job_is_pending_again_with_its_run_dir_and_no_result() {
        let mut j = job();
        assert!(j.apply(Transition::Restart).is_err(), "a pending job is not restarted");
        j.apply(Transition::Start { run_dir: "r".into() }).unwrap();
        j.apply(Transition::Fail { error: "boom".into() }).unwrap();
        let (first_start, failed) = started_finished(&j);
        let first_start = first_start.map(str::to_string);
        assert!(first_start.is_some() && failed.is_some());
        j.apply(Transition::Restart).unwrap();
        assert_eq!((j.state, j.attempt, j.starts, j.error.as_deref()), (State::Pending, 0, 1, None));
        assert_eq!(j.run_dir.as_deref(), Some(Path::new("r")), "it resumes into its run directory");
        assert_eq!(started_finished(&j), (first_start.as_deref(), None), "it started before, and has not ended");
        j.apply(Transition::Start { run_dir: "r".into() }).unwrap();
        assert_eq!((j.attempt, j.starts), (1, 2), "the crash count begins anew, the tries go on");
        let headline = Headline { asr: Some(0.1), utility: Some(0.9), ..Headline::default() };
        let figures = headline.clone();
        j.apply(Transition::Finish { verdict: Verdict::Rejected, summary: "s".into(), figures }).unwrap();
        assert_eq!(j.figures, Some(headline));
        j.apply(Transition::Restart).unwrap();
        assert_eq!((j.verdict, j.figures), (None, None));
    }

    #[test]
    fn running_time_sums_every_try_without_the_waits_between() {
        let at = |state, at: &str| HistoryEntry { at: at.into(), state, note: String::new() };
        let mut j = job();
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T13:00:00Z").unwrap().to_utc();
        assert_eq!(running_secs(&j, now), None, "never started");
        j.history = vec![
            at(State::Pending, "2026-01-01T10:00:00Z"),
            at(State::Running, "2026-01-01T10:01:00Z"),
            at(State::Interrupted, "2026-01-01T10:02:00Z"),
            at(State::Pending, "2026-01-01T11:00:00Z"),
            at(State::Running, "2026-01-01T11:00:00Z"),
            at(State::Failed, "2026-01-01T11:00:30Z"),
            at(State::Pending, "2026-01-01T12:00:00Z"),
            at(State::Running, "2026-01-01T12:00:00.500Z"),
            at(State::Done, "2026-01-01T12:00:10.500Z"),
        ];
        j.state = State::Done;
        assert_eq!(running_secs(&j, now), Some(100.0), "60 s + 30 s + 10 s, after a restart too");
        j.history.truncate(8);
        j.state = State::Running;
        assert_eq!(running_secs(&j, now), Some(90.0 + 3599.5), "a running try counts up to now");
    }

    #[test]
    fn a_job_from_before_starts_were_counted_counts_on_from_its_attempts() {
        let mut j: Job = serde_json::from_value({
            let mut value = serde_json::to_value(job()).unwrap();
            value.as_object_mut().unwrap().remove("starts");
            value["attempt"] = 1.into();
            value
        })
        .unwrap();
        assert_eq!(j.starts, 0);
        j.apply(Transition::Start { run_dir: "r".into() }).unwrap();
        assert_eq!((j.attempt, j.starts), (2, 2));
    }

    #[test]
    fn refusals_say_what_the_job_is_in_plain_words() {
        let mut j = job();
        j.apply(Transition::Cancel).unwrap();
        let err = j.apply(Transition::Cancel).unwrap_err().to_string();
        assert_eq!(err, "job 1 has ended (cancelled): there is nothing to cancel");
    }

    #[test]
    fn clean_keeps_the_newest_ended_jobs_and_every_waiting_one() {
        let states = [State::Done, State::Pending, State::Failed, State::Cancelled, State::Running, State::Done];
        let jobs: Vec<Job> =
            states.iter().enumerate().map(|(i, state)| Job { id: i as u64 + 1, state: *state, ..job() }).collect();
        assert_eq!(to_clean(&jobs, 0), vec![1, 3, 4, 6]);
        assert_eq!(to_clean(&jobs, 2), vec![1, 3]);
        assert_eq!(to_clean(&jobs, 10), Vec::<u64>::new());
    }

    #[test]
    fn the_plan_copy_names_each_found_family_by_its_copy_and_changes_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let family = |name: &str| format!(r#"{{"name": "{name}", "templates": ["do {{goal}}"], "found_by": "t"}}"#);
        std::fs::create_dir(dir.path().join("f")).unwrap();
        std::fs::write(dir.path().join("f/a b.json"), family("a")).unwrap();
        std::fs::write(dir.path().join("c.json"), family("c")).unwrap();
        let sha = |name: &str| util::sha256_hex(&std::fs::read(dir.path().join(name)).unwrap());
        let text = format!(
            "name = \"p\"\nbenchmark_version = \"v1.2.2\"\nattacks = []\nsuites = []\n\
             [[found]]\nfile = \"f/a b.json\" # beside the plan\nsha256 = \"{}\"\n\
             [[found]]\nfile = 'c.json'\nsha256 = \"{}\"\nheld_out = true\n",
            sha("f/a b.json"),
            sha("c.json")
        );
        let plan = dir.path().join("p.toml");
        std::fs::write(&plan, &text).unwrap();
        let (profile, text) = Profile::load(&plan).unwrap();
        let found = crate::plan::read_found(&plan, &profile, &text).unwrap();
        let (copy, copies) = copy_found(&text, &profile, &found, &plan, Path::new("snapshot/plan/p.toml")).unwrap();
        let expected = text.replace("\"f/a b.json\"", "\"found/1.json\"").replace("'c.json'", "\"found/2.json\"");
        assert_eq!(copy, expected);
        let copies: Vec<(&Path, &Path)> = copies.iter().map(|c| (c.source.as_path(), c.copy.as_path())).collect();
        let source = |name: &str| dir.path().canonicalize().unwrap().join(name);
        assert_eq!(
            copies,
            [
                (source("f/a b.json").as_path(), Path::new("snapshot/plan/found/1.json")),
                (source("c.json").as_path(), Path::new("snapshot/plan/found/2.json"))
            ]
        );
    }

    #[test]
    fn attempts_are_limited() {
        let mut j = job();
        for _ in 0..MAX_ATTEMPTS {
            j.apply(Transition::Start { run_dir: "r".into() }).unwrap();
            j.apply(Transition::Interrupt { reason: "crash".into(), crashed: true }).unwrap();
            j.apply(Transition::Requeue).unwrap();
        }
        assert!(j.apply(Transition::Start { run_dir: "r".into() }).is_err());
    }
}
