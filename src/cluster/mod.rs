//! A queued job as a Slurm job array (`[cluster] kind = "slurm"`): the daemon cuts the
//! plan into shards (`shard::slice`), submits one `sbatch --array=0-(N-1)` whose tasks
//! each run `pruefstand shard <job> <i>/<N>` on their node, follows the tasks with
//! `squeue` and the exit records the shards leave, requeues a dead shard once, and
//! merges the shards into the job's run directory, which is then judged as any run.
//!
//! Everything lives in the job's run directory, on storage every node sees:
//!
//! ```text
//! <run dir>/cluster.json          the array: shard count, each submission's array id
//! <run dir>/shards/shard.sbatch   the batch script (fixed text, quoted paths)
//! <run dir>/shards/slurm-A_i.out  each task's output
//! <run dir>/shards/<i>/           shard i's run directory; exit.json when it ended
//! ```
//!
//! `cluster.json` is written before `sbatch` (with the comment the array will carry)
//! and again with the array id before the daemon follows it, so a restarted daemon
//! picks the array up — by its id, or by its comment when it died in between —
//! instead of submitting a second one. Not here: the shard's
//! own run (`shard`), the Slurm tools (`slurm`), merging (`merge`).

mod merge;
pub(crate) mod shard;
pub(crate) mod slurm;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use futures_util::future::BoxFuture;

use crate::gym::{self, Executed};
use crate::run::{Executor, LocalGym, RunControl, RunRequest, Served, Session};
use crate::runtime;
use pruefstand_core::queue::Queue;
use pruefstand_core::record::{GpuExclusivity, ModelServerFacts};
use pruefstand_core::root::Root;
use pruefstand_core::util;
use pruefstand_store::{Claimed, RunDir, RunDocument, RunFile};
use slurm::{ArrayId, Slurm, TaskState};

/// How often the daemon looks at the array (a look is one `squeue` call).
const FOLLOW_INTERVAL: Duration = Duration::from_secs(2);
/// Submissions of one shard: the first and one requeue.
const MAX_SUBMISSIONS: usize = 2;

/// `<run dir>/cluster.json`: the array as submitted.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub(crate) struct ArrayState {
    pub(crate) shards: usize,
    pub(crate) submitted_at: String,
    /// The `--comment` every submission of this job carries, chosen and stored before
    /// the first `sbatch`: a daemon that died before recording the array id finds the
    /// array by it instead of submitting a second one.
    #[serde(default)]
    pub(crate) comment: String,
    /// Empty between the comment's storing and `sbatch` returning.
    pub(crate) submissions: Vec<Submission>,
    /// The last look: shards done, running, pending (what `status` shows).
    #[serde(default)]
    pub(crate) counts: ShardCounts,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct Submission {
    pub(crate) array: ArrayId,
    pub(crate) indices: Vec<usize>,
    pub(crate) at: String,
    /// Why it was submitted (first submission, or the requeue's reason).
    pub(crate) reason: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShardCounts {
    pub(crate) done: usize,
    pub(crate) running: usize,
    pub(crate) pending: usize,
}

impl ShardCounts {
    pub(crate) fn line(&self) -> String {
        format!("shards: {} done, {} running, {} pending", self.done, self.running, self.pending)
    }
}

impl ArrayState {
    /// The job's array, when it was submitted.
    pub(crate) fn load(run: &RunDir) -> anyhow::Result<Option<ArrayState>> {
        run.read()
    }

    fn store(&self, run: &RunDir) -> anyhow::Result<()> {
        run.write(self)
    }

    /// Every array id submitted for this job.
    fn arrays(&self) -> Vec<ArrayId> {
        self.submissions.iter().map(|s| s.array).collect()
    }

    /// The array that runs shard `index` now (its latest submission).
    pub(crate) fn latest(&self, index: usize) -> Option<ArrayId> {
        self.submissions.iter().rev().find(|s| s.indices.contains(&index)).map(|s| s.array)
    }

    fn submissions_of(&self, index: usize) -> usize {
        self.submissions.iter().filter(|s| s.indices.contains(&index)).count()
    }
}

/// `<run dir>/shards/<i>/exit.json`: how a shard's run ended, written by the shard.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub(crate) struct ExitRecord {
    pub(crate) index: usize,
    /// 0: its cases ran; else `error` says why not.
    pub(crate) code: i32,
    pub(crate) node: String,
    pub(crate) slurm_job: Option<String>,
    pub(crate) started_at: String,
    pub(crate) ended_at: String,
    /// Cases recorded in the shard directory, and of those already there at its start.
    pub(crate) cases: usize,
    pub(crate) skipped: usize,
    pub(crate) image_digest: Option<String>,
    #[serde(default)]
    pub(crate) gpu: GpuExclusivity,
    pub(crate) model_server: Option<ModelServerFacts>,
    pub(crate) error: Option<String>,
}

