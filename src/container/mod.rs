//! The model container: a version's vLLM server — or the simulated
//! model's image — in Docker, through bollard. This file: connecting (fast, one-line
//! failure), the checks before a run (`preflight`), what a version's container looks
//! like (`Setup`: command, mounts, GPU, labels), its lifecycle steps (create, start,
//! readiness, logs, stop, remove), orphan removal and our containers' host pids (for
//! the GPU guard). `pool` keeps a ready container across jobs and watches its health.
//!
//! Not here: which job runs when (the daemon), the gym, judging. Security: the API key
//! goes by environment (`VLLM_API_KEY`), never argv; the port is published on
//! 127.0.0.1 only; model and adapter are mounted read-only; nothing is pulled unless
//! the spec says `pull = true`.

pub(crate) mod pool;
mod server;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountBindOptions, MountType, PortBinding, ResourcesUlimits,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use futures_util::StreamExt;

pub(crate) use pool::{InterruptClients, Lease, Pool, Request};
pub(crate) use server::ServerSetup;

use pruefstand_core::spec::{Backend, GpuMode, ServedFileKind};
use pruefstand_core::util;

/// Labels on every container we create; `managed` is what orphan removal looks for.
const LABEL_MANAGED: &str = "pruefstand.managed";
pub(crate) const LABEL_JOB: &str = "pruefstand.job";
pub(crate) const LABEL_RUN: &str = "pruefstand.run";
pub(crate) const LABEL_VERSION: &str = "pruefstand.version";
/// Owner process: pid, its start time (clock ticks since boot, so a reused pid does
/// not look alive) and the boot id (a reboot kills every owner).
const LABEL_OWNER_PID: &str = "pruefstand.owner.pid";
const LABEL_OWNER_START: &str = "pruefstand.owner.start";
const LABEL_OWNER_BOOT: &str = "pruefstand.owner.boot";
/// The pool's reuse key (image, model, arguments …; see `Setup::key`).
const LABEL_KEY: &str = "pruefstand.key";

/// vLLM's port inside the container.
const CONTAINER_PORT: u16 = 8000;
/// Persistent named volume for vLLM's compile cache (shortens cold starts); the only
/// volume we ever leave behind, on purpose.
const COMPILE_CACHE_VOLUME: &str = "pruefstand-compile-cache";
const COMPILE_CACHE_TARGET: &str = "/root/.cache/vllm";
const MODEL_TARGET: &str = "/model";
const ADAPTERS_TARGET: &str = "/adapters";
/// vLLM handles SIGTERM; NVIDIA's notes stop it with ~30 s.
const STOP_GRACE_S: i32 = 30;
const DEFAULT_READY_TIMEOUT_S: f64 = 900.0;
/// How long connecting to the engine may take before we say it is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to the Docker Engine (`DOCKER_HOST`, else the local socket) and agrees on
/// an API version; fails within a few seconds with one line when it is not there.
pub(crate) async fn connect() -> anyhow::Result<Docker> {
    let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".to_string());
    let unreachable = |why: String| {
        anyhow!("Docker Engine not reachable at {host}: {why} (is dockerd running? backend \"docker\" needs it)")
    };
    let docker = Docker::connect_with_defaults().map_err(|e| unreachable(one_line(&e.to_string())))?;
    match tokio::time::timeout(CONNECT_TIMEOUT, docker.negotiate_version()).await {
        Ok(Ok(docker)) => Ok(docker),
        Ok(Err(e)) => Err(unreachable(one_line(&e.to_string()))),
        Err(_) => Err(unreachable(format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()))),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(crate) async fn preflight_with(docker: &Docker, server: &ServerSetup) -> anyhow::Result<()> {
    let model = &server.model;
    if server.backend() != Backend::Docker {
        return Ok(());
    }
    let spec_file = server.spec_file.display();
    let image = model.image.as_deref().context("backend \"docker\" needs model.image")?;
    if image_info(docker, image).await?.is_none() && !model.pull {
        bail!("{spec_file}: {}", missing_image(image));
    }
    if let Some(path) = &model.path
        && !path.is_dir()
    {
        bail!("{spec_file}: model.path {} is not a folder on this machine", path.display());
    }
    if let Some(path) = server.adapter.as_ref().and_then(|a| a.path.as_ref())
        && !path.is_dir()
    {
        bail!("{spec_file}: adapter.path {} is not a folder on this machine", path.display());
    }
    if let Some(path) = server.adapter.as_ref().and_then(|a| a.path.as_ref())
        && !path.join("adapter_config.json").is_file()
    {
        // vLLM answers such a folder with 404 only once the job has started.
        bail!(
            "{spec_file}: adapter.path {} has no adapter_config.json: not a LoRA adapter folder (PEFT's              save_pretrained writes one)",
            path.display()
        );
    }
    if model.gpu == GpuMode::Runtime {
        let info = docker.info().await.context("asking Docker for its runtimes")?;
        if !info.runtimes.unwrap_or_default().contains_key("nvidia") {
            bail!(
                "{spec_file}: gpu = \"runtime\" needs Docker's \"nvidia\" runtime, which this engine does not have (install the NVIDIA container toolkit, or use gpu = \"device-request\" / \"cdi\" / \"none\")"
            );
        }
    }
    Ok(())
}

fn missing_image(image: &str) -> String {
    format!("image {image} is not present in the local Docker Engine; {}", image_remedy(image))
}

/// How to get a missing image: the images this project builds say which of its
/// scripts builds them; any other is loaded or pulled.
pub(crate) fn image_remedy(image: &str) -> String {
    let repository = image.split(':').next().unwrap_or(image);
    match BUILT_HERE.iter().find(|(name, _)| *name == repository) {
        Some((_, script)) => format!("build it with `{script}` (from a checkout of pruefstand)"),
        None => format!(
            "load or pull it yourself (`docker pull {image}`), or set model.pull = true to let pruefstand pull it"
        ),
    }
}

/// Images a script of this repository builds, without any registry.
const BUILT_HERE: [(&str, &str); 2] =
    [("pruefstand-sim", "scripts/build-sim-image"), ("pruefstand-vllm-cpu", "scripts/build-vllm-cpu-image")];

/// What we know of a local image.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct ImageInfo {
    pub(crate) name: String,
    /// `sha256:…` content id.
    pub(crate) id: String,
    /// Registry digests (`repo@sha256:…`); none for a locally built image.
    pub(crate) repo_digests: Vec<String>,
}

