//! Keeps model containers across jobs and watches them during one.
//!
//! `Pool::acquire` hands out a ready server for a version: the warm container when its
//! key matches (same image, model, arguments), loading the version's adapter at run time
//! when the spec allows it (`runtime_lora`, vLLM's `POST /v1/load_lora_adapter`), else a
//! fresh container (the warm one is stopped first: one model on the GPU at a time).
//! `Pool::release` saves the job's part of the container log into the run directory and
//! keeps the container warm; `Pool::shutdown` stops it. `pruefstand run` uses a fresh
//! pool per command; the daemon keeps one across jobs.
//!
//! While a lease is out a watch checks the server every second. A death (container
//! exited, `/health` failing three times in a row, or the run's cases no longer
//! connecting: `run::silence`) stops the gym, restarts the
//! container once on the same port, and `Lease::after_gym` tells the run to resume the
//! gym (cases that failed because of the death are dropped first). A second death, or a
//! restart that does not come up, ends the run: `facts().failed`, which R1 fails.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use bollard::Docker;
use bollard::models::ContainerCreateBody;

use super::{
    AcquireError, ImageInfo, LABEL_JOB, LABEL_RUN, LABEL_VERSION, STOP_GRACE_S, ServerFailure, ServerSetup, Setup,
    container_name, create, ensure_image, free_port, healthy, is_not_found, log_tail, logs, stop_and_remove,
    wait_ready,
};
use pruefstand_core::record::ModelServerFacts;
use pruefstand_core::spec::redact;
use pruefstand_core::util;
use pruefstand_store::RunDir;

/// What a job asks the pool for.
pub(crate) struct Request<'a> {
    pub(crate) server: &'a ServerSetup,
    /// The gym's ground truth: goes into the simulated model's generated model folder.
    pub(crate) truth_file: &'a Path,
    /// Gets `container.log` (and generated files when needed).
    pub(crate) run_dir: &'a Path,
    /// Labels: the daemon's job id (`run` uses `run-<pid>`) and the run's id.
    pub(crate) job: &'a str,
    pub(crate) run_id: &'a str,
    /// Stops the server's clients (the gym) when the server dies, so the run stops
    /// instead of failing every remaining case, and resumes after the restart.
    pub(crate) interrupt_clients: InterruptClients,
}

/// Stops whatever talks to the server (the gym); true when something was running.
pub(crate) type InterruptClients = Arc<dyn Fn() -> bool + Send + Sync>;

/// A created container and how to reach it.
#[derive(Clone, Debug)]
pub(crate) struct Container {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) host_port: u16,
    pub(crate) api_key: String,
    pub(crate) key: String,
    /// What the server says it is (`GET /version`: vLLM's version), once it served.
    pub(crate) server_version: Option<String>,
    pub(crate) image: ImageInfo,
    /// The exact command (API key redacted; it is in the environment anyway).
    pub(crate) command: Vec<String>,
    /// Served names: the base model and every adapter loaded so far.
    pub(crate) served: Vec<String>,
    /// In-container paths of adapters loaded at run time (reloaded after a restart).
    loaded_paths: HashMap<String, String>,
    setup: Setup,
    body: ContainerCreateBody,
}

pub(crate) struct Pool {
    /// Generated model folders for the simulated model's image live here.
    work_dir: PathBuf,
    docker: tokio::sync::OnceCell<Docker>,
    warm: tokio::sync::Mutex<Option<Container>>,
    created: AtomicUsize,
}

impl Pool {
    /// No Docker connection yet: a pool for sim-only runs never talks to Docker.
    pub(crate) fn new(work_dir: impl Into<PathBuf>) -> Pool {
        Pool {
            work_dir: work_dir.into(),
            docker: tokio::sync::OnceCell::new(),
            warm: tokio::sync::Mutex::new(None),
            created: AtomicUsize::new(0),
        }
    }

    pub(crate) async fn docker(&self) -> anyhow::Result<&Docker> {
        self.docker.get_or_try_init(super::connect).await
    }

