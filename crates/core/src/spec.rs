//! Version specs: `versions/NAME.toml` (README, "Versions") — model (+ image and args),
//! adapter, guardrail, simulated human, reference — parsed into typed structs and
//! validated, with every error naming the file, line, column and what was expected.
//!
//! A spec says what to run, not how: bringing the model up is `run`'s (and later the
//! container's) job.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::family;
use crate::input;
use crate::settings::defence::{AgentdojoDefence, GuardrailSpec, HumanSpec, ToolCalling, ToolResultRole};
use crate::settings::sim::SimConfig;
use crate::settings::url::SecretUrl;
use crate::util;

#[derive(Deserialize, Serialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct VersionSpec {
    #[serde(default)]
    pub description: String,
    /// The version compared with in R4; none = R4 not applicable.
    #[serde(default)]
    pub reference: Option<Spanned<String>>,
    pub model: ModelSpec,
    #[serde(default)]
    pub adapter: Option<AdapterSpec>,
    #[serde(default)]
    pub guardrail: GuardrailSpec,
    #[serde(default)]
    pub human: HumanSpec,
    /// The simulated model's behaviour (backend "sim", or the sim image in Docker).
    #[serde(default)]
    pub sim: Option<SimConfig>,
    /// An agent of the version's own speaking the protocol, instead of `pruefstand
    /// agent`; it gets the model's URL and name in the environment.
    #[serde(default)]
    pub agent_cmd: Option<Vec<String>>,
    /// Attack families the version was trained against (docs/attacks.md): never held
    /// out for it, and the "seen" side of the generalisation gap.
    #[serde(default)]
    pub trained_on: Vec<Spanned<String>>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// A vLLM container started through Docker.
    Docker,
    /// The simulated model, in-process: no GPU.
    Sim,
    /// An already-running OpenAI-compatible server at `url`.
    External,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum GpuMode {
    /// Jetson: `HostConfig.Runtime = "nvidia"`.
    #[default]
    Runtime,
    /// `--gpus all` (device requests) elsewhere.
    DeviceRequest,
    /// CDI `nvidia.com/gpu=all`.
    Cdi,
    /// No GPU (the simulated model's image).
    None,
}

#[derive(Deserialize, Serialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub backend: Spanned<Backend>,
    /// The model name the server serves (vLLM `--served-model-name`).
    pub served_name: String,
    #[serde(default)]
    pub image: Option<String>,
    /// Host folder of the weights, mounted read-only.
    #[serde(default)]
    pub path: Option<PathBuf>,
    #[serde(default)]
    pub gpu: GpuMode,
    /// Extra server arguments (argv, never a shell string).
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub tool_calling: ToolCalling,
    /// Prompted mode: the role tool results carry (`user`, `tool`, `input`). Skipped
    /// when `user`, so specs written before it keep their hash.
    #[serde(default, skip_serializing_if = "ToolResultRole::is_user")]
    pub tool_result_role: ToolResultRole,
    /// Base URL of an `external` server, e.g. `http://127.0.0.1:8000/v1`; shown and
    /// recorded with its userinfo and query values hidden.
    #[serde(default)]
    pub url: Option<SecretUrl>,
    /// Environment variable holding the `external` server's API key (preferred over
    /// credentials in `url`).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The name AgentDojo's important_instructions attacks address the model by.
    #[serde(default = "default_display_name")]
    pub display_name: String,
    // Docker only (the container module). Defaults are skipped when serialized, so
    // adding a field does not change the hash of existing specs.
    /// Words before the serve arguments when the image's entrypoint is not already
    /// `vllm serve`, e.g. `["vllm", "serve"]` for NGC images. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Size of /dev/shm, e.g. "16g" (NVIDIA's runs); Docker's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<String>,
    /// The container's IPC namespace: "host" as NVIDIA's Jetson recipe runs vLLM (its
    /// workers share memory through /dev/shm), "private" or "shareable"; Docker's
    /// default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc: Option<String>,
    /// ulimits (soft = hard), e.g. `{ memlock = -1, stack = 67108864 }`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub ulimits: std::collections::BTreeMap<String, i64>,
    /// A warm server of the same base may take this version's adapter at run time
    /// (vLLM's runtime LoRA updating) instead of being restarted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub runtime_lora: bool,
    /// `max_tokens` of every agent request: a model that does not stop ends its turn
    /// there (`finish_reason: "length"`, a scored malformed output) instead of
    /// generating to the end of its context. Absent: the agent's default
    /// (`agent::llm::DEFAULT_MAX_TOKENS`, 2,048); `pruefstand check <version>` shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Seconds without a token, once a model's answer has begun, that end its turn
    /// (scored as cut off, never re-sent); the agent's default (60) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_s: Option<f64>,
    /// Seconds the server may take to serve after start (cold start); default 900.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_timeout_s: Option<f64>,
    /// A chat template of the bench root's own (a Jinja file; relative to the spec's
    /// folder), mounted read-only into the container and passed as `--chat-template`:
    /// the template decides how the model is asked for tool calls, and so which
    /// tool-call parser can read them. The server's (the model folder's) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<Spanned<PathBuf>>,
    /// A vLLM tool-parser plugin of the bench root's own (a Python file; relative to the
    /// spec's folder), mounted read-only into the container and passed as
    /// `--tool-parser-plugin`; `args` pick the parser it registers
    /// (`--tool-call-parser NAME`). For a parser the server's own version lacks or gets
    /// wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_parser_plugin: Option<Spanned<PathBuf>>,
    /// Pull the image when it is not present locally. Off by default: a missing image
    /// is an error naming it (the Jetson's network may have no registry).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pull: bool,
}

fn default_display_name() -> String {
    "Local model".to_string()
}

