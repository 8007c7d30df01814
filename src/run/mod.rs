//! One run of a version on a plan, end to end — the one place that does it. Whoever
//! asks for a run (`pruefstand run`, a daemon job, a cluster shard, `pruefstand gym`) builds a
//! [`RunRequest`] and hands it to a [`Session`], which carries what every step needs
//! (root, venv, container pool, the caller's stop control). The pipeline is always the
//! same: the executor's own check, the Docker preflight where the model runs here, the
//! run directory claimed, the reference first when R4 needs one, the cases executed,
//! the run's records written and judged.
//!
//! How the cases are executed is an [`Executor`]'s business: [`LocalGym`] (the model up
//! here, the gym with the agent runtime, the model down), a Slurm job array
//! (`cluster`), or [`AgentOnly`] (`pruefstand gym`: the caller's agent command, no model
//! server of ours, no judgement). Early stop is a sink on the gym's events (`early`); the reference's run
//! is found or made by `reference`. Parsing arguments and printing results are
//! `cmd::run`'s.

mod agent_only;
mod early;
mod local;
mod reference;
mod setup;
mod silence;

use std::path::PathBuf;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::adaptive::setup::Attacker;
use crate::container::{self, Pool, ServerSetup};
use crate::gym::{self, Executed};
pub(crate) use agent_only::AgentOnly;
pub(crate) use local::{LocalGym, executed_from_run_dir};
use pruefstand_core::case::Case;
use pruefstand_core::inventory::Inventory;
use pruefstand_core::plan::{Filters, Plan, Profile};
use pruefstand_core::record::{
    AttackFamilies, ConcurrencyFacts, EarlyStop, GpuExclusivity, ModelServerFacts, RunMeta, ShardFacts, TrainedExport,
};
use pruefstand_core::root::{self, Root};
use pruefstand_core::spec::{Backend, Version};
use pruefstand_core::util::Failure;
use pruefstand_gym::pyenv::PyEnv;
use pruefstand_judge as judge;
use pruefstand_judge::Judgement;
use pruefstand_judge::contamination;
use pruefstand_report as report;
use pruefstand_report::export;
use pruefstand_store::{Claimed, Identity, Reading, RunDir};
use setup::{AgentSetup, Defence};

/// What the caller hooks into a run: the gym's stop switch and progress handle, the GPU
/// guard's observation of exclusivity (read when each run is recorded, for R1), and
/// how a stop treats a model server that is still starting.
pub(crate) struct RunControl {
    pub(crate) gym: Arc<gym::Control>,
    pub(crate) gpu: Option<Box<dyn Fn() -> GpuExclusivity + Send + Sync>>,
    /// A plain `run` stopped by Ctrl-C abandons a cold start (the container left
    /// behind is an orphan for the next start to remove); the daemon lets the start
    /// finish, so its pool stops the container it owns.
    pub(crate) stop_abandons_start: bool,
    stopped: tokio::sync::watch::Sender<bool>,
}

impl Default for RunControl {
    fn default() -> Self {
        RunControl::new(Arc::new(gym::Control::new()), None)
    }
}

impl RunControl {
    pub(crate) fn new(
        gym: Arc<gym::Control>,
        gpu: Option<Box<dyn Fn() -> GpuExclusivity + Send + Sync>>,
    ) -> RunControl {
        RunControl { gym, gpu, stop_abandons_start: false, stopped: tokio::sync::watch::Sender::new(false) }
    }

    /// Stops the run: the gym now (finished cases are kept), the model server after it.
    pub(crate) fn stop(&self) {
        self.gym.stop();
        self.stopped.send_replace(true);
    }

    pub(crate) fn is_stopped(&self) -> bool {
        *self.stopped.borrow()
    }

    pub(crate) async fn until_stopped(&self) {
        let _ = self.stopped.subscribe().wait_for(|stopped| *stopped).await;
    }