    /// A ready server for the version (docker backend): warm or fresh. A server that
    /// does not come up is removed, its log saved, and the error is
    /// [`AcquireError::Server`].
    pub(crate) async fn acquire(&self, req: &Request<'_>) -> Result<Lease, AcquireError> {
        let docker = self.docker().await?.clone();
        let setup = self.setup_for(req).await?;
        let image = ensure_image(&docker, &setup.image, setup.pull)
            .await
            .with_context(|| req.server.spec_file.display().to_string())?;
        let key = setup.key();
        let since = chrono::Utc::now().timestamp();
        let mut warm = self.warm.lock().await;
        if let Some(mut c) = warm.take() {
            let http = http();
            let fit = c.key == key
                && c.image.id == image.id
                && healthy(&docker, &http, &c.id, c.host_port).await.unwrap_or(false);
            if fit && self.take_adapter(&docker, &mut c, &setup).await? {
                tracing::info!("model container {} reused (warm)", c.name);
                return Ok(Lease::start(docker, c, req.run_dir, since, &setup, req.interrupt_clients.clone()));
            }
            tracing::info!("model container {}: stopping (the next job needs another server)", c.name);
            stop_and_remove(&docker, &c.id).await?;
        }
        drop(warm);

        let api_key = util::new_api_key();
        let host_port = free_port()?;
        let name = container_name(&req.server.name);
        let labels = HashMap::from([
            (LABEL_JOB.to_string(), req.job.to_string()),
            (LABEL_RUN.to_string(), req.run_id.to_string()),
            (LABEL_VERSION.to_string(), req.server.name.clone()),
        ]);
        let body = setup.body(&api_key, host_port, labels);
        let id = create(&docker, &name, body.clone()).await?;
        self.created.fetch_add(1, Ordering::Relaxed);
        let mut served = vec![setup.served_name.clone()];
        served.extend(setup.adapter.iter().map(|a| a.name.clone()));
        let mut c = Container {
            id,
            name,
            host_port,
            api_key,
            key,
            image,
            server_version: None,
            command: redact(&setup.command()),
            served,
            loaded_paths: HashMap::new(),
            setup: setup.clone(),
            body,
        };
        tracing::info!("model container {} ({}) starting on 127.0.0.1:{}", c.name, c.image.name, c.host_port);
        let up = match docker.start_container(&c.id, None::<bollard::query_parameters::StartContainerOptions>).await {
            Ok(()) => {
                wait_ready(&docker, &c.id, c.host_port, &c.api_key, &names(&c.served), c.setup.ready_timeout).await
            }
            Err(e) => Err(ServerFailure { message: format!("starting container {}: {e}", c.name), log_tail: vec![] }),
        };
        if let Err(failure) = up {
            save_log(&docker, &c.id, req.run_dir, 0).await;
            stop_and_remove(&docker, &c.id).await?;
            return Err(failure.into());
        }
        c.server_version = server_version(&http(), c.host_port, &c.api_key).await;
        Ok(Lease::start(docker, c, req.run_dir, since, &setup, req.interrupt_clients.clone()))
    }

