//! One run of a version on a plan, end to end: the reference first when R4 needs it,
//! the model up, the gym with the agent runtime, the run's records (`version.json`,
//! `run.json`, `thresholds.json`), the judgement and reports, the model down.
//!
//! Shared by `pruefstand run` and (later) the daemon, so a queued job and a typed
//! command take the same path. Argument parsing and printing are `cmd::run`'s.
//! Docker versions: checked first (`container::preflight`), orphans of dead runs
//! removed, containers taken from a `container::Pool` (fresh per `run`; the daemon
//! keeps one across jobs via `run_in`), a dead server restarted once and the gym
//! resumed; `provenance.json` is written for every backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};

use crate::cmd::gym::{Executed, GymSettings, execute};
use crate::container::{self, Pool};
use crate::defence::GuardrailSpec;
use crate::gym::{self, Inventory};
use crate::judge::ModelServerFacts;
use crate::judge::{GpuExclusivity, Judgement, RunMeta};
use crate::plan::{Filters, Plan, Profile};
use crate::pyenv::PyEnv;
use crate::root::{self, Root};
use crate::rundir::RunDir;
use crate::spec::{Backend, Version};
use crate::{agent, judge, model, provenance, telemetry, util};

pub struct RunRequest<'a> {
    pub version: &'a Version,
    /// `schnell`, `voll` or a plan file.
    pub plan: &'a str,
    pub jobs: Option<usize>,
    /// The run directory itself (resumed when it holds the same plan).
    pub out: Option<PathBuf>,
    /// The daemon's handle on the run; `None` for a plain `run`.
    pub control: Option<&'a RunControl>,
}

/// What the daemon hooks into a run: the gym's stop switch and progress sink, and the
/// GPU guard's observation of exclusivity, read when each run is recorded (R1).
#[derive(Default)]
pub struct RunControl {
    pub gym: std::sync::Arc<gym::Control>,
    pub gpu: Option<Box<dyn Fn() -> GpuExclusivity + Send + Sync>>,
}

impl RunControl {
    fn gpu(control: Option<&RunControl>) -> GpuExclusivity {
        control.and_then(|c| c.gpu.as_ref()).map_or(GpuExclusivity::NotObserved, |observe| observe())
    }
}

pub struct Finished {
    pub run_dir: RunDir,
    pub executed: Executed,
    pub judgement: Judgement,
    /// The reference run compared with, and whether it was made for this run.
    pub reference: Option<(PathBuf, bool)>,
}

/// `run` with a fresh container pool, shut down at the end. Before anything runs:
/// docker versions (this one and its reference) are preflighted, and containers of
/// dead owners (a `kill -9`'d run) are removed and reported.
pub fn run(root: &Root, pyenv: &PyEnv, request: RunRequest) -> anyhow::Result<Finished> {
    let pool = Pool::new(pyenv.cache.join("container"));
    let result = run_with_pool(root, pyenv, request, &pool);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let shutdown = runtime.block_on(pool.shutdown());
    let finished = result?;
    shutdown?;
    Ok(finished)
}

/// Like [`run`] with a pool the caller keeps (the daemon: warm containers across
/// jobs): for Docker versions, orphaned containers are removed and the inputs checked
/// (image present, model and adapter folders) before anything starts.
pub fn run_with_pool(root: &Root, pyenv: &PyEnv, request: RunRequest, pool: &Pool) -> anyhow::Result<Finished> {
    let mut versions = vec![request.version.clone()];
    if let Some(name) = request.version.reference() {
        versions.push(Version::load(&root.versions(), name)?);
    }
    if versions.iter().any(|v| *v.spec.model.backend.get_ref() == Backend::Docker) {
        // Inputs first (a missing plan is named before the environment is checked).
        Profile::load(&Profile::locate(&root.path, request.plan))?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            let docker = pool.docker().await?;
            for orphan in container::remove_orphans(docker).await? {
                eprintln!("{orphan}");
            }
            for v in &versions {
                container::preflight_with(docker, v).await?;
            }
            anyhow::Ok(())
        })?;
    }
    run_in(root, pyenv, request, pool)
}