    pub(crate) fn gpu(&self) -> GpuExclusivity {
        self.gpu.as_ref().map_or(GpuExclusivity::NotObserved, |observe| observe())
    }
}

/// How much of the plan a pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Extent {
    /// The plan as it says: stopped early once decided when it opts in.
    Plan,
    /// Every case (reference runs, shards, `run --full`).
    Full,
}

/// Whether the version's reference is run (or found) first, for R4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReferencePolicy {
    /// When the version names one (a candidate's run).
    FirstWhenNamed,
    /// Never (the reference's own run, a shard: its daemon made the reference).
    Skip,
}

/// One run as asked for, resolved once and whole by [`RunRequest::builder`]: the
/// version, the plan it runs (resolved against the installed AgentDojo; a shard's is a
/// slice of it), the reference's own request when the run makes or finds it first, how
/// many cases are in flight, how much of the plan, where it lands, and the spec projected
/// for the model server, the agent and the defence. Read through its accessors; nothing
/// changes it after.
#[derive(Clone)]
pub(crate) struct RunRequest {
    version: Version,
    plan: Plan,
    inventory: Inventory,
    /// The run of the version's reference (R4) on the same plan, resolved with this one
    /// (the reference loaded once), when this run makes or finds it first.
    reference: Option<Box<RunRequest>>,
    /// `--jobs N` holds N cases in flight; None: the model server steers.
    jobs: Option<usize>,
    extent: Extent,
    /// The run directory (an existing one of the same identity is resumed); None: a new
    /// one under `reports/<version>/<plan>/`.
    out: Option<PathBuf>,
    /// The run's seed when the directory is made now (a shard takes its run's).
    seed: Option<u64>,
    server: ServerSetup,
    agent: AgentSetup,
    defence: Defence,
    /// The candidate whose reference this run is (its `run.json` says so, and the index
    /// shows it as that reference rather than by a verdict no one asked for).
    reference_for: Option<String>,
    /// The plan's attacker campaign's attacker, its endpoint and key read here, once.
    attacker: Option<Attacker>,
}

/// Keeps some of a resolved plan's cases (a shard's slice).
type CaseFilter = Box<dyn FnOnce(Vec<Case>) -> Vec<Case> + Send>;

/// What a [`RunRequest`] is resolved from. By default a candidate's run: the plan as it
/// says (stopped early when it opts in), the reference first when the version names one,
/// the server steering the cases in flight, a new directory under `reports/`; set what
/// differs, then [`RequestBuilder::resolve`].
#[must_use]
pub(crate) struct RequestBuilder<'s> {
    session: &'s Session,
    version: Version,
    plan: String,
    filters: Filters,
    reference: ReferencePolicy,
    jobs: Option<usize>,
    extent: Extent,
    out: Option<PathBuf>,
    seed: Option<u64>,
    cases: Option<CaseFilter>,
}