    /// Makes the warm container serve the setup's adapter; false when it cannot (then a
    /// fresh one is started with it). An adapter the server refuses as not found is
    /// the version's error, not a reason to restart: a cold start would fail alike.
    async fn take_adapter(&self, docker: &Docker, c: &mut Container, setup: &Setup) -> anyhow::Result<bool> {
        let Some(a) = &setup.adapter else { return Ok(true) };
        match adapter_fit(c.serving_path(&a.name), &a.container_path, setup.runtime_lora) {
            AdapterFit::Served => return Ok(true),
            AdapterFit::Restart => return Ok(false),
            AdapterFit::Load => {}
        }
        let url = format!("http://127.0.0.1:{}/v1/load_lora_adapter", c.host_port);
        let body = serde_json::json!({"lora_name": a.name, "lora_path": a.container_path});
        let resp = http().post(&url).bearer_auth(&c.api_key).json(&body).send().await;
        match resp {
            Ok(r) if r.status().is_success() => {}
            Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
                let text = r.text().await.unwrap_or_default();
                anyhow::bail!(
                    "adapter {} ({}): the model server cannot load it (HTTP 404: {}); is it a LoRA adapter folder \
                     with adapter_config.json?",
                    a.name,
                    a.host.display(),
                    text.trim().chars().take(300).collect::<String>()
                );
            }
            Ok(r) => {
                let status = r.status();
                tracing::warn!(
                    "model container {}: loading adapter {} failed ({status}: {}); restarting instead",
                    c.name,
                    a.name,
                    r.text().await.unwrap_or_default().trim()
                );
                return Ok(false);
            }
            Err(e) => {
                tracing::warn!(
                    "model container {}: loading adapter {} failed ({e}); restarting instead",
                    c.name,
                    a.name
                );
                return Ok(false);
            }
        }
        c.served.push(a.name.clone());
        c.loaded_paths.insert(a.name.clone(), a.container_path.clone());
        if let Err(f) =
            wait_ready(docker, &c.id, c.host_port, &c.api_key, &names(&c.served), Duration::from_secs(60)).await
        {
            tracing::info!("model container {}: {f}", c.name);
            return Ok(false);
        }
        tracing::info!("model container {}: adapter {} loaded at run time", c.name, a.name);
        Ok(true)
    }

    /// Ends a lease: stops its watch, saves the job's log to `container.log`, and keeps
    /// the container warm unless it failed. Returns what happened to the server.
    pub(crate) async fn release(&self, lease: Lease) -> anyhow::Result<ModelServerFacts> {
        let facts = lease.facts();
        let Lease { docker, mut container, run_dir, since, watch, task, .. } = lease;
        task.abort();
        let _ = task.await;
        container.id = util::lock(&watch).container_id.clone();
        save_log(&docker, &container.id, &run_dir, since).await;
        if facts.failed {
            stop_and_remove(&docker, &container.id).await?;
        } else {
            let mut warm = self.warm.lock().await;
            if let Some(old) = warm.replace(container) {
                stop_and_remove(&docker, &old.id).await?;
            }
        }
        Ok(facts)
    }

    /// Stops and removes the warm container, if any.
    pub(crate) async fn shutdown(&self) -> anyhow::Result<()> {
        let Some(c) = self.warm.lock().await.take() else { return Ok(()) };
        let docker = self.docker().await?;
        tracing::info!("model container {}: stopping", c.name);
        stop_and_remove(docker, &c.id).await
    }

    /// The setup for a request; for the simulated model's image (a `[sim]` table and no
    /// `model.path`) the model folder (sim.toml + truth.json) and empty adapter folders
    /// are generated under the pool's work folder, content-addressed, so equal specs
    /// share them and a warm container stays reusable across runs. On the blocking pool:
    /// it may write those files.
    async fn setup_for(&self, req: &Request<'_>) -> anyhow::Result<Setup> {
        let (work_dir, server, truth_file) = (self.work_dir.clone(), req.server.clone(), req.truth_file.to_path_buf());
        crate::runtime::blocking(move || setup(&work_dir, &server, &truth_file)).await
    }
}