#[derive(Deserialize, Serialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct AdapterSpec {
    /// The LoRA's served name: the agent sends it as `model`.
    pub name: String,
    /// Host folder of the adapter, mounted read-only (required for `docker`).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// The exports (`pruefstand export`, docs/training.md) the adapter was trained on,
    /// relative to the spec's folder: `check` and R1 fail when one holds rows of a
    /// family the plan holds out. Skipped when empty, so older specs keep their hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trained_on_exports: Vec<Spanned<PathBuf>>,
    /// The environments (`scripts/pruefstand_env`) the adapter was trained online in:
    /// each one's manifest (`DIR/dataset.jsonl.manifest.json`, the dataset beside it),
    /// relative to the spec's folder. The held-out guard reads the families it offered
    /// as it reads an export's. Skipped when empty, so older specs keep their hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trained_online: Vec<Spanned<PathBuf>>,
}

/// What an environment's manifest is named beside its dataset (as an export's beside it).
pub const MANIFEST_SUFFIX: &str = ".manifest.json";

/// A loaded, validated version.
#[derive(Clone, Debug)]
pub struct Version {
    pub name: String,
    pub path: PathBuf,
    pub spec: VersionSpec,
    /// sha256 of the spec's canonical JSON (comments and layout do not count).
    pub hash: String,
    /// Where a reference given by name is found: the root's `versions/`, or a queued
    /// job's snapshot of its references (`Queue::materialise`).
    pub versions_dir: PathBuf,
    /// The folder the files it names (exports, served files) are relative to: the
    /// spec's own, or for a queued job's snapshot the one the spec was queued from.
    pub files_dir: PathBuf,
    /// Where the files of the versions it finds by name are relative to (its reference
    /// loaded from a snapshot).
    pub origins: Origins,
}

/// The folder each version's relative file paths start at, by version name, where that
/// is not its spec file's own folder: a queued job holds copies of its specs (the
/// version's and its references'), while the files they name stay where the specs were
/// queued from. Empty for a spec read where it lies.
#[derive(Clone, Debug, Default)]
pub struct Origins(Arc<BTreeMap<String, PathBuf>>);

impl Origins {
    pub fn new(folders: BTreeMap<String, PathBuf>) -> Origins {
        Origins(Arc::new(folders))
    }

    /// The folder `name`'s files start at, when it is not beside its spec.
    pub fn of(&self, name: &str) -> Option<&Path> {
        self.0.get(name).map(PathBuf::as_path)
    }
}

impl Version {
    /// `NAME` from `<root>/versions/`, or a path to a spec file (`input::Named`).
    pub(crate) fn locate(versions_dir: &Path, name_or_path: &str) -> PathBuf {
        input::Named::new("version", name_or_path, versions_dir).path
    }

    pub fn load(versions_dir: &Path, name_or_path: &str) -> anyhow::Result<Version> {
        Version::load_in(versions_dir, name_or_path, Origins::default())
    }

    /// [`Version::load`], the files it names relative to the folder `origins` gives for
    /// it (where it does: a job's snapshot), else to its spec's folder.
    pub(crate) fn load_in(versions_dir: &Path, name_or_path: &str, origins: Origins) -> anyhow::Result<Version> {
        let named = input::Named::new("version", name_or_path, versions_dir);
        let text = named.read()?;
        if input::Named::is_path(name_or_path) {
            tracing::debug!("the {}", named.describe());
        }
        let path = named.path;
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        // The name becomes a folder under reports/.
        input::check_name(&name)
            .map_err(|why| anyhow::anyhow!("{}: not a usable version name: {why}", path.display()))?;
        let files_dir = origins.of(&name).map_or_else(|| spec_folder(&path).to_path_buf(), Path::to_path_buf);
        let spec = parse_in(&path, &text, versions_dir, &files_dir)?;
        let hash = util::sha256_hex(serde_json::to_string(&spec)?.as_bytes());
        Ok(Version { name, path, spec, hash, versions_dir: versions_dir.to_path_buf(), files_dir, origins })
    }

    /// A version that is only an agent command (`pruefstand gym`): no model server of
    /// pruefstand's, no defences; `display_name` is how the attacks address its model.
    /// Its hash covers the command and that name, so a gym run resumes by them.
    pub fn of_agent_command(name: &str, agent_cmd: Vec<String>, display_name: &str) -> anyhow::Result<Version> {
        input::check_name(name).map_err(|why| anyhow::anyhow!("{name:?} is not a usable run name: {why}"))?;
        let hash = util::sha256_hex(serde_json::to_string(&(&agent_cmd, display_name))?.as_bytes());
        // Through TOML text: the spec's spans (`toml::Spanned`) deserialize from nothing else.
        let mut model = toml::Table::new();
        model.insert("backend".into(), "external".into());
        model.insert("served_name".into(), "".into());
        model.insert("display_name".into(), display_name.into());
        let mut table = toml::Table::new();
        table.insert("description".into(), "an agent command run by `pruefstand gym`".into());
        table.insert("agent_cmd".into(), agent_cmd.into());
        table.insert("model".into(), model.into());
        let spec: VersionSpec = toml::from_str(&toml::to_string(&table)?)?;
        Ok(Version {
            name: name.to_string(),
            path: PathBuf::new(),
            spec,
            hash,
            versions_dir: PathBuf::new(),
            files_dir: PathBuf::new(),
            origins: Origins::default(),
        })
    }

    /// The model name the agent sends: the adapter's when there is one (vLLM serves
    /// LoRAs under their own names).
    pub fn request_model(&self) -> &str {
        self.spec.adapter.as_ref().map_or(&self.spec.model.served_name, |a| &a.name)
    }

    /// A file the model's container reads, on this machine: its `model.*` field
    /// resolved against the spec's folder ([`Version::files_dir`]).
    pub fn served_file(&self, kind: ServedFileKind) -> Option<PathBuf> {
        Some(self.files_dir.join(self.spec.model.served_file(kind)?.get_ref()))
    }

