//! One run of a version on a plan, end to end: the reference first when R4 needs it,
//! the model up, the gym with the agent runtime, the run's records (`version.json`,
//! `run.json`, `thresholds.json`), the judgement and reports, the model down.
//!
//! `pruefstand run` and the daemon's jobs take this same path; a [`RunContext`] carries
//! what every step needs (root, venv, plan, container pool, the caller's control).
//! Docker versions are checked first ([`preflight`]: orphans of dead runs removed, image
//! and folders checked), a dead server is restarted once and the gym resumed, and
//! `provenance.json` is written for every backend. Parsing arguments and printing
//! results are `cmd::run`'s.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};

use crate::case::CaseRecord;
use crate::concurrency::{self, Concurrency, ObservedCapacity};
use crate::container::{self, Pool};
use crate::gym::{self, Executed, GymSettings};
use crate::judge::Judgement;
use crate::judge::early;
use crate::order::{dispatch_order, user_task_order};
use crate::plan::{Filters, Plan, Profile};
use crate::pyenv::{self, Inventory, PyEnv};
use crate::record::{
    AttackFamilies, ConcurrencyFacts, EarlyStop, GpuExclusivity, ModelServerFacts, RunMeta, ShardFacts,
};
use crate::root::{self, Root};
use crate::rundir::{Claimed, Identity, RunDir, RunLock};
use crate::settings::defence::GuardrailSpec;
use crate::spec::{Backend, Version};
use crate::{adaptive, agent, judge, model, provenance, report, telemetry, util};

/// What the caller hooks into a run: the gym's stop switch and progress sink, the GPU
/// guard's observation of exclusivity (read when each run is recorded, for R1), and
/// how a stop treats a model server that is still starting.
pub struct RunControl {
    pub gym: Arc<gym::Control>,
    pub gpu: Option<Box<dyn Fn() -> GpuExclusivity + Send + Sync>>,
    /// A plain `run` stopped by Ctrl-C abandons a cold start (the container left
    /// behind is an orphan for the next start to remove); the daemon lets the start
    /// finish, so its pool stops the container it owns.
    pub stop_abandons_start: bool,
    stopped: tokio::sync::watch::Sender<bool>,
}

impl Default for RunControl {
    fn default() -> Self {
        RunControl::new(Arc::new(gym::Control::new()), None)
    }
}

impl RunControl {
    pub fn new(gym: Arc<gym::Control>, gpu: Option<Box<dyn Fn() -> GpuExclusivity + Send + Sync>>) -> RunControl {
        RunControl { gym, gpu, stop_abandons_start: false, stopped: tokio::sync::watch::Sender::new(false) }
    }

    /// Stops the run: the gym now (finished cases are kept), the model server after it.
    pub fn stop(&self) {
        self.gym.stop();
        self.stopped.send_replace(true);
    }

    pub fn is_stopped(&self) -> bool {
        *self.stopped.borrow()
    }

    pub async fn until_stopped(&self) {
        let _ = self.stopped.subscribe().wait_for(|stopped| *stopped).await;
    }

    pub fn gpu(&self) -> GpuExclusivity {
        self.gpu.as_ref().map_or(GpuExclusivity::NotObserved, |observe| observe())
    }
}

pub struct Finished {
    pub run_dir: RunDir,
    pub executed: Executed,
    pub judgement: Judgement,
    /// The reference run compared with, and whether it was made for this run.
    pub reference: Option<(PathBuf, bool)>,
}

/// Everything a run needs, resolved once: the bench root, the venv, the plan with the
/// installed AgentDojo's inventory, the container pool and the caller's control.
pub struct RunContext<'a> {
    pub root: &'a Root,
    pub pyenv: &'a PyEnv,
    pub pool: &'a Pool,
    pub control: &'a RunControl,
    pub plan: Plan,
    pub inventory: Inventory,
    /// Gym workers (default: the plan's).
    pub jobs: Option<usize>,
    /// `run --full`: run the whole plan even when it stops early (continues a run that
    /// stopped).
    pub full: bool,
}

/// How much of the plan a pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extent {
    /// The plan as it says: stopped early once decided when it opts in.
    Plan,
    /// Every case (reference runs, `run --full`).
    Full,
}