impl ImageInfo {
    /// What pins the image in run.json: a registry digest, else the content id.
    pub(crate) fn digest(&self) -> String {
        self.repo_digests.first().cloned().unwrap_or_else(|| self.id.clone())
    }
}

async fn image_info(docker: &Docker, image: &str) -> anyhow::Result<Option<ImageInfo>> {
    match docker.inspect_image(image).await {
        Ok(i) => Ok(Some(ImageInfo {
            name: image.to_string(),
            id: i.id.unwrap_or_default(),
            repo_digests: i.repo_digests.unwrap_or_default(),
        })),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("inspecting image {image}")),
    }
}

/// Makes sure the image is there: present, or pulled when the spec allows it.
pub(crate) async fn ensure_image(docker: &Docker, image: &str, pull: bool) -> anyhow::Result<ImageInfo> {
    if let Some(info) = image_info(docker, image).await? {
        return Ok(info);
    }
    if !pull {
        bail!("{}", missing_image(image));
    }
    tracing::info!("pulling image {image} (model.pull = true)");
    let (repo, tag) = match image.rsplit_once(':').filter(|(_, t)| !t.contains('/')) {
        Some((r, t)) => (r, t),
        None => (image, "latest"),
    };
    let mut stream =
        docker.create_image(Some(CreateImageOptionsBuilder::default().from_image(repo).tag(tag).build()), None, None);
    while let Some(step) = stream.next().await {
        step.with_context(|| format!("pulling image {image}"))?;
    }
    image_info(docker, image).await?.with_context(|| format!("image {image} still missing after the pull"))
}

fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(e, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. })
}

/// A model server that failed to come up or died: what happened, with the container's
/// last log lines (they usually say why).
#[derive(Debug, Clone)]
pub(crate) struct ServerFailure {
    pub(crate) message: String,
    pub(crate) log_tail: Vec<String>,
}

impl std::fmt::Display for ServerFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)?;
        if self.log_tail.is_empty() {
            write!(f, " (the container logged nothing)")
        } else {
            write!(f, "; the container's last log lines:\n    {}", self.log_tail.join("\n    "))
        }
    }
}

impl std::error::Error for ServerFailure {}

/// Why no model server was had. The caller branches on it: a server that failed is the
/// run's record (R1 fails it, with the log tail); anything else stops the run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AcquireError {
    /// The server did not come up (never ready, died while starting).
    #[error(transparent)]
    Server(#[from] ServerFailure),
    /// The bench could not try: Docker, the image, the folders, the spec.
    #[error(transparent)]
    Bench(#[from] anyhow::Error),
}

/// How a version's container is made: derived from the spec plus the host folders to
/// mount (the spec's, or generated ones for the simulated model's image).
#[derive(Clone, Debug)]
pub(crate) struct Setup {
    pub(crate) image: String,
    pub(crate) served_name: String,
    pub(crate) model_host: PathBuf,
    pub(crate) adapter: Option<AdapterMount>,
    pub(crate) gpu: GpuMode,
    pub(crate) prefix: Vec<String>,
    pub(crate) args: Vec<String>,
    pub(crate) shm_size: Option<i64>,
    pub(crate) ipc: Option<String>,
    pub(crate) ulimits: BTreeMap<String, i64>,
    pub(crate) runtime_lora: bool,
    pub(crate) ready_timeout: Duration,
    pub(crate) pull: bool,
    /// The spec's chat template and tool-parser plugin (a changed file is another
    /// server).
    pub(crate) served_files: Vec<ServedFile>,
    /// `ServerSetup::lora_dir`: mounted at /adapters when no adapter is.
    pub(crate) lora_dir: Option<PathBuf>,
}

/// A file of the bench root's that the server reads (a chat template, a tool-parser
/// plugin): which, where it is on the host, and its sha256 as read when the server was
/// set up — the reuse key holds the content, not the path, and provenance records it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ServedFile {
    pub(crate) kind: ServedFileKind,
    pub(crate) host: PathBuf,
    pub(crate) sha256: String,
}