    /// Every file the spec names for the model's container, in `ServedFileKind::ALL`'s
    /// order.
    pub fn served_files(&self) -> Vec<(ServedFileKind, PathBuf)> {
        ServedFileKind::ALL.into_iter().filter_map(|kind| Some((kind, self.served_file(kind)?))).collect()
    }

    /// The adapter's `trained_on_exports` on this machine, resolved against the spec's
    /// folder ([`Version::files_dir`]).
    pub fn trained_on_exports(&self) -> Vec<PathBuf> {
        let exports = self.spec.adapter.iter().flat_map(|a| &a.trained_on_exports);
        exports.map(|e| self.files_dir.join(e.get_ref())).collect()
    }

    /// Every data file the adapter was trained on, each with its manifest beside it
    /// (what the held-out guard reads): the exports, then the datasets of the
    /// environments it was trained online in (`trained_online` names their manifests).
    pub fn training_data(&self) -> Vec<PathBuf> {
        let online = self.spec.adapter.iter().flat_map(|a| &a.trained_online);
        let datasets = online.filter_map(|m| dataset_of(&self.files_dir.join(m.get_ref())));
        self.trained_on_exports().into_iter().chain(datasets).collect()
    }

    pub fn reference(&self) -> Option<&str> {
        self.spec.reference.as_ref().map(|r| r.get_ref().as_str())
    }

    /// The reference, loaded from where this version finds it ([`Version::versions_dir`]),
    /// its files where [`Version::origins`] says.
    pub fn load_reference(&self) -> Option<anyhow::Result<Version>> {
        self.reference().map(|name| Version::load_in(&self.versions_dir, name, self.origins.clone()))
    }
}

/// The files of the bench root's that a spec may have mounted into the model's
/// container, one table for the spec's check, `check`'s report, the container's command
/// line and mounts, and provenance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServedFileKind {
    ChatTemplate,
    ToolParserPlugin,
}

impl ServedFileKind {
    pub const ALL: [ServedFileKind; 2] = [ServedFileKind::ChatTemplate, ServedFileKind::ToolParserPlugin];

    /// Its field in `[model]`, and its key in `provenance.json`'s `files`.
    pub fn field(self) -> &'static str {
        match self {
            ServedFileKind::ChatTemplate => "chat_template",
            ServedFileKind::ToolParserPlugin => "tool_parser_plugin",
        }
    }

    /// What it is, for people.
    pub fn label(self) -> &'static str {
        match self {
            ServedFileKind::ChatTemplate => "chat template",
            ServedFileKind::ToolParserPlugin => "tool-parser plugin",
        }
    }

    /// What the file must be, for an error naming a wrong one.
    pub fn expected(self) -> &'static str {
        match self {
            ServedFileKind::ChatTemplate => "a Jinja chat template",
            ServedFileKind::ToolParserPlugin => "a vLLM tool-parser plugin, a Python file",
        }
    }

    /// vLLM's flag that names it.
    pub fn flag(self) -> &'static str {
        match self {
            ServedFileKind::ChatTemplate => "--chat-template",
            ServedFileKind::ToolParserPlugin => "--tool-parser-plugin",
        }
    }

    /// Where it is bind-mounted (read-only) inside the container.
    pub fn container_path(self) -> &'static str {
        match self {
            ServedFileKind::ChatTemplate => "/chat_template.jinja",
            ServedFileKind::ToolParserPlugin => "/tool_parser_plugin.py",
        }
    }
}

impl ModelSpec {
    /// The spec's entry for one served file, with where it stands in the text.
    pub fn served_file(&self, kind: ServedFileKind) -> Option<&Spanned<PathBuf>> {
        match kind {
            ServedFileKind::ChatTemplate => self.chat_template.as_ref(),
            ServedFileKind::ToolParserPlugin => self.tool_parser_plugin.as_ref(),
        }
    }
}

/// The folder of a spec file, where the files it names (`model.chat_template`,
/// `model.tool_parser_plugin`, an adapter's export) are relative to.
fn spec_folder(spec_path: &Path) -> &Path {
    spec_path.parent().unwrap_or(Path::new("."))
}

/// Parses and validates one spec text: syntax, then each table's own checks in turn
/// (the first error found is the one reported).
pub fn parse(path: &Path, text: &str, versions_dir: &Path) -> anyhow::Result<VersionSpec> {
    parse_in(path, text, versions_dir, spec_folder(path))
}

/// [`parse`], the files the spec names relative to `files_dir` (a job's snapshot: the
/// folder the spec was queued from).
fn parse_in(path: &Path, text: &str, versions_dir: &Path, files_dir: &Path) -> anyhow::Result<VersionSpec> {
    // Syntax first, so a structural check below can rely on a table.
    let table: toml::Table = input::parse_toml(path, text)?;
    if table.contains_key("adapter") && !table.contains_key("model") {
        return Err(input::at(
            path,
            text,
            key_offset(text, "[adapter]"),
            "an [adapter] needs the [model] it adapts: add a [model] table",
        ));
    }
    let spec: VersionSpec = input::parse_toml(path, text)?;
    let source = Source { path, text, files_dir };
    check_backend(&spec, &source)?;
    check_model_limits(&spec.model, &source)?;
    check_reference(&spec, &source, versions_dir)?;
    check_adapter(&spec, &source)?;
    check_families(&spec, &source)?;
    check_tool_result_role(&spec.model, &source)?;
    check_guardrail(&spec.guardrail, &|key: &str, message: &str| {
        source.bad(key_in_table(text, "guardrail", key), &format!("guardrail.{key}: {message}"))
    })?;
    check_agent_cmd(&spec, &source)?;
    Ok(spec)
}