/// `pruefstand run`: a fresh container pool, shut down at the end whatever happened.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    root: &Root,
    pyenv: &PyEnv,
    control: &RunControl,
    version: &Version,
    plan: &str,
    jobs: Option<usize>,
    out: Option<PathBuf>,
    full: bool,
) -> anyhow::Result<Finished> {
    let pool = Pool::new(pyenv.cache.join("container"));
    let result = async {
        let ctx = RunContext { full, ..RunContext::new(root, pyenv, &pool, control, plan, jobs)? };
        preflight(&ctx, version).await?;
        ctx.run(version, out).await
    }
    .await;
    let shutdown = pool.shutdown().await;
    let finished = result?;
    shutdown?;
    Ok(finished)
}

/// Before anything starts, for Docker versions (this one and its reference): containers
/// of dead owners (a `kill -9`'d run) are removed and reported, and the inputs checked
/// (image present, model and adapter folders).
pub async fn preflight(ctx: &RunContext<'_>, version: &Version) -> anyhow::Result<()> {
    let mut versions = vec![version.clone()];
    if let Some(name) = version.reference() {
        versions.push(Version::load(&ctx.root.versions(), name)?);
    }
    if versions.iter().any(|v| *v.spec.model.backend.get_ref() == Backend::Docker) {
        let docker = ctx.pool.docker().await?;
        for orphan in container::remove_orphans(docker).await? {
            tracing::warn!("{orphan}");
        }
        for v in &versions {
            container::preflight_with(docker, v).await?;
        }
    }
    Ok(())
}