/// [`Pool::setup_for`]'s work, under the pool's work folder `work_dir`. Blocking.
fn setup(work_dir: &Path, server: &ServerSetup, truth_file: &Path) -> anyhow::Result<Setup> {
    let model_host = match (&server.model.path, &server.sim) {
        (Some(path), _) => path.clone(),
        (None, Some(sim)) => sim_model_dir(work_dir, sim, truth_file)?,
        (None, None) => anyhow::bail!("{}: backend \"docker\" needs model.path", server.spec_file.display()),
    };
    let adapter_host = match &server.adapter {
        Some(a) => Some(match &a.path {
            Some(p) => p.clone(),
            None => {
                let dir = work_dir.join("sim-adapters").join(super::path_word(&a.name));
                std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
                util::write_atomic(&dir.join("adapter_config.json"), br#"{"simulated": true}"#)?;
                dir
            }
        }),
        None => None,
    };
    Setup::new(server, model_host, adapter_host)
}

fn sim_model_dir(work_dir: &Path, sim: &pruefstand_sim::SimConfig, truth_file: &Path) -> anyhow::Result<PathBuf> {
    let config = toml::to_string(sim).context("writing the simulator's settings")?;
    let truth =
        std::fs::read(truth_file).with_context(|| format!("reading the ground truth {}", truth_file.display()))?;
    let mut both = config.clone().into_bytes();
    both.extend_from_slice(&truth);
    let dir = work_dir.join("sim-models").join(&util::sha256_hex(&both)[..16]);
    if !dir.join("truth.json").is_file() {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        util::write_atomic(&dir.join("sim.toml"), config.as_bytes())?;
        util::write_atomic(&dir.join("truth.json"), &truth)?;
    }
    Ok(dir)
}

/// The server's own word on its version (vLLM: `GET /version`, `{"version": "0.32.0"}`);
/// None from a server without the endpoint.
async fn server_version(http: &reqwest::Client, port: u16, api_key: &str) -> Option<String> {
    let response = http.get(format!("http://127.0.0.1:{port}/version")).bearer_auth(api_key).send().await.ok()?;
    let body: serde_json::Value = response.error_for_status().ok()?.json().await.ok()?;
    body.get("version").and_then(serde_json::Value::as_str).map(str::to_string)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(3)).build().expect("HTTP client")
}

fn names(served: &[String]) -> Vec<&str> {
    served.iter().map(String::as_str).collect()
}

/// Appends the container's log since `since` to `<run_dir>/container.log`.
async fn save_log(docker: &Docker, id: &str, run_dir: &Path, since: i64) {
    let text = match logs(docker, id, since, None).await {
        Ok(text) => text,
        Err(e) => format!("(container log unavailable: {e:#})\n"),
    };
    if let Err(e) = RunDir::new(run_dir).append_container_log(text.as_bytes()) {
        tracing::warn!("saving the container's log: {e:#}");
    }
}

/// A server handed to one job, with its health watch.
pub(crate) struct Lease {
    pub(crate) container: Container,
    /// This job's model and adapter folders (the container may have been created for
    /// another adapter).
    pub(crate) model_host: PathBuf,
    pub(crate) adapter_host: Option<PathBuf>,
    docker: Docker,
    run_dir: PathBuf,
    since: i64,
    watch: Arc<Mutex<WatchState>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct WatchState {
    facts: ModelServerFacts,
    /// The container's id now (a recreated container has a new one).
    container_id: String,
    restarting: bool,
    /// A restart succeeded and the gym has not been resumed since.
    pending_resume: bool,
    /// Length of cases.jsonl at the last healthy check.
    healthy_len: u64,
    /// Case ids recorded before the last death (errors after it are its casualties).
    before_death: BTreeSet<String>,
    /// The run's cases stopped reaching the server (`run::silence`): a death, whatever
    /// `/health` says, handled on the same path. Cleared only when the death is
    /// recorded, so a gym pass that ends first still waits for the restart.
    silent: bool,
}

impl Lease {
    fn start(
        docker: Docker,
        container: Container,
        run_dir: &Path,
        since: i64,
        setup: &Setup,
        interrupt_clients: InterruptClients,
    ) -> Lease {
        let watch = Arc::new(Mutex::new(WatchState { container_id: container.id.clone(), ..WatchState::default() }));
        let task = tokio::spawn(watch_loop(
            docker.clone(),
            container.clone(),
            run_dir.to_path_buf(),
            watch.clone(),
            interrupt_clients,
        ));
        let (model_host, adapter_host) = (setup.model_host.clone(), setup.adapter.as_ref().map(|a| a.host.clone()));
        Lease { container, model_host, adapter_host, docker, run_dir: run_dir.to_path_buf(), since, watch, task }
    }