/// The spec's file and text, for errors at `file:line:col`.
struct Source<'a> {
    path: &'a Path,
    text: &'a str,
    /// Where the files it names are relative to.
    files_dir: &'a Path,
}

impl Source<'_> {
    fn bad(&self, offset: usize, message: &str) -> anyhow::Error {
        input::at(self.path, self.text, offset, message)
    }

    fn key(&self, key: &str) -> usize {
        key_offset(self.text, key)
    }
}

/// `[model] backend` and what it needs: docker its image and folders, external its URL;
/// the served files only where a container mounts them.
fn check_backend(spec: &VersionSpec, source: &Source) -> anyhow::Result<()> {
    let model = &spec.model;
    let backend_at = model.backend.span().start;
    match model.backend.get_ref() {
        Backend::Docker => check_docker(spec, source)?,
        _ if let Some((kind, named)) =
            ServedFileKind::ALL.into_iter().find_map(|kind| Some((kind, model.served_file(kind)?))) =>
        {
            return Err(source.bad(
                named.span().start,
                &format!(
                    "model.{} is mounted into the model's container: it needs backend \"docker\" (an external server is started with its own {})",
                    kind.field(),
                    kind.flag()
                ),
            ));
        }
        Backend::External => {
            if model.url.is_none() {
                return Err(
                    source.bad(backend_at, "backend \"external\" needs model.url (e.g. \"http://127.0.0.1:8000/v1\")")
                );
            }
        }
        Backend::Sim => {}
    }
    Ok(())
}

/// A docker model's image, folders, container options and served files.
fn check_docker(spec: &VersionSpec, source: &Source) -> anyhow::Result<()> {
    let model = &spec.model;
    let backend_at = model.backend.span().start;
    if model.image.is_none() {
        return Err(source.bad(
            backend_at,
            "backend \"docker\" needs model.image (the vLLM image, e.g. \"nvcr.io/nvidia/vllm:25.09-py3\")",
        ));
    }
    // With a [sim] table the image is the simulated model: its model folder
    // (sim.toml, truth.json) and adapter folders are generated per run.
    let generated = spec.sim.is_some();
    if model.path.is_none() && !generated {
        return Err(source.bad(backend_at, "backend \"docker\" needs model.path (the host folder of the weights)"));
    }
    check_container_options(model, source)?;
    for kind in ServedFileKind::ALL {
        if let Some(named) = model.served_file(kind) {
            let file = source.files_dir.join(named.get_ref());
            if !file.is_file() {
                return Err(source.bad(
                    named.span().start,
                    &format!(
                        "model.{}: {} is not a file ({}; relative paths start at the spec's folder)",
                        kind.field(),
                        file.display(),
                        kind.expected()
                    ),
                ));
            }
        }
    }
    if let Some(adapter) = &spec.adapter
        && adapter.path.is_none()
        && !generated
    {
        return Err(
            source.bad(source.key("[adapter]"), "backend \"docker\" needs adapter.path (the host folder of the LoRA)")
        );
    }
    Ok(())
}

/// A docker model's `ipc`, `shm_size` and `ready_timeout_s`.
fn check_container_options(model: &ModelSpec, source: &Source) -> anyhow::Result<()> {
    if let Some(ipc) = &model.ipc
        && !["host", "private", "shareable"].contains(&ipc.as_str())
    {
        return Err(source
            .bad(source.key("ipc"), &format!("model.ipc = {ipc:?}: expected \"host\", \"private\" or \"shareable\"")));
    }
    if let Some(size) = &model.shm_size
        && let Err(err) = util::parse_bytes(size)
    {
        return Err(source.bad(source.key("shm_size"), &format!("model.shm_size: {err}")));
    }
    if model.ready_timeout_s.is_some_and(|t| !(t > 0.0 && t.is_finite())) {
        return Err(
            source.bad(source.key("ready_timeout_s"), "model.ready_timeout_s must be a positive number of seconds")
        );
    }
    Ok(())
}

/// `[model] max_tokens` and `idle_timeout_s`: the bounds of every agent turn.
fn check_model_limits(model: &ModelSpec, source: &Source) -> anyhow::Result<()> {
    if model.max_tokens == Some(0) {
        return Err(source.bad(source.key("max_tokens"), "model.max_tokens must be at least 1"));
    }
    if model.idle_timeout_s.is_some_and(|t| !(t > 0.0 && t <= 86_400.0)) {
        return Err(
            source.bad(source.key("idle_timeout_s"), "model.idle_timeout_s must be a number of seconds in (0, 86400]")
        );
    }
    Ok(())
}

/// `reference`: another version that exists.
fn check_reference(spec: &VersionSpec, source: &Source, versions_dir: &Path) -> anyhow::Result<()> {
    let Some(reference) = &spec.reference else { return Ok(()) };
    let name = reference.get_ref();
    let own = source.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    if name == &own {
        return Err(source.bad(reference.span().start, "a version cannot be its own reference"));
    }
    let reference_path = Version::locate(versions_dir, name);
    if !reference_path.is_file() {
        return Err(source.bad(
            reference.span().start,
            &format!("reference {name:?} names no version: {} does not exist", reference_path.display()),
        ));
    }
    Ok(())
}

/// The dataset an environment's manifest lies beside: its path less [`MANIFEST_SUFFIX`];
/// None when the name does not end in it.
pub(crate) fn dataset_of(manifest: &Path) -> Option<PathBuf> {
    let name = manifest.file_name()?.to_str()?;
    let data = name.strip_suffix(MANIFEST_SUFFIX).filter(|d| !d.is_empty())?;
    Some(manifest.with_file_name(data))
}