impl<'a> RunContext<'a> {
    /// Reads the plan (`schnell`, `voll` or a file) and checks it against the installed
    /// AgentDojo.
    pub fn new(
        root: &'a Root,
        pyenv: &'a PyEnv,
        pool: &'a Pool,
        control: &'a RunControl,
        plan: &str,
        jobs: Option<usize>,
    ) -> anyhow::Result<RunContext<'a>> {
        let plan_path = Profile::locate(&root.path, plan);
        let (profile, _) = Profile::load(&plan_path)?;
        let inventory = Inventory::load(pyenv, profile.benchmark_version.get_ref())?;
        let plan = Plan::resolve(&plan_path, &inventory, &Filters::default())?;
        Ok(RunContext { root, pyenv, pool, control, plan, inventory, jobs, full: false })
    }

    /// Runs `version` into `out` (or a new run directory), its reference first when R4
    /// needs one, and judges it.
    pub async fn run(&self, version: &Version, out: Option<PathBuf>) -> anyhow::Result<Finished> {
        // The run directory first: a wrong --out is refused before anything runs.
        let path = out.unwrap_or_else(|| self.root.new_run_dir(&version.name, &self.plan.name));
        let claimed = RunDir::claim(&path, &self.identity(version))?;
        // R4 compares with the reference on the same plan: make sure its run exists first.
        let reference = match version.reference() {
            Some(name) => Some(self.reference_run(&Version::load(&self.root.versions(), name)?).await?),
            None => None,
        };
        let extent = if self.full { Extent::Full } else { Extent::Plan };
        let (executed, served) = self.execute_version(&claimed, version, extent).await?;
        let reference_dir = reference.as_ref().map(|(dir, _)| dir.clone());
        let judgement = self.record_and_judge(&claimed.dir, version, reference_dir, served)?;
        Ok(Finished { run_dir: RunDir::new(claimed.dir.path.clone()), executed, judgement, reference })
    }

    /// What a run directory of `version` on this plan must match to be resumed.
    pub fn identity(&self, version: &Version) -> Identity {
        Identity {
            version: version.name.clone(),
            spec_hash: version.hash.clone(),
            plan_hash: self.plan.hash.clone(),
            benchmark_version: self.plan.benchmark_version.clone(),
        }
    }

    /// The plan's held-out families and the version's `trained_on`: what R2 judges.
    fn attack_families(&self, version: &Version) -> AttackFamilies {
        AttackFamilies {
            held_out: self.plan.held_out.clone(),
            trained_on: version.spec.trained_on.iter().map(|f| f.get_ref().clone()).collect(),
        }
    }

    /// Writes what `judge` reads back (`run.json`, `thresholds.json`), then judges and
    /// writes the reports — the same path `pruefstand judge` takes later.
    pub fn record_and_judge(
        &self,
        run_dir: &RunDir,
        version: &Version,
        reference_run_dir: Option<PathBuf>,
        served: Served,
    ) -> anyhow::Result<Judgement> {
        let plan = &self.plan;
        let meta = RunMeta {
            run_id: root::run_id(&run_dir.path),
            version: version.name.clone(),
            plan: plan.name.clone(),
            plan_hash: plan.hash.clone(),
            planned_case_ids: plan.cases.iter().map(|c| c.id.clone()).collect(),
            benchmark_version: plan.benchmark_version.clone(),
            agentdojo_version: Some(self.inventory.agentdojo_version.clone()),
            image_digest: served.image_digest,
            // The GPU guard (daemon) observes exclusivity; a plain `run` does not.
            gpu: served.gpu.unwrap_or_else(|| self.control.gpu()),
            reference_run_dir,
            started_at: Some(served.started_at.clone()),
            model_server: served.model_server,
            concurrency: served.concurrency,
            early_stop: read_early_stop(run_dir)?,
            shards: served.shards,
            attack_families: self.attack_families(version),
        };
        util::write_json_atomic(&run_dir.file("run.json"), &meta)?;
        util::write_json_atomic(&run_dir.file("thresholds.json"), &plan.profile.rules)?;
        let (judgement, input) = judge::judge_dir(&run_dir.path, None, None)?;
        report::write(&run_dir.path, &judgement, &input, Some(&self.root.reports()))?;
        Ok(judgement)
    }

    /// Runs the version's cases into `run_dir` with its model up, and records the spec
    /// and provenance. A docker server that dies is restarted once and the gym resumed;
    /// a server that fails for good (never ready, or a second death) is not an error
    /// here: the run is recorded with what it has and `failed` facts, which R1 fails.
    pub async fn execute_version(
        &self,
        claimed: &Claimed,
        version: &Version,
        extent: Extent,
    ) -> anyhow::Result<(Executed, Served)> {
        let (plan, run_dir) = (&self.plan, &claimed.dir);
        let started_at = judge::read_run_meta(&run_dir.path)
            .ok()
            .and_then(|meta| meta.started_at)
            .unwrap_or_else(|| chrono::Utc::now().to_rfc3339());
        util::write_json_atomic(
            &run_dir.file("version.json"),
            &serde_json::json!({ "name": version.name, "source": version.path, "hash": version.hash, "spec": version.spec }),
        )?;
        let truth = pyenv::truth_file(self.pyenv, &plan.benchmark_version)?;
        let run_id = root::run_id(&run_dir.path);
        let job = format!("run-{}", std::process::id());
        let gym = self.control.gym.clone();
        let ctx = model::UpContext {
            pool: self.pool,
            run_dir: &run_dir.path,
            job: &job,
            run_id: &run_id,
            interrupt_clients: Arc::new(move || gym.interrupt()),
        };
        let up = tokio::select! {
            up = model::up(version, &truth, &ctx) => up,
            () = self.control.until_stopped(), if self.control.stop_abandons_start => {
                bail!("interrupted while the model server started (a container left behind is removed at the next start)")
            }
        };
        let endpoint = match up {
            Ok(endpoint) => endpoint,
            Err(err) => {
                let Some(failure) = err.downcast_ref::<container::ServerFailure>() else { return Err(err) };
                tracing::error!("{}: {failure}", version.name);
                let facts = ModelServerFacts {
                    failed: true,
                    events: vec![failure.message.clone()],
                    log_tail: failure.log_tail.clone(),
                    ..ModelServerFacts::default()
                };
                self.write_provenance(run_dir, version, None);
                let executed = self.executed_from_run_dir(run_dir)?;
                let served = Served { model_server: Some(facts), started_at, ..Served::default() };
                return Ok((executed, served));
            }
        };
        self.write_provenance(run_dir, version, Some(&endpoint));
        let image_digest = endpoint.container().map(|c| c.image.digest());
        let mut result = self.run_gym(claimed, version, &endpoint, extent).await;
        loop {
            match endpoint.after_gym().await {
                Ok(true) => result = self.run_gym(claimed, version, &endpoint, extent).await,
                Ok(false) => break,
                Err(err) => {
                    result = Err(err);
                    break;
                }
            }
        }
        // The adaptive attacker runs after the whole plan, against the same server.
        let whole = result.as_ref().is_ok_and(|e| e.gym.not_started.unwrap_or(0) == 0);
        if whole
            && self.plan.adaptive.is_some()
            && !self.control.is_stopped()
            && let Err(err) = self.run_adaptive(claimed, version, &endpoint).await
        {
            result = Err(err);
        }
        let model_server = endpoint.down(self.pool).await?;
        if self.control.is_stopped() {
            bail!(
                "interrupted: the gym and the model server are stopped; finished cases are kept in {} (resume with \
                 --out)",
                run_dir.path.display()
            );
        }
        let failed = model_server.as_ref().is_some_and(|f| f.failed);
        let executed = match result {
            Ok(executed) => executed,
            // The gym was stopped because the server died for good: judge what exists.
            Err(err) if failed => {
                tracing::info!("gym ended with the model server: {err:#}");
                self.executed_from_run_dir(run_dir)?
            }
            Err(err) => return Err(err),
        };
        if let Some(mut early) = read_early_stop(run_dir)? {
            // Stopped early when the gym left cases unstarted on the watch's word; a full
            // pass that recorded every case clears it.
            early.stopped_early = executed.gym.not_started.is_some_and(|n| n > 0)
                || (early.stopped_early && executed.gym.records.len() < plan.cases.len());
            util::write_json_atomic(&run_dir.file(EARLY_STOP_FILE), &early)?;
        }
        let concurrency = executed.gym.concurrency.clone();
        if let Some(facts) = &concurrency
            && !failed
        {
            self.remember_capacity(run_dir, version, facts);
        }
        Ok((executed, Served { image_digest, model_server, started_at, concurrency, gpu: None, shards: None }))
    }

    /// One gym pass on the blocking pool (it reads the gym's events line by line), in
    /// the caller's span so its messages keep the daemon's job id.
    async fn run_gym(
        &self,
        claimed: &Claimed,
        version: &Version,
        endpoint: &model::Endpoint,
        extent: Extent,
    ) -> anyhow::Result<Executed> {
        let mut settings = self.gym_settings(claimed, version, endpoint)?;
        if extent == Extent::Plan && self.plan.profile.early_stop {
            settings.early = Some(self.early_watch(&claimed.dir, version, settings.seed)?);
        }
        let (pyenv, run_dir, plan, inventory) =
            (self.pyenv.clone(), RunDir::new(claimed.dir.path.clone()), self.plan.clone(), self.inventory.clone());
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || {
            span.in_scope(|| gym::execute(&pyenv, &run_dir, &plan, &inventory, settings))
        })
        .await
        .context("the gym's thread")?
    }

    /// The adaptive attacker's rounds (`adaptive::search`) on the blocking pool.
    async fn run_adaptive(
        &self,
        claimed: &Claimed,
        version: &Version,
        endpoint: &model::Endpoint,
    ) -> anyhow::Result<()> {
        let attempts = self.plan.adaptive.as_ref().map_or(0, |a| a.attempts);
        let rounds =
            (0..attempts).map(|_| self.gym_settings(claimed, version, endpoint)).collect::<anyhow::Result<Vec<_>>>()?;
        let (pyenv, run_dir, plan, inventory) =
            (self.pyenv.clone(), RunDir::new(claimed.dir.path.clone()), self.plan.clone(), self.inventory.clone());
        let seed = claimed.seed;
        let span = tracing::Span::current();
        let log = tokio::task::spawn_blocking(move || {
            span.in_scope(|| adaptive::search(&pyenv, &run_dir, &plan, &inventory, seed, rounds))
        })
        .await
        .context("the adaptive attacker's thread")??;
        let (broken, pairs) = log.broken();
        tracing::info!("adaptive attacker: {broken} of {pairs} pairs broken within {attempts} attempts");
        Ok(())
    }

    /// The run's records as they stand (a run cut short): what `judge` needs to say why.
    pub fn executed_from_run_dir(&self, run_dir: &RunDir) -> anyhow::Result<Executed> {
        let plan = &self.plan;
        if !run_dir.cases_file().exists() {
            util::write_atomic(&run_dir.cases_file(), b"")?;
        }
        let stored = run_dir.read_cases_lenient()?;
        let records: Vec<_> = plan.cases.iter().filter_map(|c| stored.records.get(&c.id).cloned()).collect();
        let telemetry = telemetry::compute(&plan.benchmark_version, plan.cases.len(), &records);
        util::write_json_atomic(&run_dir.file("telemetry.json"), &telemetry)?;
        let gym = gym::GymOutcome {
            records,
            environment_checks: Vec::new(),
            skipped: 0,
            rerun: Vec::new(),
            concurrency: None,
            not_started: None,
        };
        Ok(Executed { gym, telemetry })
    }

    /// `provenance.json`; failing to collect it is a warning, never a failed run.
    fn write_provenance(&self, run_dir: &RunDir, version: &Version, endpoint: Option<&model::Endpoint>) {
        let (plan, inventory) = (&self.plan, &self.inventory);
        let (model_dir, adapter_dir) = match endpoint.and_then(|e| e.container_dirs()) {
            Some((model, adapter)) => (Some(model), adapter),
            None => (version.spec.model.path.clone(), version.spec.adapter.as_ref().and_then(|a| a.path.clone())),
        };
        let inputs = provenance::Inputs {
            version,
            plan_name: &plan.name,
            plan_hash: &plan.hash,
            benchmark_version: &plan.benchmark_version,
            agentdojo_version: &inventory.agentdojo_version,
            container: endpoint.and_then(|e| e.container()),
            model_dir,
            adapter_dir,
        };
        if let Err(err) = provenance::write(&run_dir.path, &inputs) {
            tracing::warn!("provenance.json not written: {err:#}");
        }
    }

    /// How the gym runs this version's cases. The agent it spawns: the version's own `agent_cmd`, or `pruefstand agent`
    /// configured from the spec. The API key travels by environment only.
    fn gym_settings(
        &self,
        claimed: &Claimed,
        version: &Version,
        endpoint: &model::Endpoint,
    ) -> anyhow::Result<GymSettings> {
        let (plan, run_dir) = (&self.plan, &claimed.dir);
        let spec = &version.spec;
        let mut agent_env = vec![
            ("PRUEFSTAND_MODEL_URL".to_string(), endpoint.base_url.clone()),
            ("PRUEFSTAND_MODEL_NAME".to_string(), version.request_model().to_string()),
        ];
        if let Some(key) = &endpoint.api_key {
            agent_env.push(("PRUEFSTAND_API_KEY".to_string(), key.clone()));
        }
        let agent_cmd = match &spec.agent_cmd {
            Some(argv) => argv.clone(),
            None => {
                let config = agent::AgentConfig {
                    base_url: endpoint.base_url.clone(),
                    model: version.request_model().to_string(),
                    tool_calling: spec.model.tool_calling,
                    guardrail: spec.guardrail.clone(),
                    human: spec.human.clone(),
                    ..agent::AgentConfig::default()
                };
                let path = run_dir.file("agent.json");
                util::write_json_atomic(&path, &config)?;
                let exe = std::env::current_exe().context("finding the pruefstand binary for the agent")?;
                vec![exe.display().to_string(), "agent".into(), "--config".into(), path.display().to_string()]
            }
        };
        let defence = match &spec.guardrail {
            GuardrailSpec::Agentdojo { defence } => Some(defence.as_str().to_string()),
            _ => None,
        };
        Ok(GymSettings {
            agent_cmd,
            concurrency: self.concurrency(version),
            metrics_url: concurrency::metrics_url(&endpoint.base_url),
            display_name: spec.model.display_name.clone(),
            case_timeout_s: plan.case_timeout_s,
            seed: claimed.seed,
            defence,
            agent_env,
            control: Some(self.control.gym.clone()),
            early: None,
            wording: Default::default(),
        })
    }

    /// `--jobs N` holds N cases in flight; without it the server steers, starting where
    /// the last run of the same served model settled (else at the plan's `jobs`).
    fn concurrency(&self, version: &Version) -> Concurrency {
        if let Some(jobs) = self.jobs {
            return Concurrency::Fixed(jobs);
        }
        let ceiling = self.root.config.run.max_in_flight;
        let stored = concurrency::load_capacity(&self.root.state(), version.request_model());
        let start = stored.as_ref().map_or(self.plan.jobs, |c| c.settled).clamp(1, ceiling);
        if let Some(stored) = stored {
            tracing::info!("{}: starting at {start} cases in flight (run {})", version.request_model(), stored.run_id);
        }
        Concurrency::Auto { start, ceiling }
    }

    /// Remembers where a server-steered run settled, for the next run of that model.
    fn remember_capacity(&self, run_dir: &RunDir, version: &Version, facts: &ConcurrencyFacts) {
        if facts.mode == crate::record::ConcurrencyMode::Fixed {
            return;
        }
        let observed = ObservedCapacity {
            served_model: version.request_model().to_string(),
            settled: facts.settled,
            peak_running: facts.peak_running,
            peak_waiting: facts.peak_waiting,
            run_id: root::run_id(&run_dir.path),
            updated_at: chrono::Utc::now().to_rfc3339(),
        };
        if let Err(err) = concurrency::store_capacity(&self.root.state(), &observed) {
            tracing::warn!("observed capacity not stored: {err:#}");
        }
    }

    /// Early stopping for one gym pass: the user-task order (drawn once from the run's
    /// seed and kept in `early_stop.json`, so a resumed run keeps it) and a watch that
    /// asks `judge::early` again each time a user task's last case is recorded.
    fn early_watch(&self, run_dir: &RunDir, version: &Version, seed: u64) -> anyhow::Result<gym::EarlyWatch> {
        let plan = &self.plan;
        let early = match read_early_stop(run_dir)? {
            Some(early) => {
                let mut drawn = early.order.clone();
                let mut planned = user_task_order(&plan.cases, 0);
                drawn.sort();
                planned.sort();
                if drawn != planned {
                    bail!("{}: its order is not this plan's user tasks", run_dir.file(EARLY_STOP_FILE).display());
                }
                early
            }
            None => {
                let early = EarlyStop { seed, order: user_task_order(&plan.cases, seed), stopped_early: false };
                util::write_json_atomic(&run_dir.file(EARLY_STOP_FILE), &early)?;
                early
            }
        };
        let mut records: Vec<CaseRecord> = run_dir.read_cases_lenient()?.records.into_values().collect();
        let mut remaining: HashMap<String, usize> = HashMap::new();
        // Cases left per user task, and of the injection-goal block (key ""): only the
        // last case of one can change what `decide` says.
        let block = |suite: &str, user_task: Option<&str>| {
            user_task.map_or(String::new(), |u| crate::case::user_task_key(suite, u))
        };
        for case in &plan.cases {
            if !records.iter().any(|r| r.case_id == case.id) {
                *remaining.entry(block(&case.suite, case.user_task.as_deref())).or_default() += 1;
            }
        }
        let (cases, order, t, has_reference) =
            (plan.cases.clone(), early.order.clone(), plan.profile.rules.clone(), version.reference().is_some());
        let scope = judge::families::scope(&self.attack_families(version), &[]);
        let watch = move |record: Option<&CaseRecord>| {
            if let Some(r) = record {
                records.push(r.clone());
                match remaining.get_mut(&block(&r.suite, r.user_task.as_deref())) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        if *n > 0 {
                            return false;
                        }
                    }
                    _ => return false,
                }
            }
            early::decide(&cases, &order, &records, &t, has_reference, &scope).stop_at.is_some()
        };
        Ok(gym::EarlyWatch { order: dispatch_order(&plan.cases, &early.order), watch: Box::new(watch) })
    }

    /// The reference's run on this plan: reused when one exists for the same spec hash,
    /// plan hash and agentdojo version with every case recorded; else run now.
    pub async fn reference_run(&self, reference: &Version) -> anyhow::Result<(PathBuf, bool)> {
        let (reports, plan) = (self.root.reports(), &self.plan);
        // Two candidates needing the same reference share one run of it: the second
        // waits here, then finds it complete.
        let _shared = self.reference_lock(reference).await?;
        if let Some(dir) = find_reference_run(&reports, reference, plan, &self.inventory) {
            tracing::info!(
                "reference: reusing {}'s run {} (same spec, plan and agentdojo)",
                reference.name,
                dir.display()
            );
            return Ok((dir, false));
        }
        tracing::info!("reference: no current run of {} on plan {} — running it first", reference.name, plan.name);
        // A reference run cut short (daemon killed, job interrupted) is resumed, so none
        // of its finished cases runs twice.
        let unfinished = newest_run(&reports, reference, plan, |run| !complete(run, plan));
        let path = unfinished.unwrap_or_else(|| self.root.new_run_dir(&reference.name, &plan.name));
        let claimed = RunDir::claim(&path, &self.identity(reference))?;
        let run_dir = &claimed.dir;
        let (executed, served) = self.execute_version(&claimed, reference, Extent::Full).await?;
        let failed = served.model_server.as_ref().is_some_and(|f| f.failed);
        if !failed && executed.gym.records.len() != plan.cases.len() {
            bail!("the reference run {} is incomplete", run_dir.path.display());
        }
        self.record_and_judge(run_dir, reference, None, served)?;
        if failed {
            bail!("the reference run {} is invalid: its model server failed (see its report)", run_dir.path.display());
        }
        Ok((run_dir.path.clone(), true))
    }

    /// The lock on `reference`'s runs of this plan, waited for (saying for whom) while
    /// another run makes the reference; a stop ends the wait.
    async fn reference_lock(&self, reference: &Version) -> anyhow::Result<RunLock> {
        let path = self.root.lock_file(&format!("reference-{}-{}", reference.name, self.plan.name))?;
        let mut said = false;
        loop {
            match RunLock::try_take(&path)? {
                Ok(lock) => return Ok(lock),
                Err(holder) if !said => {
                    tracing::info!("reference: waiting for the run of {} that {holder} is making", reference.name);
                    said = true;
                }
                Err(_) => {}
            }
            tokio::select! {
                () = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
                () = self.control.until_stopped() => bail!("interrupted while waiting for the reference run"),
            }
        }
    }
}