impl ExitRecord {
    /// The shard's exit record; None before the shard wrote one. A damaged record is
    /// an error naming its file: a shard whose end cannot be read is not a shard that
    /// never ended (nor one that ran).
    pub(crate) fn load(shard: &RunDir) -> anyhow::Result<Option<ExitRecord>> {
        shard.read().with_context(|| format!("the shard's exit record {} is damaged", shard.shown(RunFile::ShardExit)))
    }

    pub(crate) fn store(&self, shard: &RunDir) -> anyhow::Result<()> {
        let dir = shard.path();
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        shard.write(self)
    }
}

impl RunDocument for ArrayState {
    const FILE: RunFile = RunFile::Cluster;
}

impl RunDocument for ExitRecord {
    const FILE: RunFile = RunFile::ShardExit;
}

/// Where one shard stands at a look.
#[derive(Debug, PartialEq)]
enum Standing {
    Done,
    Pending,
    Running,
    /// Ended without success: its exit record's error, or no record at all.
    Dead(String),
}

/// A shard's standing from its exit record and its latest task in `squeue` (read
/// before the records, so a task that ends between the two reads is seen by its record).
fn standing(exit: Option<&ExitRecord>, task: Option<TaskState>) -> Standing {
    match (exit, task) {
        (Some(exit), _) if exit.code == 0 => Standing::Done,
        (Some(exit), _) => Standing::Dead(exit.error.clone().unwrap_or_else(|| format!("exit code {}", exit.code))),
        (None, Some(TaskState::Pending)) => Standing::Pending,
        (None, Some(TaskState::Running)) => Standing::Running,
        (None, None) => Standing::Dead("ended without an exit record (killed, or its node failed)".into()),
    }
}

/// The executor a daemon job runs on: the local gym, or with `[cluster] kind =
/// "slurm"` the job's Slurm array. The daemon does not branch on it.
pub(crate) fn executor(root: &Root, job: u64) -> anyhow::Result<Box<dyn Executor>> {
    if root.config.cluster.is_slurm() {
        Ok(Box::new(SlurmArray { job, queue: Queue::open(root)?, reference: false }))
    } else {
        Ok(Box::new(LocalGym))
    }
}

/// Runs queued job `job` as a Slurm job array: submitted (or picked up after a
/// restart), followed, merged into the claimed run directory. The reference, when R4
/// needs one made, runs the same way first (`reference`: its tasks run the job's
/// reference version into the reference's run directory).
struct SlurmArray {
    pub(crate) job: u64,
    pub(crate) queue: Queue,
    pub(crate) reference: bool,
}

impl Executor for SlurmArray {
    fn check(&self, request: &RunRequest) -> anyhow::Result<()> {
        // The adaptive search keeps what lands across all of a plan's pairs: it is one
        // process against one server, not something to cut into shards.
        if request.plan().adaptive.is_some() {
            bail!(
                "plan {:?} has an [adaptive] section: the adaptive attacker runs on one host; run this version with \
                 `pruefstand run` (or set [cluster] kind = \"local\")",
                request.plan().name
            );
        }
        Ok(())
    }

    /// The model servers run on the shards' nodes; each shard checks its own.
    fn runs_here(&self) -> bool {
        false
    }

    fn for_reference(&self) -> Box<dyn Executor + '_> {
        Box::new(SlurmArray { job: self.job, queue: self.queue.clone(), reference: true })
    }

    fn execute<'a>(
        &'a self,
        session: &'a Session,
        request: &'a RunRequest,
        claimed: &'a Claimed,
    ) -> BoxFuture<'a, anyhow::Result<(Executed, Served)>> {
        Box::pin(self.run(session, request, claimed))
    }
}