    pub(crate) fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.container.host_port)
    }

    /// What the run calls when its cases stopped reaching the server: the watch takes
    /// it for a death at its next look (restart once, resume; a second one fails).
    pub(crate) fn silence_hook(&self) -> Box<dyn FnMut() + Send> {
        let watch = self.watch.clone();
        Box::new(move || {
            let mut s = util::lock(&watch);
            if !s.restarting {
                s.silent = true;
            }
        })
    }

    pub(crate) fn facts(&self) -> ModelServerFacts {
        util::lock(&self.watch).facts.clone()
    }

    /// Called after each gym pass: true when the server was restarted since and the
    /// gym must resume (after dropping the death's casualties); false when the run is
    /// over (finished, or the server failed for good). Waits out a restart in progress.
    pub(crate) async fn after_gym(&self) -> anyhow::Result<bool> {
        loop {
            let resume = {
                let mut s = util::lock(&self.watch);
                if !s.restarting && !s.silent {
                    if s.facts.failed || !s.pending_resume {
                        return Ok(false);
                    }
                    s.pending_resume = false;
                    Some(s.before_death.clone())
                } else {
                    None
                }
            };
            if let Some(before) = resume {
                // Rewrites cases.jsonl (an fsync): on the blocking pool.
                let run_dir = self.run_dir.clone();
                let dropped = crate::runtime::blocking(move || drop_casualties(&run_dir, &before)).await?;
                tracing::info!(
                    "model server restarted: resuming the gym ({dropped} case(s) that failed with it run again)"
                );
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Every second: is the server alive? On a death: stop the gym, restart once.
async fn watch_loop(
    docker: Docker,
    c: Container,
    run_dir: PathBuf,
    watch: Arc<Mutex<WatchState>>,
    interrupt_clients: InterruptClients,
) {
    let http = http();
    let cases = RunDir::new(&run_dir);
    let mut failures = 0;
    let mut id = c.id.clone();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let silent = util::lock(&watch).silent;
        let reason = match probe(&docker, &http, &id, c.host_port, silent, &mut failures).await {
            Health::Alive => {
                util::lock(&watch).healthy_len = cases.cases_len();
                continue;
            }
            Health::Unsure => continue,
            Health::Died(reason) => reason,
        };
        failures = 0;
        let tail = log_tail(&docker, &id, 40).await;
        let deaths = record_death(&watch, &reason, tail, &cases);
        let stopped = if interrupt_clients() { "the gym stopped" } else { "no gym running" };
        tracing::warn!("model container {}: the server died ({reason}); {stopped}", c.name);
        if deaths >= 2 {
            tracing::warn!("model container {}: second death — the run ends invalid", c.name);
            return;
        }
        let restarted = restart(&docker, &c, &id).await;
        match record_restart(&watch, &c.name, restarted) {
            Some(new_id) => id = new_id,
            None => return,
        }
    }
}

/// One look at the server by [`probe`].
enum Health {
    Alive,
    /// Not known dead: Docker hiccupped, or /health failed fewer than 3 times in a row.
    Unsure,
    /// Dead, and why.
    Died(String),
}

/// Looks at the server once; `failures` counts /health's failures in a row.
async fn probe(
    docker: &Docker,
    http: &reqwest::Client,
    id: &str,
    port: u16,
    silent: bool,
    failures: &mut u32,
) -> Health {
    let reason = match healthy(docker, http, id, port).await {
        Ok(true) if silent => "the run's cases could not connect to it, though /health answers".to_string(),
        Ok(true) => {
            *failures = 0;
            return Health::Alive;
        }
        Ok(false) => {
            match docker.inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>).await {
                Ok(i) if i.state.as_ref().and_then(|s| s.running) == Some(true) => {
                    *failures += 1;
                    if *failures < 3 {
                        return Health::Unsure;
                    }
                    "/health failed 3 times in a row".to_string()
                }
                Ok(i) => {
                    let state = i.state.unwrap_or_default();
                    let oom = if state.oom_killed == Some(true) { ", OOM-killed" } else { "" };
                    format!("the container exited with code {}{oom}", state.exit_code.unwrap_or(-1))
                }
                Err(e) if is_not_found(&e) => "the container is gone".to_string(),
                Err(_) => return Health::Unsure,
            }
        }
        Err(e) if is_not_found(&e) => "the container is gone".to_string(),
        // Docker itself hiccupped: not the server's death.
        Err(_) => return Health::Unsure,
    };
    Health::Died(reason)
}

/// Records a death in the facts (the second fails the run) and the cases recorded
/// before it; returns the deaths so far.
fn record_death(watch: &Mutex<WatchState>, reason: &str, tail: Vec<String>, cases: &RunDir) -> u32 {
    let mut s = util::lock(watch);
    s.silent = false;
    s.facts.deaths += 1;
    s.facts.events.push(format!(
        "{}: model server died: {reason}",
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    ));
    s.facts.log_tail = tail;
    s.before_death = cases.case_ids_within(s.healthy_len);
    if s.facts.deaths >= 2 {
        s.facts.failed = true;
    } else {
        s.restarting = true;
    }
    s.facts.deaths
}

/// Records how the restart went; the container's id to watch on, or None when it failed
/// (the run fails).
fn record_restart(watch: &Mutex<WatchState>, name: &str, restarted: Result<String, ServerFailure>) -> Option<String> {
    let mut s = util::lock(watch);
    s.restarting = false;
    match restarted {
        Ok(id) => {
            s.container_id = id.clone();
            s.facts.restarts += 1;
            s.pending_resume = true;
            s.facts
                .events
                .push(format!("{}: restarted", chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)));
            tracing::info!("model container {name}: restarted and ready");
            Some(id)
        }
        Err(f) => {
            s.facts.failed = true;
            s.facts.events.push(format!("restart failed: {}", f.message));
            s.facts.log_tail = f.log_tail;
            tracing::warn!("model container {name}: restart failed: {}", f.message);
            None
        }
    }
}