impl ServedFile {
    fn read_all(server: &ServerSetup) -> anyhow::Result<Vec<ServedFile>> {
        let read = |(kind, file): &(ServedFileKind, PathBuf)| {
            let text = std::fs::read(file).with_context(|| {
                format!("{}: model.{} {}", server.spec_file.display(), kind.field(), file.display())
            })?;
            Ok(ServedFile {
                kind: *kind,
                host: std::path::absolute(file)?,
                sha256: pruefstand_core::util::sha256_hex(&text),
            })
        };
        server.served_files.iter().map(read).collect()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AdapterMount {
    pub(crate) name: String,
    pub(crate) host: PathBuf,
    /// Where the server finds it (`--lora-modules name=<this>`).
    pub(crate) container_path: String,
    /// What is bind-mounted: the adapter itself at /adapters/<name>; with runtime LoRA
    /// its parent folder at /adapters, so a warm server can load a sibling adapter.
    pub(crate) mount_source: PathBuf,
    pub(crate) mount_target: String,
}

/// A folder name safe inside a container path.
fn path_word(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect()
}

impl Setup {
    pub(crate) fn new(
        server: &ServerSetup,
        model_host: PathBuf,
        adapter_host: Option<PathBuf>,
    ) -> anyhow::Result<Setup> {
        let m = &server.model;
        let runtime_lora = m.runtime_lora;
        let adapter = match (&server.adapter, adapter_host) {
            (Some(a), Some(host)) => {
                let host = std::path::absolute(&host).with_context(|| format!("adapter path {}", host.display()))?;
                if runtime_lora {
                    let parent = host
                        .parent()
                        .with_context(|| format!("adapter path {} has no parent folder", host.display()))?;
                    let base = host.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    Some(AdapterMount {
                        name: a.name.clone(),
                        container_path: format!("{ADAPTERS_TARGET}/{}", path_word(&base)),
                        mount_source: parent.to_path_buf(),
                        mount_target: ADAPTERS_TARGET.into(),
                        host,
                    })
                } else {
                    let target = format!("{ADAPTERS_TARGET}/{}", path_word(&a.name));
                    Some(AdapterMount {
                        name: a.name.clone(),
                        container_path: target.clone(),
                        mount_source: host.clone(),
                        mount_target: target,
                        host,
                    })
                }
            }
            (Some(a), None) => bail!("{}: adapter {} has no path to mount", server.spec_file.display(), a.name),
            (None, _) => None,
        };
        if let Some(a) = &adapter
            && runtime_lora
            && path_word(&a.host.file_name().unwrap_or_default().to_string_lossy())
                != a.host.file_name().unwrap_or_default().to_string_lossy()
        {
            bail!(
                "{}: with runtime_lora the adapter folder's name must be plain (letters, digits, . _ -): {}",
                server.spec_file.display(),
                a.host.display()
            );
        }
        Ok(Setup {
            image: m.image.clone().context("backend \"docker\" needs model.image")?,
            served_name: m.served_name.clone(),
            model_host: std::path::absolute(&model_host)
                .with_context(|| format!("model path {}", model_host.display()))?,
            adapter,
            gpu: m.gpu,
            prefix: m.command.clone(),
            args: m.args.clone(),
            shm_size: m
                .shm_size
                .as_deref()
                .map(pruefstand_core::util::parse_bytes)
                .transpose()
                .with_context(|| format!("{}: model.shm_size", server.spec_file.display()))?,
            ipc: m.ipc.clone(),
            ulimits: m.ulimits.clone(),
            runtime_lora,
            ready_timeout: Duration::from_secs_f64(m.ready_timeout_s.unwrap_or(DEFAULT_READY_TIMEOUT_S)),
            pull: m.pull,
            served_files: ServedFile::read_all(server)?,
            lora_dir: server.lora_dir.as_deref().map(std::path::absolute).transpose()?,
        })
    }

    /// vLLM's command line (the image's entrypoint runs `vllm serve` or our
    /// `sim-serve`; `prefix` names it when it does not). The spec's args come last, so
    /// they win where vLLM takes the last occurrence. No API key: that is env.
    pub(crate) fn command(&self) -> Vec<String> {
        let mut cmd = self.prefix.clone();
        cmd.extend([MODEL_TARGET.to_string(), "--served-model-name".into(), self.served_name.clone()]);
        cmd.extend(["--host".into(), "0.0.0.0".into(), "--port".into(), CONTAINER_PORT.to_string()]);
        if self.adapter.is_some() || self.runtime_lora {
            cmd.push("--enable-lora".into());
        }
        if let Some(a) = &self.adapter {
            cmd.extend(["--lora-modules".into(), format!("{}={}", a.name, a.container_path)]);
        }
        for file in &self.served_files {
            cmd.extend([file.kind.flag().into(), file.kind.container_path().into()]);
        }
        cmd.extend(self.args.iter().cloned());
        cmd
    }

    /// Two jobs whose keys match can share a warm container: same image, model and
    /// arguments; the adapter counts only when it cannot be swapped at run time.
    pub(crate) fn key(&self) -> String {
        let adapter = match &self.adapter {
            Some(a) if self.runtime_lora => serde_json::json!({"mount": a.mount_source}),
            Some(a) => serde_json::json!({"name": a.name, "host": a.host}),
            None => serde_json::Value::Null,
        };
        let mut key = serde_json::json!({
            "image": self.image, "model": self.model_host, "served": self.served_name, "prefix": self.prefix,
            "args": self.args, "gpu": format!("{:?}", self.gpu), "shm": self.shm_size, "ipc": self.ipc, "ulimits": self.ulimits,
            "runtime_lora": self.runtime_lora, "adapter": adapter,
            "chat_template": serde_json::Value::Null,
        });
        // A file's entry only where there is one (the template's null was there first),
        // so the keys of servers without the later ones stay as they were.
        for file in &self.served_files {
            key[file.kind.field()] = file.sha256.clone().into();
        }
        if let Some(dir) = &self.lora_dir {
            key["lora_dir"] = dir.display().to_string().into();
        }
        pruefstand_core::util::sha256_hex(key.to_string().as_bytes())[..16].to_string()
    }

    fn env(&self, api_key: &str) -> Vec<String> {
        let mut env = vec![format!("VLLM_API_KEY={api_key}")];
        if self.runtime_lora {
            env.push("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True".into());
        }
        env
    }

    fn mounts(&self) -> Vec<Mount> {
        let bind = |source: &Path, target: &str| Mount {
            source: Some(source.display().to_string()),
            target: Some(target.to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            bind_options: Some(MountBindOptions { non_recursive: Some(true), ..Default::default() }),
            ..Default::default()
        };
        let mut mounts = vec![bind(&self.model_host, MODEL_TARGET)];
        if let Some(a) = &self.adapter {
            mounts.push(bind(&a.mount_source, &a.mount_target));
        } else if let Some(dir) = &self.lora_dir {
            mounts.push(bind(dir, ADAPTERS_TARGET));
        }
        for file in &self.served_files {
            mounts.push(bind(&file.host, file.kind.container_path()));
        }
        mounts.push(Mount {
            source: Some(COMPILE_CACHE_VOLUME.into()),
            target: Some(COMPILE_CACHE_TARGET.into()),
            typ: Some(MountType::VOLUME),
            read_only: Some(false),
            ..Default::default()
        });
        mounts
    }

    /// The create body. `labels` come from the caller (job, run, version); ours are added.
    pub(crate) fn body(
        &self,
        api_key: &str,
        host_port: u16,
        mut labels: HashMap<String, String>,
    ) -> ContainerCreateBody {
        labels.insert(LABEL_MANAGED.into(), "1".into());
        labels.insert(LABEL_KEY.into(), self.key());
        labels.insert(LABEL_OWNER_PID.into(), std::process::id().to_string());
        labels.insert(LABEL_OWNER_START.into(), process_start(std::process::id()).unwrap_or_default());
        labels.insert(LABEL_OWNER_BOOT.into(), boot_id());
        let port = format!("{CONTAINER_PORT}/tcp");
        let binding = PortBinding { host_ip: Some("127.0.0.1".into()), host_port: Some(host_port.to_string()) };
        let mut host = HostConfig {
            port_bindings: Some(HashMap::from([(port.clone(), Some(vec![binding]))])),
            mounts: Some(self.mounts()),
            shm_size: self.shm_size,
            ipc_mode: self.ipc.clone(),
            ulimits: (!self.ulimits.is_empty()).then(|| {
                self.ulimits
                    .iter()
                    .map(|(n, v)| ResourcesUlimits { name: Some(n.clone()), soft: Some(*v), hard: Some(*v) })
                    .collect()
            }),
            security_opt: Some(vec!["no-new-privileges".into()]),
            ..Default::default()
        };
        match self.gpu {
            GpuMode::Runtime => host.runtime = Some("nvidia".into()),
            GpuMode::DeviceRequest => {
                host.device_requests = Some(vec![DeviceRequest {
                    driver: Some("nvidia".into()),
                    count: Some(-1),
                    capabilities: Some(vec![vec!["gpu".into()]]),
                    ..Default::default()
                }])
            }
            GpuMode::Cdi => {
                host.device_requests = Some(vec![DeviceRequest {
                    driver: Some("cdi".into()),
                    device_ids: Some(vec!["nvidia.com/gpu=all".into()]),
                    ..Default::default()
                }])
            }
            GpuMode::None => {}
        }
        ContainerCreateBody {
            image: Some(self.image.clone()),
            cmd: Some(self.command()),
            env: Some(self.env(api_key)),
            labels: Some(labels),
            exposed_ports: Some(vec![port]),
            stop_timeout: Some(STOP_GRACE_S as i64),
            host_config: Some(host),
            ..Default::default()
        }
    }
}

/// A free TCP port on 127.0.0.1 for the published port (chosen by us, not Docker, so a
/// restarted container keeps it and the agents' URL stays valid).
fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port on 127.0.0.1")?;
    Ok(l.local_addr()?.port())
}

/// Creates a container (named `name`); returns its id.
/// Ids of the model containers this process created: the GPU guard counts their
/// processes as ours, also for a container created after its watch began.
static CREATED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

pub(crate) fn created_ids() -> Vec<String> {
    util::lock(&CREATED).clone()
}

pub(crate) async fn create(docker: &Docker, name: &str, body: ContainerCreateBody) -> anyhow::Result<String> {
    let image = body.image.clone().unwrap_or_default();
    let created = docker
        .create_container(Some(CreateContainerOptionsBuilder::default().name(name).build()), body)
        .await
        .with_context(|| format!("creating container {name} from {image}"))?;
    for w in &created.warnings {
        tracing::warn!("docker: {w}");
    }
    util::lock(&CREATED).push(created.id.clone());
    Ok(created.id)
}

/// `Ok(Some(exit code))` once it stopped, `Ok(None)` while running, `Err` when gone.
async fn exit_state(docker: &Docker, id: &str) -> Result<Option<i64>, bollard::errors::Error> {
    let info = docker.inspect_container(id, None::<InspectContainerOptions>).await?;
    let state = info.state.unwrap_or_default();
    Ok(if state.running.unwrap_or(false) { None } else { Some(state.exit_code.unwrap_or(-1)) })
}

/// Waits until `/health` answers 200 and `/v1/models` lists the served model (and the
/// adapter); fails at once when the container exits, else after `timeout`.
async fn wait_ready(
    docker: &Docker,
    id: &str,
    port: u16,
    api_key: &str,
    names: &[&str],
    timeout: Duration,
) -> Result<(), ServerFailure> {
    let started = Instant::now();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(3)).build().expect("HTTP client");
    loop {
        match exit_state(docker, id).await {
            Ok(None) => {}
            Ok(Some(code)) => {
                return Err(ServerFailure {
                    message: format!("the model container {} exited (code {code}) before it served", short(id)),
                    log_tail: log_tail(docker, id, 40).await,
                });
            }
            Err(e) => {
                return Err(ServerFailure {
                    message: format!("the model container {} is gone: {e}", short(id)),
                    log_tail: vec![],
                });
            }
        }
        let last = match probe(&http, port, api_key, names).await {
            Ok(()) => return Ok(()),
            Err(why) => why,
        };
        if started.elapsed() >= timeout {
            return Err(ServerFailure {
                message: format!(
                    "the model server in container {} was not ready after {:.0} s (last check: {last})",
                    short(id),
                    timeout.as_secs_f64()
                ),
                log_tail: log_tail(docker, id, 40).await,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One readiness check: `Err` says what is missing.
async fn probe(http: &reqwest::Client, port: u16, api_key: &str, names: &[&str]) -> Result<(), String> {
    let base = format!("http://127.0.0.1:{port}");
    let health = http
        .get(format!("{base}/health"))
        .send()
        .await
        .map_err(|e| format!("/health: {}", one_line(&e.to_string())))?;
    if health.status() != 200 {
        return Err(format!("/health answered {}", health.status()));
    }
    let models = http
        .get(format!("{base}/v1/models"))
        .bearer_auth(api_key)
        .send()
        .await
        .map_err(|e| format!("/v1/models: {e}"))?;
    if models.status() != 200 {
        return Err(format!("/v1/models answered {}", models.status()));
    }
    let v: serde_json::Value = models.json().await.map_err(|e| format!("/v1/models: {e}"))?;
    let ids: Vec<&str> = v["data"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str()).collect();
    match names.iter().find(|n| !ids.contains(n)) {
        Some(missing) => Err(format!("/v1/models does not list {missing} (it lists {ids:?})")),
        None => Ok(()),
    }
}

/// Quick liveness: running and `/health` 200.
async fn healthy(docker: &Docker, http: &reqwest::Client, id: &str, port: u16) -> Result<bool, bollard::errors::Error> {
    if exit_state(docker, id).await?.is_some() {
        return Ok(false);
    }
    let ok = http.get(format!("http://127.0.0.1:{port}/health")).send().await.is_ok_and(|r| r.status() == 200);
    Ok(ok)
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// The container's log (stdout and stderr) since `since` (unix seconds; 0 = all).
pub(crate) async fn logs(docker: &Docker, id: &str, since: i64, tail: Option<usize>) -> anyhow::Result<String> {
    let mut options = LogsOptionsBuilder::default().stdout(true).stderr(true).since(since as i32);
    options = options.tail(&tail.map_or("all".to_string(), |n| n.to_string()));
    let mut stream = docker.logs(id, Some(options.build()));
    let mut text = String::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.with_context(|| format!("reading the log of container {}", short(id)))?;
        text.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
    }
    Ok(text)
}

pub(crate) async fn log_tail(docker: &Docker, id: &str, lines: usize) -> Vec<String> {
    match logs(docker, id, 0, Some(lines)).await {
        Ok(text) => text.lines().map(str::to_string).collect(),
        Err(e) => vec![format!("(log unavailable: {e:#})")],
    }
}

/// Stops (SIGTERM, then SIGKILL after the grace period) and removes, with anonymous
/// volumes. A container that is already gone is fine.
pub(crate) async fn stop_and_remove(docker: &Docker, id: &str) -> anyhow::Result<()> {
    match docker.stop_container(id, Some(StopContainerOptionsBuilder::default().t(STOP_GRACE_S).build())).await {
        Ok(()) => {}
        Err(e) if is_not_found(&e) => return Ok(()),
        // 304: already stopped.
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 304, .. }) => {}
        Err(e) => tracing::warn!("stopping container {}: {e}", short(id)),
    }
    match docker.remove_container(id, Some(RemoveContainerOptionsBuilder::default().force(true).v(true).build())).await
    {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        // 409: removal already in progress.
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing container {}", short(id))),
    }
}

/// A container of ours found without a live owner, and removed.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Orphan {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) job: String,
    pub(crate) owner_pid: String,
    pub(crate) state: String,
}

impl std::fmt::Display for Orphan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "removed orphaned model container {} ({}; version {}, job {}, owner pid {} gone, was {})",
            self.name,
            short(&self.id),
            self.version,
            self.job,
            self.owner_pid,
            self.state
        )
    }
}