impl RunRequest {
    /// A run of `version` on `plan` (`schnell`, `voll` or a plan file), to be resolved.
    pub(crate) fn builder<'s>(session: &'s Session, version: Version, plan: &str) -> RequestBuilder<'s> {
        RequestBuilder {
            session,
            version,
            plan: plan.to_string(),
            filters: Filters::default(),
            reference: ReferencePolicy::FirstWhenNamed,
            jobs: None,
            extent: Extent::Plan,
            out: None,
            seed: None,
            cases: None,
        }
    }

    pub(crate) fn version(&self) -> &Version {
        &self.version
    }

    pub(crate) fn plan(&self) -> &Plan {
        &self.plan
    }

    pub(crate) fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// Who writes the attacker campaign's attempts, when the plan has one.
    pub(crate) fn attacker(&self) -> Option<&Attacker> {
        self.attacker.as_ref()
    }

    /// The same plan for another version (the reference's own run: every case, no
    /// reference of its own).
    fn for_reference(&self, reference: Version) -> RunRequest {
        let attacker =
            self.attacker.as_ref().zip(self.plan.adaptive.as_ref()).map(|(a, p)| a.for_version(p, &reference));
        RunRequest {
            server: ServerSetup::of(&reference),
            agent: AgentSetup::of(&reference),
            defence: Defence::of(&reference),
            version: reference,
            plan: self.plan.clone(),
            inventory: self.inventory.clone(),
            reference: None,
            jobs: self.jobs,
            extent: Extent::Full,
            out: None,
            seed: None,
            reference_for: Some(self.version.name.clone()),
            attacker,
        }
    }

    /// What a run directory of this request must match to be resumed.
    pub(crate) fn identity(&self) -> Identity {
        Identity {
            version: self.version.name.clone(),
            spec_hash: self.version.hash.clone(),
            plan_hash: self.plan.hash.clone(),
            benchmark_version: self.plan.benchmark_version.clone(),
        }
    }

    /// The plan's held-out families, the version's `trained_on` and the exports it was
    /// trained on: what R2 judges.
    fn attack_families(&self, trained_on_exports: Vec<TrainedExport>) -> AttackFamilies {
        AttackFamilies {
            held_out: self.plan.held_out.clone(),
            trained_on: self.version.spec.trained_on.iter().map(|f| f.get_ref().clone()).collect(),
            trained_on_exports,
        }
    }

    /// The records (deduplicated) of the reference's complete run on this plan, found as
    /// [`Session::run`] found it before this run started; Some(empty) when none is found,
    /// None when the request has no reference.
    fn reference_records(&self, root: &Root) -> anyhow::Result<Option<Vec<pruefstand_core::case::CaseRecord>>> {
        let Some(reference) = &self.reference else { return Ok(None) };
        let Some(dir) = reference::find_reference_run(&root.reports(), &reference.version, &self.plan, &self.inventory)
        else {
            return Ok(Some(Vec::new()));
        };
        Ok(Some(pruefstand_judge::dedup(&RunDir::open(dir)?.read_cases(Reading::Strict)?.records)))
    }
}

impl RequestBuilder<'_> {
    /// Only the plan's cases that `filters` keep (`pruefstand gym --suite …`).
    pub(crate) fn filters(mut self, filters: Filters) -> Self {
        self.filters = filters;
        self
    }

    /// Whether the version's reference is run (or found) first.
    pub(crate) fn reference(mut self, reference: ReferencePolicy) -> Self {
        self.reference = reference;
        self
    }

    /// Cases in flight (`--jobs`, checked by its parser); None: the server steers.
    pub(crate) fn jobs(mut self, jobs: Option<usize>) -> Self {
        self.jobs = jobs;
        self
    }

    pub(crate) fn extent(mut self, extent: Extent) -> Self {
        self.extent = extent;
        self
    }

    /// The run directory itself (resumed when it holds the same run).
    pub(crate) fn out(mut self, out: Option<PathBuf>) -> Self {
        self.out = out;
        self
    }

    /// The seed of a directory made now (a shard takes its run's).
    pub(crate) fn seed(mut self, seed: Option<u64>) -> Self {
        self.seed = seed;
        self
    }

    /// Keeps only what `keep` returns of the resolved plan's cases (a shard's slice; the
    /// plan's hash stays the whole plan's).
    pub(crate) fn cases(mut self, keep: impl FnOnce(Vec<Case>) -> Vec<Case> + Send + 'static) -> Self {
        self.cases = Some(Box::new(keep));
        self
    }

    /// The request, checked against the installed AgentDojo and with its reference
    /// loaded — on the blocking pool: resolving the plan asks AgentDojo (a Python
    /// process, unless its answer is cached).
    pub(crate) async fn resolve(self) -> anyhow::Result<RunRequest> {
        let RequestBuilder { session, version, plan, filters, reference, jobs, extent, out, seed, cases } = self;
        let (root, pyenv, wanted) = (session.root.clone(), session.pyenv.clone(), version.clone());
        let (plan, inventory, reference) = crate::runtime::blocking(move || {
            let (plan_path, profile, _) = Profile::load_named(&root.path, &plan)?;
            let inventory = pyenv.inventory(profile.benchmark_version.get_ref())?;
            let mut plan = Plan::resolve(&plan_path, &inventory, &filters)?;
            if let Some(keep) = cases {
                plan.cases = keep(std::mem::take(&mut plan.cases));
            }
            // Where the version finds it: versions/, or a queued job's snapshot.
            let reference = match reference {
                ReferencePolicy::FirstWhenNamed => wanted.load_reference().transpose()?,
                _ => None,
            };
            anyhow::Ok((plan, inventory, reference))
        })
        .await?;
        let (server, agent, defence) = (ServerSetup::of(&version), AgentSetup::of(&version), Defence::of(&version));
        let attacker = plan.adaptive.as_ref().map(|adaptive| Attacker::resolve(adaptive, &version));
        let mut request = RunRequest {
            version,
            plan,
            inventory,
            reference: None,
            jobs,
            extent,
            out,
            seed,
            server,
            agent,
            defence,
            reference_for: None,
            attacker,
        };
        request.reference = reference.map(|version| Box::new(request.for_reference(version)));
        Ok(request)
    }
}