impl SlurmArray {
    /// Submits the array (or picks up an earlier start's), follows it, and merges the
    /// shards. The Slurm tools and the run directory's writes block: each step runs on
    /// the blocking pool.
    async fn run(
        &self,
        session: &Session,
        request: &RunRequest,
        claimed: &Claimed,
    ) -> anyhow::Result<(Executed, Served)> {
        let follow = Follow {
            slurm: Slurm::default(),
            config: session.root.config.cluster.clone(),
            dir: claimed.dir.clone(),
            job: self.job,
            queue: self.queue.clone(),
            reference: self.reference,
        };
        let (root, cases, planned) =
            (session.root.path.clone(), request.plan().cases.clone(), request.plan().cases.len());
        let state = follow.off_runtime(move |follow| follow.array(&root, &cases)).await?;
        let (state, failed) = follow.until_done(&session.control, state, planned).await?;
        let (run_dir, plan, inventory) = (claimed.dir.clone(), request.plan().clone(), request.inventory().clone());
        runtime::blocking(move || {
            let mut exits = BTreeMap::new();
            for i in 0..state.shards {
                if let Some(exit) = ExitRecord::load(&run_dir.shard(i))? {
                    exits.insert(i, exit);
                }
            }
            let served = merge::merge(&run_dir, &plan, &inventory, &state, &exits, failed)?;
            let executed = crate::run::executed_from_run_dir(&run_dir, &plan)?;
            Ok((executed, served))
        })
        .await
    }
}

/// The comment a job's arrays carry: the job and a value no other run of any bench
/// shares (its run directory and the time), so that a search by it finds only this
/// run's array.
fn array_comment(job: u64, run: &RunDir) -> String {
    let nonce = format!("{}|{}|{}", run.path().display(), chrono::Utc::now().to_rfc3339(), std::process::id());
    format!("pruefstand-{job}-{}", &util::sha256_hex(nonce.as_bytes())[..16])
}

/// Cancels every array submitted for the run in `run_dir` (`scancel`); their ids.
pub(crate) fn cancel_arrays(run: &RunDir) -> anyhow::Result<Vec<ArrayId>> {
    let Some(state) = ArrayState::load(run)? else { return Ok(Vec::new()) };
    let slurm = Slurm::default();
    for array in state.arrays() {
        slurm.cancel(array)?;
    }
    Ok(state.arrays())
}

/// Follows the array until every shard is done or one failed twice (its reason, for
/// R1); a dead shard is submitted again once. A stop ends the wait: a cancelled job's
/// arrays are cancelled, an interrupted daemon leaves them running for the next start.
#[derive(Clone)]
struct Follow {
    slurm: Slurm,
    config: pruefstand_core::settings::cluster::ClusterConfig,
    /// The job's run directory.
    dir: RunDir,
    job: u64,
    queue: Queue,
    /// The array runs the job's reference (into `dir`), not the job's version.
    reference: bool,
}

/// One look at the array.
struct Look {
    /// Cases recorded so far over every shard: the daemon's progress and ETA.
    recorded: usize,
    /// Some when the array is over: the shards that failed for good (empty: all done).
    ended: Option<Vec<String>>,
}

