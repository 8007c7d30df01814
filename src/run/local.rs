//! The local executor: the version's model server up on this machine (simulated,
//! external or a Docker container), the gym with the agent runtime against it, the
//! adaptive attacker after the plan, the server down. Records the spec and provenance;
//! a Docker server that dies is restarted once and the gym resumed; a server that fails
//! for good is not an error here — the run is recorded with `failed` facts, which R1
//! fails. Not here: the pipeline around it (`run`), the cluster's executor (`cluster`).

use std::sync::Arc;

use anyhow::{Context, bail};
use futures_util::future::BoxFuture;

use super::{Executor, Extent, RunRequest, Served, Session, early, silence};
use crate::concurrency::{self, Concurrency, ObservedCapacity};
use crate::container::{AcquireError, ServerFailure};
use crate::gym::{self, Executed, GymSettings};
use crate::{adaptive, model, provenance, runtime};
use pruefstand_agent as agent;
use pruefstand_core::plan::Plan;
use pruefstand_core::record::{ConcurrencyFacts, ModelServerFacts};
use pruefstand_core::settings::defence::{GuardrailSpec, PI_DETECTOR};
use pruefstand_core::{root, telemetry};
use pruefstand_gym::pyenv;
use pruefstand_store::{Claimed, RunDir, VersionFile};

/// Runs the cases here, against a model server this machine starts.
pub(crate) struct LocalGym;

impl Executor for LocalGym {
    fn execute<'a>(
        &'a self,
        session: &'a Session,
        request: &'a RunRequest,
        claimed: &'a Claimed,
    ) -> BoxFuture<'a, anyhow::Result<(Executed, Served)>> {
        Box::pin(
            Local { session, request, claimed, silence: silence::Silence::default(), told_start: Default::default() }
                .execute(),
        )
    }
}

/// One local execution's borrowed context.
struct Local<'a> {
    session: &'a Session,
    request: &'a RunRequest,
    claimed: &'a Claimed,
    /// Whether (and at which case) the run's cases stopped reaching the server.
    silence: silence::Silence,
    /// Whether the cases in flight to start at were said: once a run, not once for each
    /// of an attacker campaign's rounds.
    told_start: std::sync::atomic::AtomicBool,
}