pub fn run_in(root: &Root, pyenv: &PyEnv, request: RunRequest, pool: &Pool) -> anyhow::Result<Finished> {
    let version = request.version;
    let plan_path = Profile::locate(&root.path, request.plan);
    let (profile, _) = Profile::load(&plan_path)?;
    let inventory = Inventory::load(pyenv, profile.benchmark_version.get_ref())?;
    let plan = Plan::resolve(&plan_path, &inventory, &Filters::default())?;

    // R4 compares with the reference on the same plan: make sure its run exists first.
    let reference = match version.reference() {
        Some(name) => {
            let reference_version = Version::load(&root.versions(), name)?;
            Some(reference_run(
                root,
                pyenv,
                &reference_version,
                &plan,
                &inventory,
                request.jobs,
                request.control,
                pool,
            )?)
        }
        None => None,
    };

    let run_dir = RunDir::new(request.out.clone().unwrap_or_else(|| root.new_run_dir(&version.name, &plan.name)));
    let (executed, served) =
        execute_version(pyenv, &run_dir, version, &plan, &inventory, request.jobs, request.control, pool)?;
    let reference_dir = reference.as_ref().map(|(dir, _)| dir.clone());
    let gpu = RunControl::gpu(request.control);
    let judgement = record_and_judge(root, &run_dir, version, &plan, &inventory, reference_dir, gpu, served)?;
    Ok(Finished { run_dir, executed, judgement, reference })
}

/// Writes what `judge` reads back (`run.json`, `thresholds.json`), then judges and
/// writes the reports — the same path `pruefstand judge` takes later.
#[allow(clippy::too_many_arguments)]
fn record_and_judge(
    root: &Root,
    run_dir: &RunDir,
    version: &Version,
    plan: &Plan,
    inventory: &Inventory,
    reference_run_dir: Option<PathBuf>,
    gpu: GpuExclusivity,
    served: Served,
) -> anyhow::Result<Judgement> {
    let meta = RunMeta {
        run_id: root::run_id(&run_dir.path),
        version: version.name.clone(),
        plan: plan.name.clone(),
        plan_hash: plan.hash.clone(),
        planned_case_ids: plan.cases.iter().map(|c| c.id.clone()).collect(),
        benchmark_version: plan.benchmark_version.clone(),
        agentdojo_version: Some(inventory.agentdojo_version.clone()),
        image_digest: served.image_digest,
        // The GPU guard (daemon) observes exclusivity; a plain `run` does not.
        gpu,
        reference_run_dir,
        started_at: Some(served.started_at.clone()),
        model_server: served.model_server,
    };
    util::write_json_atomic(&run_dir.file("run.json"), &meta)?;
    util::write_json_atomic(&run_dir.file("thresholds.json"), &plan.profile.rules)?;
    Ok(judge::rejudge(&run_dir.path, None, None, Some(&root.reports()))?.0)
}

/// What the model server contributes to the run's record.
#[derive(Default)]
struct Served {
    image_digest: Option<String>,
    model_server: Option<ModelServerFacts>,
    /// When the run began (a resumed run keeps its first start).
    started_at: String,
}