/// Our containers (label `pruefstand.managed`), running or not.
async fn list_managed(docker: &Docker) -> anyhow::Result<Vec<bollard::models::ContainerSummary>> {
    let filters = HashMap::from([("label".to_string(), vec![format!("{LABEL_MANAGED}=1")])]);
    docker
        .list_containers(Some(ListContainersOptionsBuilder::default().all(true).filters(&filters).build()))
        .await
        .context("listing pruefstand's containers")
}

/// Removes our containers whose owning process is gone (crash, `kill -9`, reboot) and
/// says which. A container whose owner lives (another `run`, the daemon) is left alone.
pub(crate) async fn remove_orphans(docker: &Docker) -> anyhow::Result<Vec<Orphan>> {
    let mut removed = Vec::new();
    for c in list_managed(docker).await? {
        let labels = c.labels.clone().unwrap_or_default();
        let label = |k: &str| labels.get(k).cloned().unwrap_or_default();
        if owner_alive(&label(LABEL_OWNER_PID), &label(LABEL_OWNER_START), &label(LABEL_OWNER_BOOT)) {
            continue;
        }
        let id = c.id.clone().unwrap_or_default();
        stop_and_remove(docker, &id).await?;
        removed.push(Orphan {
            name: c
                .names
                .unwrap_or_default()
                .first()
                .map(|n| n.trim_start_matches('/').to_string())
                .unwrap_or_default(),
            version: label(LABEL_VERSION),
            job: label(LABEL_JOB),
            owner_pid: label(LABEL_OWNER_PID),
            state: c.state.map(|s| s.to_string()).unwrap_or_default(),
            id,
        });
    }
    Ok(removed)
}