impl Follow {
    /// Runs `f` on a copy of the follower on the blocking pool.
    async fn off_runtime<R: Send + 'static>(&self, f: impl FnOnce(&Follow) -> R + Send + 'static) -> R {
        let follow = self.clone();
        runtime::blocking(move || f(&follow)).await
    }

    /// The array of an earlier start (`cluster.json`), or a new one submitted now and
    /// recorded before it is followed. `cluster.json` holds the array's comment before
    /// `sbatch` runs: an earlier start that died before recording the id left it, and
    /// the array is looked for by that comment before anything is submitted.
    fn array(&self, root: &Path, cases: &[pruefstand_core::case::Case]) -> anyhow::Result<ArrayState> {
        let Follow { slurm, dir, job, .. } = self;
        let mut state = match ArrayState::load(dir)? {
            Some(state) if !state.submissions.is_empty() => {
                tracing::info!("picking up array {:?} ({} shards) of an earlier start", state.arrays(), state.shards);
                return Ok(state);
            }
            Some(state) => state,
            None => {
                let shards = shard::usable_shards(cases, self.config.shards);
                let comment = array_comment(*job, dir);
                let state = ArrayState { shards, comment, ..ArrayState::default() };
                state.store(dir)?;
                state
            }
        };
        let indices: Vec<usize> = (0..state.shards).collect();
        let found =
            slurm.find_by_comment(&format!("pruefstand-{job}"), &state.comment)?.or_else(|| self.array_in_outputs());
        let (array, reason) = match found {
            Some(array) => {
                tracing::info!("picking up array {array}: an earlier start submitted it (comment {})", state.comment);
                (array, "found by its comment after a restart".to_string())
            }
            None => (self.submit(root, &state, &indices)?, "submitted".to_string()),
        };
        let now = chrono::Utc::now().to_rfc3339();
        state.submitted_at = now.clone();
        state.submissions.push(Submission { array, indices, at: now, reason });
        state.store(dir)?;
        tracing::info!("array {array}: {} shards of {} cases", state.shards, cases.len());
        Ok(state)
    }

    /// Writes the batch script and submits tasks `indices` with the job's comment.
    fn submit(&self, root: &Path, state: &ArrayState, indices: &[usize]) -> anyhow::Result<ArrayId> {
        let binary = std::env::current_exe().context("finding the pruefstand binary for the batch script")?;
        let root = root.canonicalize().context("resolving the bench root")?;
        let run = &self.dir;
        pruefstand_core::queue::private_dir(&run.shards_path())?;
        let script = run.shard_script_path();
        let reference = self.reference.then_some(run.path());
        let text = slurm::batch_script(&binary, &root, self.job, state.shards, reference)?;
        util::write_atomic(&script, text.as_bytes())?;
        let output = run.shard_output_pattern();
        let array = slurm::array_spec(indices);
        let argv = slurm::sbatch_argv(&self.config, self.job, &array, &state.comment, &output, &script);
        self.slurm.submit(&argv)
    }

    /// An array whose tasks already ran and left their output beside the shards (the
    /// store's [`RunDir::shard_outputs`]): `squeue` forgets a task once it has ended.
    fn array_in_outputs(&self) -> Option<ArrayId> {
        self.dir.shard_outputs().into_iter().map(|(array, _)| array).min()
    }

    /// Looks at the array every [`FOLLOW_INTERVAL`] until it is over or the run is
    /// stopped; the array as it ended, and the shards that failed for good.
    async fn until_done(
        &self,
        control: &RunControl,
        mut state: ArrayState,
        planned: usize,
    ) -> anyhow::Result<(ArrayState, Vec<String>)> {
        loop {
            if control.is_stopped() {
                return Err(self.off_runtime(move |follow| follow.stopped(&state)).await);
            }
            let look;
            (state, look) = self
                .off_runtime(move |follow| {
                    let look = follow.look(&mut state);
                    (state, look)
                })
                .await;
            let look = look?;
            let counts = gym::Counts { done: look.recorded.min(planned), total: planned, in_flight: 0 };
            control.gym.report(self.dir.path(), counts);
            if let Some(failed) = look.ended {
                return Ok((state, failed));
            }
            tokio::select! {
                () = tokio::time::sleep(FOLLOW_INTERVAL) => {}
                () = control.until_stopped() => {}
            }
        }
    }

    /// Why the follow ended on a stop: a cancelled job's arrays are cancelled, an
    /// interrupted daemon's keep running.
    fn stopped(&self, state: &ArrayState) -> anyhow::Error {
        if self.queue.load(self.job).is_ok_and(|j| j.cancel_requested) {
            if let Err(err) = cancel_arrays(&self.dir) {
                return err;
            }
            return anyhow::anyhow!("cancelled: array {:?} cancelled with scancel", state.arrays());
        }
        anyhow::anyhow!("interrupted: array {:?} keeps running and is picked up at the next start", state.arrays())
    }

    /// One look (`squeue` and the exit records): a dead shard requeued once, the counts
    /// stored when they changed, the rest cancelled once a shard failed for good.
    fn look(&self, state: &mut ArrayState) -> anyhow::Result<Look> {
        let dir = &self.dir;
        let submissions_before = state.submissions.len();
        let (counts, failed) = self.standings(state)?;
        let recorded: usize = (0..state.shards).map(|i| dir.shard(i).count_cases()).sum();
        if state.counts != counts || state.submissions.len() != submissions_before {
            state.counts = counts;
            state.store(dir)?;
            tracing::info!("{}", counts.line());
        }
        if !failed.is_empty() {
            // The others are of no use to a run that is invalid anyway.
            if let Err(err) = cancel_arrays(dir) {
                tracing::warn!("cancelling the rest of the array: {err:#}");
            }
            return Ok(Look { recorded, ended: Some(failed) });
        }
        let ended = (counts.done == state.shards).then(Vec::new);
        Ok(Look { recorded, ended })
    }

    /// Each shard's standing, counted; a dead one submitted again (once), one dead a
    /// second time failed for good (the reasons).
    fn standings(&self, state: &mut ArrayState) -> anyhow::Result<(ShardCounts, Vec<String>)> {
        let Follow { slurm, config, dir, job, .. } = self;
        let tasks = slurm.tasks(&state.arrays())?;
        let mut counts = ShardCounts::default();
        let mut failed = Vec::new();
        for index in 0..state.shards {
            let task = state.latest(index).and_then(|array| tasks.get(&(array, index)).copied());
            let exit = ExitRecord::load(&dir.shard(index))?;
            let why = match standing(exit.as_ref(), task) {
                Standing::Done => {
                    counts.done += 1;
                    continue;
                }
                Standing::Pending => {
                    counts.pending += 1;
                    continue;
                }
                Standing::Running => {
                    counts.running += 1;
                    continue;
                }
                Standing::Dead(why) => why,
            };
            let why = match state.latest(index).and_then(|array| slurm.task_facts(array, index)) {
                Some(facts) => format!("{why}; Slurm: {facts}"),
                None => why,
            };
            if state.submissions_of(index) >= MAX_SUBMISSIONS {
                failed.push(format!("shard {index} failed twice: {why}"));
                continue;
            }
            let _ = dir.shard(index).remove_shard_exit();
            let (output, script) = (dir.shard_output_pattern(), dir.shard_script_path());
            let argv = slurm::sbatch_argv(config, *job, &index.to_string(), &state.comment, &output, &script);
            let array = slurm.submit(&argv)?;
            tracing::warn!("shard {index} died ({why}); requeued once as array {array}, it resumes into its directory");
            let at = chrono::Utc::now().to_rfc3339();
            state.submissions.push(Submission { array, indices: vec![index], at, reason: why });
            counts.pending += 1;
        }
        Ok((counts, failed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: i32) -> ExitRecord {
        ExitRecord { code, error: (code != 0).then(|| "gym failed".into()), ..ExitRecord::default() }
    }

    #[test]
    fn a_damaged_exit_record_is_an_error_naming_its_file_not_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let shard = RunDir::new(dir.path().join("shard-0"));
        assert_eq!(ExitRecord::load(&shard).unwrap(), None, "none written yet");
        exit(0).store(&shard).unwrap();
        assert_eq!(ExitRecord::load(&shard).unwrap(), Some(exit(0)));
        let file = shard.shown(RunFile::ShardExit);
        std::fs::write(&file, "{\"index\": 0, \"code\": ").unwrap();
        let err = format!("{:#}", ExitRecord::load(&shard).unwrap_err());
        assert!(err.contains(&file) && err.contains("damaged"), "{err}");
    }

    #[test]
    fn a_shard_stands_by_its_exit_record_first_then_by_squeue() {
        assert_eq!(standing(Some(&exit(0)), None), Standing::Done);
        assert_eq!(standing(Some(&exit(0)), Some(TaskState::Running)), Standing::Done, "ended between the reads");
        assert_eq!(standing(Some(&exit(1)), None), Standing::Dead("gym failed".into()));
        assert_eq!(standing(None, Some(TaskState::Pending)), Standing::Pending);
        assert_eq!(standing(None, Some(TaskState::Running)), Standing::Running);
        assert!(matches!(standing(None, None), Standing::Dead(why) if why.contains("without an exit record")));
    }

    #[test]
    fn the_latest_submission_of_a_shard_is_the_one_followed() {
        let sub = |array, indices: Vec<usize>| Submission { array, indices, at: String::new(), reason: String::new() };
        let state = ArrayState {
            shards: 3,
            submissions: vec![sub(10, vec![0, 1, 2]), sub(14, vec![1])],
            ..ArrayState::default()
        };
        assert_eq!((state.latest(0), state.latest(1)), (Some(10), Some(14)));
        assert_eq!((state.submissions_of(1), state.submissions_of(2)), (2, 1));
        assert_eq!(state.arrays(), [10, 14]);
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        state.store(&run).unwrap();
        assert_eq!(ArrayState::load(&run).unwrap(), Some(state));
    }
}