/// `[adapter] trained_on_exports` and `trained_online`: files that exist (an
/// environment's manifest with its dataset beside it).
fn check_adapter(spec: &VersionSpec, source: &Source) -> anyhow::Result<()> {
    for manifest in spec.adapter.iter().flat_map(|a| &a.trained_online) {
        let file = source.files_dir.join(manifest.get_ref());
        let problem = match dataset_of(&file) {
            None => Some(format!("its name does not end in {MANIFEST_SUFFIX}")),
            Some(_) if !file.is_file() => Some("it is not a file".to_string()),
            Some(data) if !data.is_file() => Some(format!("its dataset {} is not a file", data.display())),
            Some(_) => None,
        };
        if let Some(problem) = problem {
            return Err(source.bad(
                manifest.span().start,
                &format!(
                    "adapter.trained_online: {}: {problem} (an environment's manifest, `DIR/dataset.jsonl{MANIFEST_SUFFIX}` that `pruefstand_env` wrote; relative paths start at the spec's folder)",
                    file.display()
                ),
            ));
        }
    }
    for export in spec.adapter.iter().flat_map(|a| &a.trained_on_exports) {
        let file = source.files_dir.join(export.get_ref());
        if !file.is_file() {
            return Err(source.bad(
                export.span().start,
                &format!(
                    "adapter.trained_on_exports: {} is not a file (an export `pruefstand export` wrote; relative paths start at the spec's folder)",
                    file.display()
                ),
            ));
        }
    }
    Ok(())
}

/// The attack families named in `trained_on` and in `[sim]`'s `susceptibility_by_family`.
fn check_families(spec: &VersionSpec, source: &Source) -> anyhow::Result<()> {
    for name in &spec.trained_on {
        if family::family(name.get_ref()).is_none() {
            let message =
                format!("trained_on: unknown family {:?}; valid: {}", name.get_ref(), family::names().join(", "));
            return Err(source.bad(name.span().start, &message));
        }
    }
    let by_family = spec.sim.iter().flat_map(|sim| sim.models.values()).flat_map(|b| b.susceptibility_by_family.keys());
    for name in by_family {
        if family::family(name).is_none() {
            let message =
                format!("susceptibility_by_family: unknown family {name:?}; valid: {}", family::names().join(", "));
            return Err(source.bad(source.key(name), &message));
        }
    }
    Ok(())
}

/// `[model] tool_result_role`: other than `user` only with prompted tool calling.
fn check_tool_result_role(model: &ModelSpec, source: &Source) -> anyhow::Result<()> {
    if !model.tool_result_role.is_user() && model.tool_calling == ToolCalling::Native {
        return Err(source.bad(
            source.key("tool_result_role"),
            &format!(
                "model.tool_result_role = {:?} needs tool_calling = \"prompted\": native tool calling sends tool results as role \"tool\" always",
                model.tool_result_role.as_str()
            ),
        ));
    }
    Ok(())
}

/// `agent_cmd`: a non-empty argv when given.
fn check_agent_cmd(spec: &VersionSpec, source: &Source) -> anyhow::Result<()> {
    if let Some(argv) = &spec.agent_cmd
        && argv.is_empty()
    {
        return Err(source.bad(
            source.key("agent_cmd"),
            "agent_cmd must be a non-empty argv array, e.g. [\"python3\", \"my_agent.py\"]",
        ));
    }
    Ok(())
}