/// Starts the same container again (same port, same key; recreated from the same body
/// when it was removed) and reloads adapters that were loaded at run time, which a
/// restarted vLLM has forgotten. Returns the container's (possibly new) id.
async fn restart(docker: &Docker, c: &Container, id: &str) -> Result<String, ServerFailure> {
    let fail = |message: String| ServerFailure { message, log_tail: vec![] };
    let options = bollard::query_parameters::RestartContainerOptionsBuilder::default().t(STOP_GRACE_S).build();
    let id = match docker.restart_container(id, Some(options)).await {
        Ok(()) => id.to_string(),
        Err(e) if is_not_found(&e) => {
            let id = create(docker, &c.name, c.body.clone())
                .await
                .map_err(|e| fail(format!("recreating {}: {e:#}", c.name)))?;
            docker
                .start_container(&id, None::<bollard::query_parameters::StartContainerOptions>)
                .await
                .map_err(|e| fail(format!("starting {}: {e}", c.name)))?;
            id
        }
        Err(e) => return Err(fail(format!("restarting {}: {e}", c.name))),
    };
    let from_command = 1 + usize::from(c.setup.adapter.is_some());
    let served = names(&c.served);
    wait_ready(docker, &id, c.host_port, &c.api_key, &served[..from_command.min(served.len())], c.setup.ready_timeout)
        .await?;
    for name in served.iter().skip(from_command) {
        let path = c.loaded_paths.get(*name).cloned().unwrap_or_default();
        let url = format!("http://127.0.0.1:{}/v1/load_lora_adapter", c.host_port);
        let body = serde_json::json!({"lora_name": name, "lora_path": path});
        let ok =
            http().post(&url).bearer_auth(&c.api_key).json(&body).send().await.is_ok_and(|r| r.status().is_success());
        if !ok {
            return Err(fail(format!("reloading adapter {name} after the restart failed")));
        }
    }
    wait_ready(docker, &id, c.host_port, &c.api_key, &served, Duration::from_secs(60)).await?;
    Ok(id)
}