/// How a run's cases are executed once its directory is claimed: the local gym, or a
/// cluster's job array. Either records the cases in the claimed directory and says
/// what the model server contributes to the run's record.
pub(crate) trait Executor: Send + Sync {
    /// Refuses a request this executor cannot run, before anything starts.
    fn check(&self, _request: &RunRequest) -> anyhow::Result<()> {
        Ok(())
    }

    /// Whether the model server runs on this machine (then its inputs are checked here
    /// before the run directory is claimed).
    fn runs_here(&self) -> bool {
        true
    }

    /// The executor of the reference's run, when R4 needs one made: where this one
    /// runs the candidate (a cluster's array, or here).
    fn for_reference(&self) -> Box<dyn Executor + '_> {
        Box::new(LocalGym)
    }

    fn execute<'a>(
        &'a self,
        session: &'a Session,
        request: &'a RunRequest,
        claimed: &'a Claimed,
    ) -> BoxFuture<'a, anyhow::Result<(Executed, Served)>>;
}

/// What the model server contributes to the run's record.
#[derive(Default)]
pub(crate) struct Served {
    pub(crate) image_digest: Option<String>,
    pub(crate) model_server: Option<ModelServerFacts>,
    /// When the run began (a resumed run keeps its first start).
    pub(crate) started_at: String,
    pub(crate) concurrency: Option<ConcurrencyFacts>,
    /// Observed elsewhere (a cluster's nodes) rather than by this run's control.
    pub(crate) gpu: Option<GpuExclusivity>,
    /// A run merged from a cluster's shards (`cluster`).
    pub(crate) shards: Option<ShardFacts>,
    /// `early_stop.json` as this process's pass settled it; None: not settled here (then
    /// read from the run directory when the run is recorded).
    pub(crate) early_stop: Option<EarlyStop>,
}

pub(crate) struct Finished {
    pub(crate) run_dir: RunDir,
    pub(crate) executed: Executed,
    pub(crate) judgement: Judgement,
    /// The reference run compared with, and whether it was made for this run.
    pub(crate) reference: Option<(PathBuf, bool)>,
}

/// What every run of one caller shares: the bench root, the venv, the container pool
/// (warm across a daemon's jobs) and the caller's control.
pub(crate) struct Session {
    pub(crate) root: Root,
    pub(crate) pyenv: PyEnv,
    pub(crate) pool: Arc<Pool>,
    pub(crate) control: Arc<RunControl>,
}