/// Field 22 of /proc/<pid>/stat: start time in clock ticks since boot.
fn process_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    after_comm.split_whitespace().nth(19).map(str::to_string)
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

fn owner_alive(pid: &str, start: &str, boot: &str) -> bool {
    let Ok(pid) = pid.parse::<u32>() else { return false };
    if !boot.is_empty() && boot != boot_id() {
        return false;
    }
    match process_start(pid) {
        Some(now) => start.is_empty() || now == start,
        None => false,
    }
}

/// A container name: `pruefstand-<version>-<random>`.
fn container_name(version: &str) -> String {
    use rand::RngExt;
    let tag: u32 = rand::rng().random();
    format!("pruefstand-{}-{tag:08x}", path_word(version).chars().take(40).collect::<String>())
}

/// The value of a vLLM option in `args` (`--flag value` or `--flag=value`).
pub(crate) fn vllm_option<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, arg)| match arg.strip_prefix(flag) {
        Some("") => args.get(i + 1).map(String::as_str),
        Some(rest) => rest.strip_prefix('='),
        None => None,
    })
}

fn has_flag(args: &[String], flag: &str) -> bool {
    args.iter().any(|a| a == flag || a.strip_prefix(flag).is_some_and(|rest| rest.starts_with('=')))
}

/// What a docker version's vLLM arguments will cost a GPU hour to find out: tool
/// calling without its parser flags, a LoRA without a rank limit, a memory share that
/// unified memory cannot give. One line each, with the fix.
pub(crate) fn vllm_warnings(server: &ServerSetup) -> Vec<String> {
    if server.backend() != Backend::Docker {
        return Vec::new();
    }
    let args = &server.model.args;
    let mut warnings = Vec::new();
    if server.model.tool_calling == pruefstand_core::settings::defence::ToolCalling::Native
        && !(has_flag(args, "--enable-auto-tool-choice") && has_flag(args, "--tool-call-parser"))
    {
        warnings.push(
            "native tool calling needs vLLM's --enable-auto-tool-choice and --tool-call-parser (hermes for Qwen, \
             llama3_json for Llama 3.1+): without them every request with tools is refused"
                .to_string(),
        );
    }
    if (server.adapter.is_some() || server.model.runtime_lora) && !has_flag(args, "--max-lora-rank") {
        warnings.push(
            "a LoRA without --max-lora-rank: vLLM's default rank limit is 16, a higher-rank adapter fails to load \
             (pruefstand adds --enable-lora itself)"
                .to_string(),
        );
    }
    if server.model.gpu == GpuMode::Runtime {
        match vllm_option(args, "--gpu-memory-utilization").map(str::parse::<f64>) {
            Some(Ok(share)) if share > 0.8 => warnings.push(format!(
                "--gpu-memory-utilization {share} on an integrated GPU: unified memory is shared with the CPU and \
                 the page cache; keep it at 0.75–0.8"
            )),
            Some(Ok(_)) => {}
            Some(Err(_)) => warnings.push("--gpu-memory-utilization is not a number".to_string()),
            None => warnings.push(
                "no --gpu-memory-utilization on an integrated GPU: some images behave as if it were about 1.0 and run \
                 out of memory; set 0.75"
                    .to_string(),
            ),
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_image_of_ours_names_the_script_that_builds_it() {
        use super::missing_image;
        assert!(missing_image("pruefstand-vllm-cpu:current").contains("build it with `scripts/build-vllm-cpu-image`"));
        assert!(missing_image("pruefstand-sim:local").contains("scripts/build-sim-image"));
        assert!(missing_image("nvcr.io/nvidia/vllm:26.05-py3").contains("docker pull nvcr.io/nvidia/vllm:26.05-py3"));
    }

    use super::*;
    use pruefstand_core::spec::Version;

    fn version(text: &str) -> Version {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.toml");
        std::fs::write(&path, text).unwrap();
        Version::load(dir.path(), path.to_str().unwrap()).unwrap()
    }

    const SPEC: &str = r#"
[model]
backend = "docker"
image = "img:1"
served_name = "base"
path = "/srv/models/m"
gpu = "device-request"
args = ["--max-model-len", "4096", "--api-key", "oops"]
shm_size = "16g"
ulimits = { memlock = -1, stack = 67108864 }
[adapter]
name = "lora-a"
path = "/srv/adapters/a"
"#;

    #[test]
    fn vllm_arguments_are_checked_before_a_gpu_hour_is_spent() {
        let warnings = vllm_warnings(&ServerSetup::of(&version(&SPEC.replace("device-request", "runtime"))));
        let all = warnings.join("\n");
        assert_eq!(warnings.len(), 3, "{all}");
        assert!(all.contains("--enable-auto-tool-choice") && all.contains("--max-lora-rank"), "{all}");
        assert!(all.contains("no --gpu-memory-utilization"), "{all}");
        let high =
            SPEC.replace("device-request", "runtime").replace("\"4096\"", "\"4096\", \"--gpu-memory-utilization=0.9\"");
        assert!(
            vllm_warnings(&ServerSetup::of(&version(&high))).iter().any(|w| w.contains("0.9 on an integrated GPU"))
        );
        // The shipped Jetson specs follow the facts.
        for name in ["baseline", "kandidat"] {
            let shipped = Version::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("versions"), name).unwrap();
            assert_eq!(vllm_warnings(&ServerSetup::of(&shipped)), Vec::<String>::new(), "{name}");
            assert_eq!(vllm_option(&shipped.spec.model.args, "--max-model-len"), Some("32768"));
        }
    }

    #[test]
    fn command_mounts_labels_and_gpu() {
        let v = version(SPEC);
        let s = Setup::new(&ServerSetup::of(&v), "/srv/models/m".into(), Some("/srv/adapters/a".into())).unwrap();
        assert_eq!(
            s.command(),
            [
                "/model",
                "--served-model-name",
                "base",
                "--host",
                "0.0.0.0",
                "--port",
                "8000",
                "--enable-lora",
                "--lora-modules",
                "lora-a=/adapters/lora-a",
                "--max-model-len",
                "4096",
                "--api-key",
                "oops"
            ]
        );
        assert_eq!(pruefstand_core::spec::redact(&s.command()).last().unwrap(), "<redacted>");
        let body = s.body("k", 4242, HashMap::from([(LABEL_JOB.to_string(), "j".to_string())]));
        assert_eq!(body.env.as_ref().unwrap(), &["VLLM_API_KEY=k"]);
        assert!(!body.cmd.as_ref().unwrap().iter().any(|w| w.contains("VLLM_API_KEY") || w == "k"));
        let host = body.host_config.unwrap();
        assert_eq!(host.shm_size, Some(16 << 30));
        assert_eq!(host.ulimits.unwrap().len(), 2);
        assert_eq!(host.device_requests.unwrap()[0].driver.as_deref(), Some("nvidia"));
        let binding = &host.port_bindings.unwrap()["8000/tcp"].clone().unwrap()[0];
        assert_eq!((binding.host_ip.as_deref(), binding.host_port.as_deref()), (Some("127.0.0.1"), Some("4242")));
        let mounts = host.mounts.unwrap();
        assert!(mounts.iter().filter(|m| m.typ == Some(MountType::BIND)).all(|m| m.read_only == Some(true)));
        assert_eq!(mounts.iter().filter(|m| m.typ == Some(MountType::BIND)).count(), 2);
        let labels = body.labels.unwrap();
        assert_eq!(labels[LABEL_MANAGED], "1");
        assert_eq!(labels[LABEL_OWNER_PID], std::process::id().to_string());
        assert!(owner_alive(&labels[LABEL_OWNER_PID], &labels[LABEL_OWNER_START], &labels[LABEL_OWNER_BOOT]));
        assert!(!owner_alive("999999999", "1", ""));
    }

    #[test]
    fn a_chat_template_and_a_tool_parser_plugin_are_mounted_read_only_and_their_content_is_in_the_reuse_key() {
        for (kind, name) in
            [(ServedFileKind::ChatTemplate, "tools.jinja"), (ServedFileKind::ToolParserPlugin, "parser.py")]
        {
            let (field, flag, target) = (kind.field(), kind.flag(), kind.container_path());
            let dir = tempfile::tempdir().unwrap();
            let spec = dir.path().join("v.toml");
            std::fs::write(&spec, SPEC.replace("gpu = ", &format!("{field} = \"{name}\"\ngpu = "))).unwrap();
            let err = Version::load(dir.path(), spec.to_str().unwrap()).unwrap_err().to_string();
            assert!(err.contains("v.toml:") && err.contains(&format!("model.{field}")) && err.contains(name), "{err}");
            std::fs::write(dir.path().join(name), "{{ messages }}").unwrap();
            let v = Version::load(dir.path(), spec.to_str().unwrap()).unwrap();
            let setup =
                || Setup::new(&ServerSetup::of(&v), "/srv/models/m".into(), Some("/srv/adapters/a".into())).unwrap();
            let s = setup();
            let command = s.command();
            let at = command.iter().position(|w| w == flag).unwrap_or_else(|| panic!("{flag} passed: {command:?}"));
            assert_eq!(command[at + 1], target);
            let mounts = s.mounts();
            let file = mounts.iter().find(|m| m.target.as_deref() == Some(target)).unwrap();
            assert_eq!(file.source.as_deref(), Some(dir.path().join(name).to_str().unwrap()));
            assert_eq!(file.read_only, Some(true));
            // Another file is another server; the same one is the same server.
            let key = s.key();
            std::fs::write(dir.path().join(name), "{{ messages | tojson }}").unwrap();
            assert_ne!(setup().key(), key, "{field}");
            std::fs::write(dir.path().join(name), "{{ messages }}").unwrap();
            assert_eq!(setup().key(), key, "{field}");
        }
    }

    #[test]
    fn reuse_key_ignores_the_adapter_only_with_runtime_lora() {
        let fixed = |spec: &str, adapter: &str| {
            let v = version(&spec.replace("/srv/adapters/a", adapter));
            Setup::new(&ServerSetup::of(&v), "/srv/models/m".into(), Some(adapter.into())).unwrap().key()
        };
        assert_ne!(fixed(SPEC, "/srv/adapters/a"), fixed(SPEC, "/srv/adapters/b"));
        let runtime = SPEC.replace("shm_size", "runtime_lora = true\nshm_size");
        assert_eq!(fixed(&runtime, "/srv/adapters/a"), fixed(&runtime, "/srv/adapters/b"));
        let other_args = runtime.replace("4096", "8192");
        assert_ne!(fixed(&runtime, "/srv/adapters/a"), fixed(&other_args, "/srv/adapters/a"));
        let v = version(&runtime);
        let s = Setup::new(&ServerSetup::of(&v), "/srv/models/m".into(), Some("/srv/adapters/a".into())).unwrap();
        let a = s.adapter.as_ref().unwrap();
        assert_eq!((a.mount_target.as_str(), a.container_path.as_str()), ("/adapters", "/adapters/a"));
        assert!(
            s.body("k", 1, HashMap::new()).env.unwrap().contains(&"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True".to_string())
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(pruefstand_core::util::parse_bytes("16g").unwrap(), 16 << 30);
        assert_eq!(pruefstand_core::util::parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(pruefstand_core::util::parse_bytes("1024").unwrap(), 1024);
        assert!(
            pruefstand_core::util::parse_bytes("lots").is_err() && pruefstand_core::util::parse_bytes("-1g").is_err()
        );
    }
}