/// Runs the version's cases into `run_dir` with its model up, and records the spec and
/// provenance. A docker server that dies is restarted once and the gym resumed; a
/// server that fails for good (never ready, or a second death) is not an error here:
/// the run is recorded with what it has and `failed` facts, which R1 fails.
#[allow(clippy::too_many_arguments)]
fn execute_version(
    pyenv: &PyEnv,
    run_dir: &RunDir,
    version: &Version,
    plan: &Plan,
    inventory: &Inventory,
    jobs: Option<usize>,
    control: Option<&RunControl>,
    pool: &Pool,
) -> anyhow::Result<(Executed, Served)> {
    run_dir.create()?;
    let started_at = judge::read_run_meta(&run_dir.path)
        .ok()
        .and_then(|meta| meta.started_at)
        .unwrap_or_else(|| chrono::Utc::now().to_rfc3339());
    util::write_json_atomic(
        &run_dir.file("version.json"),
        &serde_json::json!({ "name": version.name, "source": version.path, "hash": version.hash, "spec": version.spec }),
    )?;
    let truth = gym::truth_file(pyenv, &plan.benchmark_version)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let run_id = root::run_id(&run_dir.path);
    let job = format!("run-{}", std::process::id());
    // Always a gym control, so a dying model server can stop the gym it serves.
    let gym_control = control.map_or_else(|| Arc::new(gym::Control::new()), |c| c.gym.clone());
    runtime.block_on(async {
        // A plain `run` stops cleanly on Ctrl-C/SIGTERM: the gym is killed, the model
        // server stopped and removed, every finished case kept for `--out` to resume.
        // (The daemon handles its signals itself.)
        let (interrupt, mut interrupted) = tokio::sync::watch::channel(false);
        let signals = control.is_none().then(|| {
            let gym = gym_control.clone();
            tokio::spawn(async move {
                let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else { return };
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
                gym.stop();
                let _ = interrupt.send(true);
            })
        });
        let ctx = model::UpContext { pool, run_dir: &run_dir.path, job: &job, run_id: &run_id, gym: &gym_control };
        let up = tokio::select! {
            up = model::up(version, &truth, &ctx) => up,
            _ = interrupted.wait_for(|stop| *stop), if signals.is_some() => {
                bail!("interrupted while the model server started (a container left behind is removed at the next start)")
            }
        };
        let endpoint = match up {
            Ok(endpoint) => endpoint,
            Err(err) => {
                let Some(failure) = err.downcast_ref::<container::ServerFailure>() else { return Err(err) };
                eprintln!("error: {}: {failure}", version.name);
                let facts = ModelServerFacts {
                    failed: true,
                    events: vec![failure.message.clone()],
                    log_tail: failure.log_tail.clone(),
                    ..ModelServerFacts::default()
                };
                write_provenance(run_dir, version, plan, inventory, None);
                let executed = executed_from_run_dir(run_dir, plan)?;
                return Ok((executed, Served { image_digest: None, model_server: Some(facts), started_at }));
            }
        };
        write_provenance(run_dir, version, plan, inventory, Some(&endpoint));
        let image_digest = endpoint.container().map(|c| c.image.digest());
        let mut result = run_gym(pyenv, run_dir, version, plan, inventory, jobs, &gym_control, &endpoint).await;
        loop {
            match endpoint.after_gym().await {
                Ok(true) => result = run_gym(pyenv, run_dir, version, plan, inventory, jobs, &gym_control, &endpoint).await,
                Ok(false) => break,
                Err(err) => {
                    result = Err(err);
                    break;
                }
            }
        }
        let model_server = endpoint.down(pool).await?;
        if let Some(signals) = signals {
            signals.abort();
        }
        if *interrupted.borrow() {
            pool.shutdown().await?;
            bail!("interrupted: the gym and the model server are stopped; finished cases are kept in {} (resume with --out)", run_dir.path.display());
        }
        let failed = model_server.as_ref().is_some_and(|f| f.failed);
        let executed = match result {
            Ok(executed) => executed,
            // The gym was stopped because the server died for good: judge what exists.
            Err(err) if failed => {
                tracing::info!("gym ended with the model server: {err:#}");
                executed_from_run_dir(run_dir, plan)?
            }
            Err(err) => return Err(err),
        };
        Ok((executed, Served { image_digest, model_server, started_at }))
    })
}

#[allow(clippy::too_many_arguments)]
async fn run_gym(
    pyenv: &PyEnv,
    run_dir: &RunDir,
    version: &Version,
    plan: &Plan,
    inventory: &Inventory,
    jobs: Option<usize>,
    gym_control: &Arc<gym::Control>,
    endpoint: &model::Endpoint,
) -> anyhow::Result<Executed> {
    let mut settings = agent_settings(run_dir, version, plan, jobs, endpoint)?;
    settings.control = Some(gym_control.clone());
    let (pyenv, run_dir, plan, inventory) =
        (pyenv.clone(), RunDir::new(run_dir.path.clone()), plan.clone(), inventory.clone());
    tokio::task::spawn_blocking(move || execute(&pyenv, &run_dir, &plan, &inventory, settings))
        .await
        .context("the gym's thread")?
}