impl Session {
    /// A session with a pool of its own, for one command (`run`, a shard): end it with
    /// [`Session::shutdown`].
    /// Making the venv ready (a flock, maybe the pip build) runs on the blocking pool.
    pub(crate) async fn open(root: Root, control: Arc<RunControl>) -> anyhow::Result<Session> {
        let pyenv = crate::runtime::blocking(PyEnv::ensure).await?;
        let pool = Arc::new(Pool::new(pyenv.cache.join("container")));
        Ok(Session { root, pyenv, pool, control })
    }

    /// Stops and removes whatever the pool still holds.
    pub(crate) async fn shutdown(&self) -> anyhow::Result<()> {
        self.pool.shutdown().await
    }

    /// Runs `request` to its judgement: the executor's check, the preflight, the run
    /// directory, the reference first when R4 needs one, the cases, the records and
    /// the judgement. A stop after the directory was claimed is
    /// [`Failure::Interrupted`], a full disk [`Failure::DiskFull`].
    pub(crate) async fn run(&self, request: &RunRequest, executor: &dyn Executor) -> Result<Finished, Failure> {
        executor.check(request)?;
        // The exports the adapter was trained on, read before anything runs: a missing
        // or changed one stops the run here, not after the night (R1 judges what they
        // hold; docs/training.md).
        let trained_on_exports = trained_exports(request.version()).await?;
        // A plan holding out a family those exports hold is refused here, in
        // `check --plan`'s words: R1 would only find the run invalid after every case.
        let trained_on: Vec<String> = request.version().spec.trained_on.iter().map(|f| f.get_ref().clone()).collect();
        let (plan, version) = (&request.plan.name, &request.version().name);
        if let Some(refusal) =
            contamination::refusal(plan, version, &request.plan.held_out, &trained_on, &trained_on_exports)
        {
            return Err(Failure::Other(anyhow::anyhow!("refused before any case ran: {refusal}")));
        }
        if executor.runs_here() {
            self.preflight(request).await?;
        }
        // The run directory first: a wrong --out is refused before anything runs.
        let claimed = self.claim(request).await?;
        let finished = async {
            // R4 compares with the reference on the same plan: make sure its run exists first.
            let reference = match &request.reference {
                Some(reference) => {
                    let executor = executor.for_reference();
                    Some(self.reference_run(reference, executor.as_ref()).await?)
                }
                None => None,
            };
            let (executed, served) = executor.execute(self, request, &claimed).await?;
            let reference_dir = reference.as_ref().map(|(dir, _)| dir.clone());
            let families = request.attack_families(trained_on_exports);
            let judgement = self.record_and_judge(&claimed.dir, request, reference_dir, served, families).await?;
            anyhow::Ok(Finished { run_dir: claimed.dir.clone(), executed, judgement, reference })
        }
        .await;
        finished.map_err(|cause| match self.control.is_stopped() {
            true => Failure::Interrupted { run_dir: claimed.dir.path().to_path_buf(), cause },
            false => Failure::of(cause),
        })
    }

    /// Runs `request`'s cases into their directory with no reference and no judgement:
    /// a shard's part of a run judged where the shards are merged, or a gym run.
    pub(crate) async fn execute(
        &self,
        request: &RunRequest,
        executor: &dyn Executor,
    ) -> anyhow::Result<(RunDir, Executed, Served)> {
        executor.check(request)?;
        if executor.runs_here() {
            self.preflight(request).await?;
        }
        let claimed = self.claim(request).await?;
        let (executed, served) = executor.execute(self, request, &claimed).await?;
        Ok((claimed.dir, executed, served))
    }

    /// The request's run directory (`out`, or a new one under `reports/`), claimed with
    /// its identity and seed (a flock: on the blocking pool).
    async fn claim(&self, request: &RunRequest) -> anyhow::Result<Claimed> {
        let path =
            request.out.clone().unwrap_or_else(|| self.root.new_run_dir(&request.version.name, &request.plan.name));
        let (identity, seed) = (request.identity(), request.seed);
        crate::runtime::blocking(move || RunDir::claim_seeded(&path, &identity, seed)).await
    }