impl Local<'_> {
    /// Up, the gym passes (and the adaptive attacker), down — each a step below.
    async fn execute(self) -> anyhow::Result<(Executed, Served)> {
        let (started_at, truth) = self.prepare().await?;
        let endpoint = match self.bring_up(&truth).await? {
            Ok(endpoint) => endpoint,
            Err(failure) => return self.never_up(&failure, started_at).await,
        };
        self.write_provenance(Some(&endpoint)).await;
        let image_digest = endpoint.container().map(|c| c.image.digest());
        let result = self.serve(&endpoint).await;
        let (executed, model_server, silent) = self.bring_down(endpoint, result).await?;
        // Cases left unstarted for a silent server are no early stop.
        let mut early_stop = None;
        if !silent {
            let (dir, planned) = (self.claimed.dir.clone(), self.request.plan.cases.len());
            let (recorded, not_started) = (executed.gym.records.len(), executed.gym.not_started);
            early_stop = runtime::blocking(move || early::settle(&dir, planned, recorded, not_started)).await?;
        }
        let concurrency = executed.gym.concurrency.clone();
        if let Some(facts) = &concurrency
            && !model_server.as_ref().is_some_and(|f| f.failed)
        {
            self.remember_capacity(facts).await;
        }
        let served =
            Served { image_digest, model_server, started_at, concurrency, gpu: None, shards: None, early_stop };
        Ok((executed, served))
    }

    /// The version's model server up: the endpoint, or why the server failed (an error
    /// of the bench itself, or a stop while it started, is this function's error).
    async fn bring_up(&self, truth: &std::path::Path) -> anyhow::Result<Result<model::Endpoint, ServerFailure>> {
        let (session, server, control) = (self.session, &self.request.server, &self.session.control);
        let run_dir = &self.claimed.dir;
        let run_id = root::run_id(run_dir.path());
        let job = format!("run-{}", std::process::id());
        let gym = control.gym.clone();
        let ctx = model::UpContext {
            pool: &session.pool,
            run_dir: run_dir.path(),
            job: &job,
            run_id: &run_id,
            interrupt_clients: Arc::new(move || gym.interrupt()),
        };
        let up = tokio::select! {
            up = model::up(server, truth, &ctx) => up,
            () = control.until_stopped(), if control.stop_abandons_start => {
                bail!("interrupted while the model server started (a container left behind is removed at the next start)")
            }
        };
        match up {
            Ok(endpoint) => Ok(Ok(endpoint)),
            Err(AcquireError::Bench(err)) => Err(err),
            Err(AcquireError::Server(failure)) => Ok(Err(failure)),
        }
    }

    /// A server that never came up is no error here: the run is recorded with `failed`
    /// facts (R1 fails it) and what it had finished before.
    async fn never_up(&self, failure: &ServerFailure, started_at: String) -> anyhow::Result<(Executed, Served)> {
        tracing::error!("{}: {failure}", self.request.version.name);
        let facts = ModelServerFacts {
            failed: true,
            events: vec![failure.message.clone()],
            log_tail: failure.log_tail.clone(),
            ..ModelServerFacts::default()
        };
        self.write_provenance(None).await;
        let executed = self.executed_so_far().await?;
        Ok((executed, Served { model_server: Some(facts), started_at, ..Served::default() }))
    }

    /// The gym passes against the endpoint — another after each restart of a server
    /// that died — then the adaptive attacker, which runs after the whole plan.
    async fn serve(&self, endpoint: &model::Endpoint) -> anyhow::Result<Executed> {
        let mut result = self.run_gym(endpoint).await;
        loop {
            match endpoint.after_gym().await {
                Ok(true) => result = self.run_gym(endpoint).await,
                Ok(false) => break,
                Err(err) => {
                    result = Err(err);
                    break;
                }
            }
        }
        // The campaign follows the whole plan, or a plan stopped early on purpose: an
        // early verdict ends the fixed cases, not the attacker (a version approved early
        // must still face it); a pass cut short otherwise leaves the run to its resume.
        let whole = result.as_ref().is_ok_and(|e| e.gym.not_started.unwrap_or(0) == 0) || self.stopped_early().await;
        if whole
            && self.request.plan.adaptive.is_some()
            && !self.session.control.is_stopped()
            && let Err(err) = self.run_adaptive(endpoint).await
        {
            result = Err(err);
        }
        result
    }

    /// The server down, and what the run executed: the gym's result, or — when the
    /// server died for good — what exists, judged as it is. Also whether an external
    /// server fell silent (the run then ends invalid with what it finished).
    async fn bring_down(
        &self,
        endpoint: model::Endpoint,
        result: anyhow::Result<Executed>,
    ) -> anyhow::Result<(Executed, Option<ModelServerFacts>, bool)> {
        let silent_at = self.silence.noticed_at().filter(|_| !endpoint.is_restartable());
        let url = endpoint.base_url.clone();
        let mut model_server = endpoint.down(&self.session.pool).await?;
        if let Some(case_id) = &silent_at {
            // An external server: nothing here can bring it back, so the run ends
            // invalid with what it finished (resumable with --out once it answers).
            let message = silence::Silence::message(&url.redacted(), case_id);
            tracing::error!("{message}");
            model_server =
                Some(ModelServerFacts { failed: true, events: vec![message], ..ModelServerFacts::default() });
        }
        if self.session.control.is_stopped() {
            bail!(
                "interrupted: the gym and the model server are stopped; finished cases are kept in {}",
                self.claimed.dir.path().display()
            );
        }
        let failed = model_server.as_ref().is_some_and(|f| f.failed);
        let executed = match result {
            Ok(executed) => executed,
            // The gym was stopped because the server died for good: judge what exists.
            Err(err) if failed => {
                tracing::info!("gym ended with the model server: {err:#}");
                self.executed_so_far().await?
            }
            Err(err) => return Err(err),
        };
        Ok((executed, model_server, silent_at.is_some()))
    }

    /// What the run starts from, read and written on the blocking pool: when it began
    /// (a resumed run keeps its first start), `version.json`, and the ground truth's
    /// file (a gym subcommand's answer, cached).
    async fn prepare(&self) -> anyhow::Result<(String, std::path::PathBuf)> {
        let (run_dir, version) = (self.claimed.dir.clone(), self.request.version.clone());
        let (pyenv, benchmark_version) = (self.session.pyenv.clone(), self.request.plan.benchmark_version.clone());
        runtime::blocking(move || {
            let started_at = run_dir
                .read_run_meta()
                .ok()
                .and_then(|meta| meta.started_at)
                .unwrap_or_else(|| chrono::Utc::now().to_rfc3339());
            run_dir.write_version(&VersionFile::new(&version)?)?;
            let truth = pyenv::truth_file(&pyenv, &benchmark_version)?;
            Ok((started_at, truth))
        })
        .await
    }

    /// [`executed_from_run_dir`] on the blocking pool.
    async fn executed_so_far(&self) -> anyhow::Result<Executed> {
        let (run_dir, plan) = (self.claimed.dir.clone(), self.request.plan.clone());
        runtime::blocking(move || executed_from_run_dir(&run_dir, &plan)).await
    }

    /// One gym pass, with early stop's order and sink when the plan and extent ask for it.
    async fn run_gym(&self, endpoint: &model::Endpoint) -> anyhow::Result<Executed> {
        let request = self.request;
        let mut settings = self.gym_settings(endpoint).await?;
        settings.sinks.push(self.silence.sink(endpoint.silence_hook()));
        if request.extent == Extent::Plan && request.plan.profile.early_stop {
            // Reads both runs' records and writes early_stop.json: on the blocking pool.
            let (dir, watched, seed, root) =
                (self.claimed.dir.clone(), request.clone(), settings.seed, self.session.root.clone());
            let (order, sink) = runtime::blocking(move || early::watch(&dir, &watched, seed, &root)).await?;
            settings.order = Some(order);
            settings.sinks.push(sink);
        }
        settings.frame = self.campaign_frame(0);
        gym::execute(&self.session.pyenv, &self.claimed.dir, &request.plan, &request.inventory, settings).await
    }

    /// Whether the early stop decided and stopped the plan's pass.
    async fn stopped_early(&self) -> bool {
        let dir = self.claimed.dir.clone();
        runtime::blocking(move || dir.read_early_stop()).await.ok().flatten().is_some_and(|e| e.stopped_early)
    }

    /// With an attacker campaign, the daemon's status and ETA count plan and campaign as
    /// one run: the plan's cases, then at most the campaign's budget.
    fn campaign_frame(&self, done_before: usize) -> Option<gym::Frame> {
        let plan = &self.request.plan;
        let budget = adaptive::budget(plan.adaptive.as_ref()?);
        Some(gym::Frame {
            run_dir: self.claimed.dir.path().to_path_buf(),
            done_before,
            total: plan.cases.len() + budget,
        })
    }

    /// The adaptive attacker's rounds (`adaptive::search`), and its transfer round.
    async fn run_adaptive(&self, endpoint: &model::Endpoint) -> anyhow::Result<()> {
        let request = self.request;
        let Some(adaptive) = request.plan.adaptive.as_ref() else { return Ok(()) };
        let mut settings = self.gym_settings(endpoint).await?;
        settings.frame = self.campaign_frame(request.plan.cases.len());
        let pyenv = self.session.pyenv.clone();
        let benchmark_version = request.plan.benchmark_version.clone();
        let goals = runtime::blocking(move || {
            let path = pruefstand_gym::pyenv::truth_file(&pyenv, &benchmark_version)?;
            adaptive::goals::Goals::load(&path)
        })
        .await?;
        // Resolved with the request: the URL parsed with the plan, the key read then.
        let Some(attacker) = request.attacker() else {
            bail!("a plan with [adaptive] resolved with no attacker (a bug)")
        };
        let (proposer, attacker_url) = attacker.proposer((&endpoint.base_url, endpoint.api_key.as_deref()))?;
        let search = adaptive::Search {
            pyenv: &self.session.pyenv,
            run_dir: &self.claimed.dir,
            plan: &request.plan,
            adaptive,
            inventory: &request.inventory,
            seed: self.claimed.seed,
            goals: &goals,
            proposer,
            attacker_url,
        };
        // A stop must not wait for an attacker request (up to ten minutes each): the
        // log is written whenever an attempt is proposed or recorded, so a resume loses
        // only the proposals still being asked for.
        let log = tokio::select! {
            log = adaptive::search(&search, settings) => log?,
            () = self.session.control.until_stopped() => bail!(
                "interrupted during the adaptive attacker's campaign; finished rounds are kept in {}",
                self.claimed.dir.path().display()
            ),
        };
        self.write_found_family(&log).await?;
        let ((broken, pairs), (transferred, held_out)) = (log.broken(), log.transfer());
        tracing::info!(
            "adaptive attacker: {broken} of {pairs} search pairs broken within {} attempts; frozen attempts broke {transferred} of {held_out} held-out pairs",
            adaptive.attempts
        );
        Ok(())
    }

    /// `found-family.json`: the frozen templates an attacker model wrote, as a family a
    /// plan can name; its path and sha256 logged for the plan's `[[found]]`.
    async fn write_found_family(&self, log: &pruefstand_core::record::SearchLog) -> anyhow::Result<()> {
        let Some(found) = adaptive::found_family(log, &self.request.version.name, &self.claimed.dir) else {
            return Ok(());
        };
        let dir = self.claimed.dir.clone();
        let (path, sha256) = runtime::blocking(move || {
            dir.write(&found)?;
            let path = std::path::PathBuf::from(dir.shown(pruefstand_store::RunFile::FoundFamily));
            let sha256 = pruefstand_core::util::sha256_hex(&std::fs::read(&path)?);
            Ok::<_, anyhow::Error>((path, sha256))
        })
        .await?;
        tracing::info!(
            "adaptive attacker: found family {} (sha256 {sha256}): name it in a plan's [[found]]",
            path.display()
        );
        Ok(())
    }

    /// `provenance.json`, collected on the blocking pool (git, NVML, the model files'
    /// hashes); a failure is a warning, not the run's end.
    async fn write_provenance(&self, endpoint: Option<&model::Endpoint>) {
        let (request, run_dir) = (self.request, self.claimed.dir.clone());
        let server = &request.server;
        let (model_dir, adapter_dir) = match endpoint.and_then(|e| e.container_dirs()) {
            Some((model, adapter)) => (Some(model), adapter),
            None => (server.model.path.clone(), server.adapter.as_ref().and_then(|a| a.path.clone())),
        };
        let inputs = provenance::Inputs {
            server: server.clone(),
            plan_name: request.plan.name.clone(),
            plan_hash: request.plan.hash.clone(),
            benchmark_version: request.plan.benchmark_version.clone(),
            agentdojo_version: request.inventory.agentdojo_version.clone(),
            container: endpoint.and_then(|e| e.container()).cloned(),
            model_dir,
            adapter_dir,
            identity_key: match self.session.root.identity_key() {
                Ok(key) => key,
                Err(err) => {
                    // Without the key no identity can be given safely; the rest still is.
                    tracing::warn!("provenance.json not written: {err:#}");
                    return;
                }
            },
        };
        if let Err(err) = runtime::blocking(move || provenance::write(&run_dir, &inputs)).await {
            tracing::warn!("provenance.json not written: {err:#}");
        }
    }

    /// How the gym runs this version's cases. The agent it spawns: the version's own
    /// `agent_cmd`, or `pruefstand agent` configured from the spec. The API key travels
    /// by environment only.
    async fn gym_settings(&self, endpoint: &model::Endpoint) -> anyhow::Result<GymSettings> {
        let (request, run_dir) = (self.request, &self.claimed.dir);
        let (setup, guardrail) = (&request.agent, &request.defence.guardrail);
        let mut agent_env = vec![
            ("PRUEFSTAND_MODEL_URL".to_string(), endpoint.base_url.expose().to_string()),
            ("PRUEFSTAND_MODEL_NAME".to_string(), setup.model.clone()),
        ];
        if let Some(key) = &endpoint.api_key {
            agent_env.push(("PRUEFSTAND_API_KEY".to_string(), key.clone()));
        }
        // agent.json shows the http guardrail's URL redacted: one with credentials
        // travels by environment, as the model's does.
        let guardrail_url = match guardrail {
            GuardrailSpec::Http { url, .. } if url.has_secrets() => {
                Some((agent::GUARDRAIL_URL_ENV.to_string(), url.expose().to_string()))
            }
            _ => None,
        };
        agent_env.extend(guardrail_url.clone());
        let agent_cmd = match &setup.agent_cmd {
            Some(argv) => argv.clone(),
            None => {
                let config = agent::AgentConfig {
                    // agent.json is a file of the run: credentials stay in the environment.
                    base_url: endpoint.base_url.redacted(),
                    base_url_env: endpoint.base_url.has_secrets().then(|| "PRUEFSTAND_MODEL_URL".to_string()),
                    model: setup.model.clone(),
                    tool_calling: setup.tool_calling,
                    tool_result_role: setup.tool_result_role,
                    // Written out, so agent.json shows the bound every turn had.
                    max_tokens: Some(setup.max_tokens),
                    idle_timeout_s: setup.idle_timeout_s,
                    guardrail: guardrail.clone(),
                    guardrail_url_env: guardrail_url.as_ref().map(|(var, _)| var.clone()),
                    human: request.defence.human.clone(),
                    ..agent::AgentConfig::default()
                };
                let path = run_dir.agent_config_path();
                let written = run_dir.clone();
                runtime::blocking(move || written.write(&config)).await?;
                let exe = std::env::current_exe().context("finding the pruefstand binary for the agent")?;
                vec![exe.display().to_string(), "agent".into(), "--config".into(), path.display().to_string()]
            }
        };
        let (defence, detector) = match guardrail {
            GuardrailSpec::Agentdojo { defence, .. } => (Some(defence.as_str().to_string()), None),
            GuardrailSpec::Classifier(c) => {
                let (detector, url_env) = gym::DetectorRequest::of(c, &endpoint.base_url);
                agent_env.extend(url_env);
                (Some(PI_DETECTOR.to_string()), Some(detector))
            }
            _ => (None, None),
        };
        Ok(GymSettings {
            agent_cmd,
            concurrency: self.concurrency().await,
            metrics_url: concurrency::metrics_url(endpoint.base_url.expose()),
            display_name: setup.display_name.clone(),
            case_timeout_s: request.plan.case_timeout_s,
            seed: self.claimed.seed,
            defence,
            detector,
            agent_env,
            control: Some(self.session.control.gym.clone()),
            order: None,
            sinks: Vec::new(),
            wording: Default::default(),
            templates: Default::default(),
            frame: None,
        })
    }

    /// `--jobs N` holds N cases in flight; without it the server steers, starting where
    /// the last run of the same served model settled (else at the plan's `jobs`).
    async fn concurrency(&self) -> Concurrency {
        let (root, request) = (&self.session.root, self.request);
        if let Some(jobs) = request.jobs {
            return Concurrency::Fixed(jobs);
        }
        let ceiling = root.config.run.max_in_flight;
        let served = request.version.request_model();
        let (state, model) = (root.state(), served.to_string());
        let stored = runtime::blocking(move || concurrency::load_capacity(&state, &model)).await;
        let start = stored.as_ref().map_or(request.plan.jobs, |c| c.settled).clamp(1, ceiling);
        if let Some(stored) = stored {
            let line = format!("{served}: starting at {start} cases in flight (run {})", stored.run_id);
            if self.told_start.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::debug!("{line}");
            } else {
                tracing::info!("{line}");
            }
        }
        Concurrency::Auto { start, ceiling }
    }

    /// Remembers where a server-steered run settled, for the next run of that model.
    async fn remember_capacity(&self, facts: &ConcurrencyFacts) {
        if facts.mode == pruefstand_core::record::ConcurrencyMode::Fixed {
            return;
        }
        let observed = ObservedCapacity {
            served_model: self.request.version.request_model().to_string(),
            settled: facts.settled,
            peak_running: facts.peak_running,
            peak_waiting: facts.peak_waiting,
            run_id: root::run_id(self.claimed.dir.path()),
            updated_at: chrono::Utc::now().to_rfc3339(),
        };
        let state = self.session.root.state();
        if let Err(err) = runtime::blocking(move || concurrency::store_capacity(&state, &observed)).await {
            tracing::warn!("observed capacity not stored: {err:#}");
        }
    }
}

/// The run's records as they stand (a run cut short, or merged from shards): what
/// `judge` needs to say why.
pub(crate) fn executed_from_run_dir(run_dir: &RunDir, plan: &Plan) -> anyhow::Result<Executed> {
    run_dir.ensure_cases()?;
    let stored = run_dir.read_cases_lenient()?;
    let records: Vec<_> = plan.cases.iter().filter_map(|c| stored.records.get(&c.id).cloned()).collect();
    let telemetry = telemetry::compute(&plan.benchmark_version, plan.cases.len(), &records);
    run_dir.write(&telemetry)?;
    let gym = gym::GymOutcome { records, skipped: 0, rerun: Vec::new(), concurrency: None, not_started: None };
    Ok(Executed { gym, telemetry })
}