/// The guardrail's values that serde cannot bound: numbers, URLs, names.
fn check_guardrail(guardrail: &GuardrailSpec, bad: &dyn Fn(&str, &str) -> anyhow::Error) -> anyhow::Result<()> {
    match guardrail {
        GuardrailSpec::Classifier(c) => {
            if !(0.0..=1.0).contains(&c.threshold) {
                return Err(bad("threshold", &format!("{} is not a probability in [0, 1]", c.threshold)));
            }
            if !(c.timeout_s > 0.0 && c.timeout_s <= 600.0) {
                return Err(bad("timeout_s", &format!("{} is not a number of seconds in (0, 600]", c.timeout_s)));
            }
            if let Some(Err(err)) = c.url.as_ref().map(|url| SecretUrl::parse(url.expose())) {
                return Err(bad("url", &err));
            }
            for (key, value) in [("model", &c.model), ("safe_label", &c.safe_label)] {
                if value.trim().is_empty() {
                    return Err(bad(key, "must not be empty"));
                }
            }
        }
        GuardrailSpec::Agentdojo { defence, model: Some(_) } if *defence != AgentdojoDefence::ToolFilter => {
            return Err(bad(
                "model",
                &format!("only defence = \"tool_filter\" calls a model; {} takes no model", defence.as_str()),
            ));
        }
        GuardrailSpec::Agentdojo { model: Some(model), .. } if model.trim().is_empty() => {
            return Err(bad("model", "must not be empty (leave it out for the version's own model)"));
        }
        GuardrailSpec::Http { url, threshold, timeout_s } => {
            if let Err(err) = SecretUrl::parse(url.expose()) {
                return Err(bad("url", &err));
            }
            if !threshold.is_finite() {
                return Err(bad("threshold", &format!("{threshold} is not a number")));
            }
            if !(*timeout_s > 0.0 && *timeout_s <= 600.0) {
                return Err(bad("timeout_s", &format!("{timeout_s} is not a number of seconds in (0, 600]")));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Where `key` first appears at the start of a line inside `[table]`; the table's
/// header when the key is not written there, 0 without the table.
fn key_in_table(text: &str, table: &str, key: &str) -> usize {
    let header = format!("[{table}]");
    let mut offset = 0;
    let mut inside = false;
    let mut header_at = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.starts_with('[') {
            inside = trimmed.starts_with(&header);
            if inside {
                header_at = offset + indent;
            }
        } else if inside && trimmed.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('=')) {
            return offset + indent;
        }
        offset += line.len();
    }
    header_at
}

/// Where a key (or table header) first appears at the start of a line; 0 if nowhere.
fn key_offset(text: &str, key: &str) -> usize {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with(key) {
            return offset + (line.len() - line.trim_start().len());
        }
        offset += line.len();
    }
    0
}

/// A model server's exact command for provenance, logs and reports: the API key never appears in argv, but
/// a spec could carry `--api-key` in its args — redact it all the same.
pub fn redact(argv: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut hide_next = false;
    for word in argv {
        if hide_next {
            out.push("<redacted>".into());
            hide_next = false;
        } else if word == "--api-key" {
            out.push(word.clone());
            hide_next = true;
        } else if word.starts_with("--api-key=") {
            out.push("--api-key=<redacted>".into());
        } else {
            out.push(word.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"description = "demo"
reference = "base"

[model]
backend = "sim"
served_name = "sim/qwen3-8b"

[adapter]
name = "inj-harden-r3"

[guardrail]
kind = "heuristic"

[human]
policy = "task_scoped"

[sim]
seed = 7
[sim.models."inj-harden-r3"]
susceptibility = 0.02
"#;

    fn check(text: &str) -> anyhow::Result<VersionSpec> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("base.toml"), "").unwrap();
        let path = dir.path().join("cand.toml");
        parse(&path, text, dir.path())
            .map_err(|e| anyhow::anyhow!("{}", e.to_string().replace(&dir.path().display().to_string(), "DIR")))
    }

    fn error(text: &str) -> String {
        check(text).unwrap_err().to_string()
    }

    #[test]
    fn a_good_spec_parses_into_types() {
        let spec = check(GOOD).unwrap();
        assert_eq!(*spec.model.backend.get_ref(), Backend::Sim);
        assert_eq!(spec.guardrail, GuardrailSpec::Heuristic { extra_patterns: vec![] });
        assert_eq!(spec.human, HumanSpec::TaskScoped);
        assert_eq!(spec.sim.unwrap().models["inj-harden-r3"].susceptibility, 0.02);
        assert_eq!(spec.model.display_name, "Local model");
    }

    #[test]
    fn files_mounted_into_the_container_are_refused_at_their_line_without_one() {
        for kind in ServedFileKind::ALL {
            let (field, flag) = (kind.field(), kind.flag());
            let spec = GOOD.replace("served_name = \"sim/qwen3-8b\"", &format!("served_name = \"m\"\n{field} = \"f\""));
            let err = error(&spec);
            assert!(
                err.starts_with(&format!("DIR/cand.toml:7:{}: model.{field} is mounted", field.len() + 4)),
                "{err}"
            );
            assert!(err.contains(&format!("its own {flag}")), "{err}");
        }
    }

    #[test]
    fn an_adapters_exports_resolve_against_the_spec_folder_and_a_missing_one_is_refused_at_its_line() {
        let with_export = |path: &str| {
            GOOD.replace(
                "name = \"inj-harden-r3\"",
                &format!("name = \"inj-harden-r3\"\ntrained_on_exports = [{path:?}]"),
            )
        };
        let err = error(&with_export("exports/dpo.jsonl"));
        assert!(
            err.starts_with("DIR/cand.toml:10:23: adapter.trained_on_exports: DIR/exports/dpo.jsonl is not a file"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("base.toml"), "").unwrap();
        std::fs::create_dir(dir.path().join("exports")).unwrap();
        std::fs::write(dir.path().join("exports/dpo.jsonl"), "").unwrap();
        let path = dir.path().join("cand.toml");
        std::fs::write(&path, with_export("exports/dpo.jsonl")).unwrap();
        let version = Version::load(dir.path(), &path.to_string_lossy()).unwrap();
        assert_eq!(version.trained_on_exports(), [dir.path().join("exports/dpo.jsonl")]);
        // A copy of the spec elsewhere (a job's snapshot) finds the files where the
        // origins say, under the version's name.
        let copy = dir.path().join("snapshot/cand.toml");
        std::fs::create_dir(copy.parent().unwrap()).unwrap();
        std::fs::copy(&path, &copy).unwrap();
        let origins = Origins::new([("cand".to_string(), dir.path().to_path_buf())].into());
        let version = Version::load_in(dir.path(), &copy.to_string_lossy(), origins).unwrap();
        assert_eq!(version.trained_on_exports(), [dir.path().join("exports/dpo.jsonl")]);
        let err = Version::load(dir.path(), &copy.to_string_lossy()).unwrap_err().to_string();
        assert!(err.contains("snapshot/exports/dpo.jsonl is not a file"), "{err}");
        let plain = check(GOOD).unwrap();
        assert!(!serde_json::to_string(&plain).unwrap().contains("trained_on_exports"), "older specs keep their hash");
    }

    #[test]
    fn an_environment_manifest_names_its_dataset_and_a_missing_one_is_refused_at_its_line() {
        let with = |path: &str| {
            GOOD.replace("name = \"inj-harden-r3\"", &format!("name = \"inj-harden-r3\"\ntrained_online = [{path:?}]"))
        };
        let err = error(&with("envs/n1/dataset.jsonl.manifest.json"));
        assert!(
            err.starts_with(
                "DIR/cand.toml:10:19: adapter.trained_online: DIR/envs/n1/dataset.jsonl.manifest.json: it is not a file"
            ),
            "{err}"
        );
        let err = error(&with("envs/n1/dataset.jsonl"));
        assert!(err.contains("its name does not end in .manifest.json"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("base.toml"), "").unwrap();
        std::fs::create_dir_all(dir.path().join("envs/n1")).unwrap();
        std::fs::write(dir.path().join("envs/n1/dataset.jsonl.manifest.json"), "{}").unwrap();
        let path = dir.path().join("cand.toml");
        std::fs::write(&path, with("envs/n1/dataset.jsonl.manifest.json")).unwrap();
        let err = Version::load(dir.path(), &path.to_string_lossy()).unwrap_err().to_string();
        assert!(err.contains("its dataset") && err.contains("envs/n1/dataset.jsonl is not a file"), "{err}");
        std::fs::write(dir.path().join("envs/n1/dataset.jsonl"), "").unwrap();
        let version = Version::load(dir.path(), &path.to_string_lossy()).unwrap();
        assert!(version.trained_on_exports().is_empty(), "an environment is no export (the lineage reads exports)");
        assert_eq!(version.training_data(), [dir.path().join("envs/n1/dataset.jsonl")]);
        let plain = check(GOOD).unwrap();
        assert!(!serde_json::to_string(&plain).unwrap().contains("trained_online"), "older specs keep their hash");
    }

    #[test]
    fn max_tokens_bounds_every_agent_request_and_zero_is_refused_at_its_line() {
        let spec = check(&GOOD.replace("served_name", "max_tokens = 512\nserved_name")).unwrap();
        assert_eq!(spec.model.max_tokens, Some(512));
        let err = error(&GOOD.replace("served_name", "max_tokens = 0\nserved_name"));
        assert!(err.starts_with("DIR/cand.toml:6:1: model.max_tokens must be at least 1"), "{err}");
        let err = error(&GOOD.replace("served_name", "idle_timeout_s = -1\nserved_name"));
        assert!(err.starts_with("DIR/cand.toml:6:1: model.idle_timeout_s must be a number of seconds"), "{err}");
    }

    #[test]
    fn unknown_key_names_file_line_and_field() {
        let err = error(&GOOD.replace("served_name", "servd_name"));
        assert!(err.starts_with("DIR/cand.toml:6:1: unknown field `servd_name`, expected one of"), "{err}");
    }

    #[test]
    fn wrong_type_names_line_and_expected_form() {
        let err = error(&GOOD.replace("seed = 7", "seed = \"seven\""));
        assert!(err.starts_with("DIR/cand.toml:18:8:") && err.contains("u64"), "{err}");
        let err = error(&GOOD.replace("backend = \"sim\"", "backend = \"vllm\""));
        assert!(err.starts_with("DIR/cand.toml:5:11:") && err.contains("docker") && err.contains("sim"), "{err}");
    }

    #[test]
    fn missing_required_field_names_the_table() {
        let err = error(&GOOD.replace("served_name = \"sim/qwen3-8b\"\n", ""));
        assert!(err.contains("DIR/cand.toml:") && err.contains("missing field `served_name`"), "{err}");
    }

    #[test]
    fn reference_to_a_missing_version_is_refused_at_its_line() {
        let err = error(&GOOD.replace("reference = \"base\"", "reference = \"nope\""));
        assert!(err.starts_with("DIR/cand.toml:2:13: reference \"nope\" names no version"), "{err}");
    }

    #[test]
    fn adapter_without_model_is_refused() {
        let err = error("[adapter]\nname = \"x\"\n");
        assert!(err.starts_with("DIR/cand.toml:1:1: an [adapter] needs the [model]"), "{err}");
    }

    #[test]
    fn docker_needs_image_and_path() {
        let err = error(&GOOD.replace("backend = \"sim\"", "backend = \"docker\""));
        assert!(err.starts_with("DIR/cand.toml:5:11: backend \"docker\" needs model.image"), "{err}");
    }

    #[test]
    fn probabilities_are_checked() {
        let err = error(&GOOD.replace("0.02", "1.5"));
        assert!(err.starts_with("DIR/cand.toml:20:18: susceptibility = 1.5 is not a probability"), "{err}");
    }

    #[test]
    fn every_simulator_number_is_bounded_at_its_own_line() {
        // The second of two model tables: its line, not the first one's.
        let two = format!("{GOOD}[sim.models.\"other\"]\nskill = 0.5\nsusceptibility = nan\n");
        let line = two.lines().count();
        let err = error(&two);
        assert!(err.starts_with(&format!("DIR/cand.toml:{line}:18: susceptibility = NaN")), "{err}");
        for (key, value) in [("base_ms", "1e300"), ("base_ms", "-1.0"), ("per_prompt_token_ms", "inf")] {
            let text = format!("{GOOD}[sim.latency]\n{key} = {value}\n");
            let err = error(&text);
            let line = text.lines().count();
            assert!(err.starts_with(&format!("DIR/cand.toml:{line}:")) && err.contains(key), "{err}");
        }
        let err = error(&format!("{GOOD}[sim.models.\"other\".faults]\nslow_ms = 1e300\n"));
        assert!(err.contains("slow_ms = 1e300 is not a delay (ms) in [0, 600000]"), "{err}");
    }

    #[test]
    fn families_are_checked_at_their_line() {
        let err = error(&format!("trained_on = [\"important_instructions\", \"importnat\"]\n{GOOD}"));
        assert!(
            err.starts_with("DIR/cand.toml:1:")
                && err.contains("unknown family \"importnat\"; valid: important_instructions"),
            "{err}"
        );
        let text = format!("{GOOD}susceptibility_by_family = {{ roleplay = 0.3, rolepaly = 0.4 }}\n");
        let err = error(&text);
        assert!(err.contains("susceptibility_by_family: unknown family \"rolepaly\""), "{err}");
        let spec =
            check(&format!("trained_on = [\"authority\"]\n{GOOD}susceptibility_by_family = {{ roleplay = 0.3 }}\n"))
                .unwrap();
        assert_eq!(spec.trained_on[0].get_ref(), "authority");
        assert_eq!(spec.sim.unwrap().models["inj-harden-r3"].susceptibility_by_family["roleplay"], 0.3);
    }

    /// The defences AgentDojo runs, spelled as a spec does; bad values are refused at
    /// their own line with the field's name.
    #[test]
    fn defences_and_the_tool_result_role_parse_and_bad_values_name_their_line() {
        use crate::settings::defence::ClassifierSpec;
        let with = |guardrail: &str| GOOD.replace("kind = \"heuristic\"\n", guardrail);
        let spec = check(&with("kind = \"agentdojo\"\ndefence = \"tool_filter\"\nmodel = \"guard\"\n")).unwrap();
        assert_eq!(
            spec.guardrail,
            GuardrailSpec::Agentdojo { defence: AgentdojoDefence::ToolFilter, model: Some("guard".into()) }
        );
        let spec = check(&with("kind = \"classifier\"\nthreshold = 0.3\n")).unwrap();
        let GuardrailSpec::Classifier(ClassifierSpec { url, model, safe_label, threshold, .. }) = spec.guardrail else {
            panic!()
        };
        assert_eq!(
            (url, model.as_str(), safe_label.as_str(), threshold),
            (None, "protectai/deberta-v3-base-prompt-injection-v2", "SAFE", 0.3)
        );
        // [guardrail] is on line 11; its keys follow.
        for (text, want) in [
            (
                "kind = \"classifier\"\nthreshold = 1.5\n",
                "DIR/cand.toml:13:1: guardrail.threshold: 1.5 is not a probability",
            ),
            ("kind = \"classifier\"\nurl = \"ftp://x\"\n", "DIR/cand.toml:13:1: guardrail.url: ftp://x is no http"),
            ("kind = \"classifier\"\ntimeout_s = 0\n", "DIR/cand.toml:13:1: guardrail.timeout_s: 0 is not"),
            ("kind = \"http\"\nurl = \"localhost:9\"\n", "DIR/cand.toml:13:1: guardrail.url: localhost:9 is no http"),
            (
                "kind = \"classifier\"\nsafe_label = \" \"\n",
                "DIR/cand.toml:13:1: guardrail.safe_label: must not be empty",
            ),
            (
                "kind = \"agentdojo\"\ndefence = \"repeat_user_prompt\"\nmodel = \"guard\"\n",
                "DIR/cand.toml:14:1: guardrail.model: only defence = \"tool_filter\" calls a model",
            ),
        ] {
            let err = error(&with(text));
            assert!(err.starts_with(want), "{text}: {err}");
        }
        let err = error(&with("kind = \"agentdojo\"\ndefence = \"transformers_pi_detector\"\n"));
        assert!(
            err.starts_with("DIR/cand.toml:11:1:") && err.contains("expected one of") && err.contains("`tool_filter`"),
            "{err}"
        );
        // The http classifier's credentials never reach what a spec is written to (the
        // run's files, the hash).
        let spec = check(&with("kind = \"http\"\nurl = \"http://u:pw@guard:9/classify?token=t0k\"\n")).unwrap();
        let GuardrailSpec::Http { url, .. } = &spec.guardrail else { panic!() };
        assert_eq!(url.expose(), "http://u:pw@guard:9/classify?token=t0k");
        let json = serde_json::to_string(&spec).unwrap();
        assert!(
            json.contains("http://***@guard:9/classify?token=***") && !json.contains("pw") && !json.contains("t0k")
        );
        let err = error(&with("kind = \"classifier\"\nthreshold = 0.5\nsafe = \"SAFE\"\n"));
        assert!(err.contains("DIR/cand.toml:") && err.contains("unknown field `safe`"), "{err}");

        let prompted =
            GOOD.replace("served_name", "tool_calling = \"prompted\"\ntool_result_role = \"input\"\nserved_name");
        assert_eq!(check(&prompted).unwrap().model.tool_result_role, ToolResultRole::Input);
        let err = error(&prompted.replace("\"input\"", "\"assistant\""));
        assert!(err.starts_with("DIR/cand.toml:7:20:") && err.contains("`user`, `tool`"), "{err}");
        let err = error(&GOOD.replace("served_name", "tool_result_role = \"tool\"\nserved_name"));
        assert!(
            err.starts_with("DIR/cand.toml:6:1: model.tool_result_role = \"tool\" needs tool_calling = \"prompted\""),
            "{err}"
        );
    }

    /// A spec written before the role and the tool filter's model existed keeps its hash.
    #[test]
    fn defaults_of_the_new_fields_leave_the_hash_alone() {
        let spec = check(&GOOD.replace("served_name", "tool_result_role = \"user\"\nserved_name")).unwrap();
        let json = serde_json::to_string(&spec).unwrap();
        assert!(!json.contains("tool_result_role") && !json.contains("classifier"), "{json}");
        // Any other role is part of the version: it changes what the model reads.
        let prompted = |role: &str| {
            let text = GOOD.replace(
                "served_name",
                &format!("tool_calling = \"prompted\"\ntool_result_role = \"{role}\"\nserved_name"),
            );
            serde_json::to_string(&check(&text).unwrap()).unwrap()
        };
        assert!(prompted("tool") != prompted("input") && prompted("tool") != prompted("user"));
        let spec =
            check(&GOOD.replace("kind = \"heuristic\"", "kind = \"agentdojo\"\ndefence = \"repeat_user_prompt\""))
                .unwrap();
        assert_eq!(
            serde_json::to_value(&spec.guardrail).unwrap(),
            serde_json::json!({"kind": "agentdojo", "defence": "repeat_user_prompt"})
        );
    }

    #[test]
    fn unknown_guardrail_kind_lists_the_valid_ones() {
        let err = error(&GOOD.replace("kind = \"heuristic\"", "kind = \"magic\""));
        assert!(err.contains("DIR/cand.toml:") && err.contains("heuristic") && err.contains("magic"), "{err}");
    }
}

#[cfg(test)]
mod fuzz;