/// The run directory's early-stop record (`early_stop.json`).
const EARLY_STOP_FILE: &str = "early_stop.json";

fn read_early_stop(run_dir: &RunDir) -> anyhow::Result<Option<EarlyStop>> {
    let path = run_dir.file(EARLY_STOP_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).with_context(|| format!("{}: not an early-stop record", path.display()))?,
        )),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("reading {}", path.display())),
    }
}

/// What the model server contributes to the run's record.
#[derive(Default)]
pub struct Served {
    pub image_digest: Option<String>,
    pub model_server: Option<ModelServerFacts>,
    /// When the run began (a resumed run keeps its first start).
    pub started_at: String,
    pub concurrency: Option<ConcurrencyFacts>,
    /// Observed elsewhere (a cluster's nodes) rather than by this run's control.
    pub gpu: Option<GpuExclusivity>,
    /// A run merged from a cluster's shards (`cluster`).
    pub shards: Option<ShardFacts>,
}

/// The newest complete run of `reference` under `reports/<name>/<plan>/` whose spec
/// hash, plan hash and agentdojo version match.
fn find_reference_run(reports: &Path, reference: &Version, plan: &Plan, inventory: &Inventory) -> Option<PathBuf> {
    newest_run(reports, reference, plan, |run| {
        let read = |name: &str| -> Option<serde_json::Value> {
            serde_json::from_str(&std::fs::read_to_string(run.join(name)).ok()?).ok()
        };
        complete(run, plan)
            && read("run.json").is_some_and(|meta| {
                meta["plan_hash"] == plan.hash.as_str()
                    && meta["agentdojo_version"] == inventory.agentdojo_version.as_str()
            })
    })
}

fn complete(run: &Path, plan: &Plan) -> bool {
    RunDir::new(run.to_path_buf()).read_cases_strict().map(|r| r.len() == plan.cases.len()).unwrap_or(false)
}

/// The newest run of `reference` on `plan` (same spec hash, same plan hash in its
/// `plan.json`) that `accept` takes.
fn newest_run(reports: &Path, reference: &Version, plan: &Plan, accept: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let dir = reports.join(&reference.name).join(&plan.name);
    let mut runs: Vec<PathBuf> =
        std::fs::read_dir(&dir).ok()?.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    runs.sort();
    runs.into_iter().rev().find(|run| {
        let read = |name: &str| -> Option<serde_json::Value> {
            serde_json::from_str(&std::fs::read_to_string(run.join(name)).ok()?).ok()
        };
        let (Some(version), Some(claimed)) = (read("version.json"), read("plan.json")) else { return false };
        version["hash"] == reference.hash.as_str() && claimed["hash"] == plan.hash.as_str() && accept(run)
    })
}