    /// Before anything starts, for Docker versions (this one and its reference):
    /// containers of dead owners (a `kill -9`'d run) are removed and reported, and the
    /// inputs checked (image present, model and adapter folders).
    async fn preflight(&self, request: &RunRequest) -> anyhow::Result<()> {
        let servers: Vec<&ServerSetup> =
            [&request.server].into_iter().chain(request.reference.as_ref().map(|r| &r.server)).collect();
        if servers.iter().any(|server| server.backend() == Backend::Docker) {
            let docker = self.pool.docker().await?;
            for orphan in container::remove_orphans(docker).await? {
                tracing::warn!("{orphan}");
            }
            for server in servers {
                container::preflight_with(docker, server).await?;
            }
        }
        Ok(())
    }

    /// Writes what `judge` reads back (`run.json`, `thresholds.json`), then judges and
    /// writes the reports — the same path `pruefstand judge` takes later; the writing
    /// and judging on the blocking pool. `attack_families` holds the trained-on exports
    /// as read when the run began.
    async fn record_and_judge(
        &self,
        run_dir: &RunDir,
        request: &RunRequest,
        reference_run_dir: Option<PathBuf>,
        served: Served,
        attack_families: AttackFamilies,
    ) -> anyhow::Result<Judgement> {
        let plan = &request.plan;
        let lineage = lineage_of(&request.version).await?;
        let mut meta = RunMeta {
            run_id: root::run_id(run_dir.path()),
            version: request.version.name.clone(),
            plan: plan.name.clone(),
            plan_hash: plan.hash.clone(),
            planned_case_ids: plan.cases.iter().map(|c| c.id.clone()).collect(),
            benchmark_version: plan.benchmark_version.clone(),
            agentdojo_version: Some(request.inventory.agentdojo_version.clone()),
            image_digest: served.image_digest,
            // The GPU guard (daemon) observes exclusivity; a plain `run` does not.
            gpu: served.gpu.unwrap_or_else(|| self.control.gpu()),
            reference_run_dir,
            started_at: Some(served.started_at.clone()),
            model_server: served.model_server,
            concurrency: served.concurrency,
            early_stop: served.early_stop,
            shards: served.shards,
            attack_families,
            reference_for: request.reference_for.clone(),
            lineage,
        };
        let (run_dir, thresholds, reports) = (run_dir.clone(), plan.profile.rules.clone(), self.root.reports());
        crate::runtime::blocking(move || {
            // Not settled by this process's pass (a server that never came up, or fell
            // silent): as an earlier pass left it.
            if meta.early_stop.is_none() {
                meta.early_stop = early::read(&run_dir)?;
            }
            run_dir.write_run_meta(&meta)?;
            run_dir.write_thresholds(&thresholds)?;
            let judged = judge::judge_dir(&run_dir, None, None)?;
            report::write(&run_dir, &judged, Some(&reports))?;
            Ok(judged.judgement)
        })
        .await
    }
}

/// The exports the version's adapter was trained on, read and checked (on the blocking
/// pool); recorded by path and hash, with the families each holds (R1's guard).
/// The adapter's lineage when `pruefstand train` made it (`training.json` beside it),
/// checked link by link now, as the run is recorded.
async fn lineage_of(version: &Version) -> anyhow::Result<Option<pruefstand_core::record::Lineage>> {
    let Some(path) = version.spec.adapter.as_ref().and_then(|a| a.path.clone()) else { return Ok(None) };
    let (dir, exports) = (version.files_dir.join(path), version.trained_on_exports());
    crate::runtime::blocking(move || Ok(pruefstand_report::lineage::lineage(&dir, &exports))).await
}

async fn trained_exports(version: &Version) -> anyhow::Result<Vec<TrainedExport>> {
    let exports = version.training_data();
    crate::runtime::blocking(move || export::trained_exports(&exports)).await
}