/// The run's records as they stand (a run cut short): what `judge` needs to say why.
fn executed_from_run_dir(run_dir: &RunDir, plan: &Plan) -> anyhow::Result<Executed> {
    if !run_dir.cases_file().exists() {
        util::write_atomic(&run_dir.cases_file(), b"")?;
    }
    let stored = run_dir.read_cases_lenient()?;
    let records: Vec<_> = plan.cases.iter().filter_map(|c| stored.records.get(&c.id).cloned()).collect();
    let telemetry = telemetry::compute(&plan.benchmark_version, plan.cases.len(), &records);
    util::write_json_atomic(&run_dir.file("telemetry.json"), &telemetry)?;
    let gym = gym::GymOutcome { records, environment_checks: Vec::new(), skipped: 0, rerun: Vec::new() };
    Ok(Executed { gym, telemetry })
}

/// `provenance.json`; failing to collect it is a warning, never a failed run.
fn write_provenance(
    run_dir: &RunDir,
    version: &Version,
    plan: &Plan,
    inventory: &Inventory,
    endpoint: Option<&model::Endpoint>,
) {
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
        eprintln!("warning: provenance.json not written: {err:#}");
    }
}

/// The agent the gym spawns: the version's own `agent_cmd`, or `pruefstand agent`
/// configured from the spec. The API key travels by environment only.
fn agent_settings(
    run_dir: &RunDir,
    version: &Version,
    plan: &Plan,
    jobs: Option<usize>,
    endpoint: &model::Endpoint,
) -> anyhow::Result<GymSettings> {
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
        jobs: jobs.unwrap_or(plan.jobs),
        display_name: spec.model.display_name.clone(),
        case_timeout_s: plan.case_timeout_s,
        // Secrets of the counter suite's payloads: fixed per run directory, so a resumed
        // run sees the same ones.
        seed: u64::from_str_radix(&util::sha256_hex(run_dir.path.to_string_lossy().as_bytes())[..12], 16).unwrap_or(0),
        defence,
        agent_env,
        control: None,
    })
}

/// The reference's run on this plan: reused when one exists for the same spec hash,
/// plan hash and agentdojo version with every case recorded; else run now.
#[allow(clippy::too_many_arguments)]
fn reference_run(
    root: &Root,
    pyenv: &PyEnv,
    reference: &Version,
    plan: &Plan,
    inventory: &Inventory,
    jobs: Option<usize>,
    control: Option<&RunControl>,
    pool: &Pool,
) -> anyhow::Result<(PathBuf, bool)> {
    if let Some(dir) = find_reference_run(&root.reports(), reference, plan, inventory) {
        eprintln!("reference: reusing {}'s run {} (same spec, plan and agentdojo)", reference.name, dir.display());
        return Ok((dir, false));
    }
    eprintln!("reference: no current run of {} on plan {} — running it first", reference.name, plan.name);
    // A reference run cut short (daemon killed, job interrupted) is resumed, so none of
    // its finished cases runs twice.
    let unfinished = newest_run(&root.reports(), reference, plan, |run| !complete(run, plan));
    let run_dir = RunDir::new(unfinished.unwrap_or_else(|| root.new_run_dir(&reference.name, &plan.name)));
    let (executed, served) = execute_version(pyenv, &run_dir, reference, plan, inventory, jobs, control, pool)?;
    let failed = served.model_server.as_ref().is_some_and(|f| f.failed);
    if !failed && executed.gym.records.len() != plan.cases.len() {
        bail!("the reference run {} is incomplete", run_dir.path.display());
    }
    record_and_judge(root, &run_dir, reference, plan, inventory, None, RunControl::gpu(control), served)?;
    if failed {
        bail!("the reference run {} is invalid: its model server failed (see its report)", run_dir.path.display());
    }
    Ok((run_dir.path, true))
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