/// What a warm server does about the adapter the next job needs.
#[derive(Debug, PartialEq, Eq)]
enum AdapterFit {
    /// It serves that adapter (same name, same folder).
    Served,
    /// It can load it at run time.
    Load,
    /// A fresh server is needed: no runtime loading, or the name is taken by another
    /// folder's adapter. vLLM could reload the name in place, but its prefix cache
    /// keeps the blocks computed with the old weights under that name.
    Restart,
}

/// `serving`: the in-container path the warm server serves the wanted name from, if any.
fn adapter_fit(serving: Option<&str>, wanted_path: &str, runtime_lora: bool) -> AdapterFit {
    match serving {
        Some(path) if path == wanted_path => AdapterFit::Served,
        Some(_) => AdapterFit::Restart,
        None if runtime_lora => AdapterFit::Load,
        None => AdapterFit::Restart,
    }
}

impl Container {
    /// The files of the bench root's the server was started with, as read then.
    pub(crate) fn served_files(&self) -> &[super::ServedFile] {
        &self.setup.served_files
    }

    /// Where the server loaded adapter `name` from (at start or at run time).
    fn serving_path(&self, name: &str) -> Option<&str> {
        let at_start = self.setup.adapter.as_ref().filter(|a| a.name == name).map(|a| a.container_path.as_str());
        self.loaded_paths.get(name).map(String::as_str).or(at_start)
    }
}

/// Removes the error records of cases not recorded before the death (they failed
/// because the server was gone), and of every case whose agent could not connect at
/// all (a silent server's cases, recorded while `/health` still answered), so the
/// resumed gym runs them again. Called between the gym's passes (the store's rewrite
/// under the run's lock, which this process holds: [`RunDir::retain_cases`]).
fn drop_casualties(run_dir: &Path, before: &BTreeSet<String>) -> anyhow::Result<usize> {
    RunDir::new(run_dir).retain_cases(|r| !(r.could_not_connect() || (r.is_error() && !before.contains(&r.case_id))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warm_server_is_reused_for_an_adapter_only_when_it_serves_that_folder() {
        assert_eq!(adapter_fit(Some("/adapters/a"), "/adapters/a", false), AdapterFit::Served);
        assert_eq!(adapter_fit(None, "/adapters/a", true), AdapterFit::Load);
        assert_eq!(adapter_fit(None, "/adapters/a", false), AdapterFit::Restart);
        // The same name from another folder: never the old weights, never an in-place
        // reload (vLLM's prefix cache keeps blocks of the old weights under the name).
        assert_eq!(adapter_fit(Some("/adapters/a"), "/adapters/b", true), AdapterFit::Restart);
    }

    #[test]
    fn casualties_are_the_errors_after_the_death_and_every_case_that_could_not_connect() {
        use pruefstand_core::case::{Case, CaseRecord};
        use pruefstand_store::RunFile;
        let dir = tempfile::tempdir().unwrap();
        let record = |id: &str, error: Option<&str>| {
            let mut r = CaseRecord::of(&Case::clean("banking", id), Some(true), None);
            r.error = error.map(str::to_string);
            serde_json::to_string(&r).unwrap() + "\n"
        };
        let refused = "agent error: model server: cannot connect: tcp connect error (gave up after 4 attempts)";
        let lines = [
            record("user_task_1", None),
            record("user_task_2", Some("agent error: the agent exited")),
            record("user_task_3", Some(refused)),
            record("user_task_4", Some("agent error: model server: HTTP 500")),
        ];
        let cases = RunDir::new(dir.path()).test_file(RunFile::Cases);
        std::fs::write(&cases, lines.concat()).unwrap();
        // Recorded while /health answered: user tasks 1-3; the fourth failed with the death.
        let before: BTreeSet<String> =
            ["user_task_1", "user_task_2", "user_task_3"].iter().map(|t| Case::clean("banking", t).id).collect();
        assert_eq!(drop_casualties(dir.path(), &before).unwrap(), 2);
        let kept = std::fs::read_to_string(&cases).unwrap();
        assert_eq!(kept, [lines[0].clone(), lines[1].clone()].concat());
    }
}
