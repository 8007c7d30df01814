//! `pruefstand check [<version>]`: one screen of preflight results, one line each —
//! `OK`, `WARN` or `FAIL`, what was found, and the fix. Exit 0 without a FAIL, else 2.
//! With `[cluster] kind = "slurm"` it also probes the cluster (tools, controller,
//! partition, and a test job writing under the bench root).
//!
//! It only looks: it creates no venv, pulls no image, starts nothing (but the cluster's
//! one tiny test job, and a temporary file, removed at once, that shows the bench root
//! writable). Every probe has
//! a short timeout (a dead Docker socket or a wedged bus gives a line, not a hang), and
//! the slow ones run side by side.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::container::ServerSetup;
use crate::guard::gpu::GpuGuard;
use crate::guard::units::{Bus, BusClient};
use crate::guard::{Guards, OwnProcesses};
use pruefstand_core::input;
use pruefstand_core::plan::Profile;
use pruefstand_core::root::{CONFIG_FILE, Root};
use pruefstand_core::settings::defence::{ToolCalling, ToolResultRole};
use pruefstand_core::settings::{GuardConfig, Unavailable};
use pruefstand_core::spec::{Backend, ServedFileKind, Version};
use pruefstand_core::util;
use pruefstand_gym::pyenv::{self, AGENTDOJO_VERSION};
use pruefstand_judge::contamination;

const DOCKER_TIMEOUT: Duration = Duration::from_secs(3);
const NVML_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Also check what this version needs (image, model and adapter paths).
    pub(crate) version: Option<String>,
    /// The plan about to run (a name under profiles/ or a path): FAIL when an export
    /// the version's adapter was trained on holds a family it holds out. Without it,
    /// a WARN for each shipped profile that would clash.
    #[arg(long, requires = "version")]
    pub(crate) plan: Option<String>,
    /// The lines as JSON on stdout (`[{"level", "what", "fix"}]`).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Level {
    Ok,
    Warn,
    Fail,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        })
    }
}

#[derive(serde::Serialize)]
struct Line {
    level: Level,
    what: String,
    fix: Option<String>,
}

#[derive(Default)]
struct Report(Vec<Line>);

impl Report {
    fn ok(&mut self, what: impl Into<String>) {
        self.0.push(Line { level: Level::Ok, what: what.into(), fix: None });
    }
    fn warn(&mut self, what: impl Into<String>, fix: Option<String>) {
        self.0.push(Line { level: Level::Warn, what: what.into(), fix });
    }
    fn fail(&mut self, what: impl Into<String>, fix: impl Into<String>) {
        self.0.push(Line { level: Level::Fail, what: what.into(), fix: Some(fix.into()) });
    }
    fn add(&mut self, level: Level, what: impl Into<String>, fix: Option<String>) {
        self.0.push(Line { level, what: what.into(), fix });
    }
    fn extend(&mut self, other: Report) {
        self.0.extend(other.0);
    }
}

pub(crate) async fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let report = probe(root, &args).await;
    show(&report, args.json)
}

/// Runs every probe; the lines come in the order they are shown.
async fn probe(root: Option<PathBuf>, args: &Args) -> Report {
    let mut report = Report::default();
    let root = check_root(root, &mut report);
    let guard_config = root.as_ref().map(|r| r.config.guard.clone()).unwrap_or_default();
    let version = check_version(root.as_ref(), args.version.as_deref(), &mut report);
    let in_containers = versions_in_containers(root.as_ref(), version.as_ref());

    check_venv(&mut report);

    // (A hung NVML probe stays behind on the blocking pool; check does not wait for it.)
    let (docker, gpu, dbus) = tokio::join!(
        check_docker(version.as_ref(), &in_containers),
        check_gpu(&guard_config),
        check_dbus(&guard_config)
    );
    report.extend(docker);
    if let Some(version) = &version {
        check_external_server(version, &mut report).await;
        check_model_files(&ServerSetup::of(version), &mut report);
        check_tool_result_role(version, &mut report);
        if let Some(root) = &root {
            check_trained_exports(root, version, args.plan.as_deref(), &mut report);
        }
    }
    report.extend(gpu);
    report.extend(dbus);
    if let Some(root) = root.as_ref().filter(|r| r.config.cluster.is_slurm()) {
        check_cluster(root, &mut report).await;
    }
    report
}

/// Prints the lines (or their JSON); exit 0 without a FAIL, else 2.
fn show(report: &Report, json: bool) -> anyhow::Result<ExitCode> {
    let fails = report.0.iter().filter(|l| l.level == Level::Fail).count();
    let warns = report.0.iter().filter(|l| l.level == Level::Warn).count();
    if json {
        outln!("{}", serde_json::to_string_pretty(&report.0)?);
    } else {
        for line in &report.0 {
            match &line.fix {
                Some(fix) => outln!("{:<4}  {} → {fix}", line.level, line.what),
                None => outln!("{:<4}  {}", line.level, line.what),
            }
        }
        outln!("{fails} FAIL, {warns} WARN");
    }
    Ok(if fails == 0 { ExitCode::SUCCESS } else { ExitCode::from(util::EXIT_COULD_NOT_RUN) })
}

/// The bench root, with its config's permissions and its hooks.
fn check_root(root: Option<PathBuf>, report: &mut Report) -> Option<Root> {
    match Root::find(root) {
        Ok(root) => {
            report.ok(format!("bench root {}", root.path.display()));
            check_root_writable(&root, report);
            check_config_permissions(&root, report);
            check_hooks(&root, report);
            Some(root)
        }
        Err(err) => {
            report.fail(
                format!("bench root: {err:#}"),
                "run from a bench root, or pass --root DIR (a folder with pruefstand.toml)",
            );
            None
        }
    }
}

/// The folders `start` and the daemon write — the queue (`.pruefstand/`) and
/// `reports/`, or the root where they are still to be made — each probed with a
/// temporary file that is removed at once: a read-only root (a read-only mount, another
/// user's folder) is a FAIL here as it is a refusal there.
fn check_root_writable(root: &Root, report: &mut Report) {
    let nearest = |dir: PathBuf| if dir.is_dir() { dir } else { root.path.clone() };
    let mut probed = Vec::new();
    for dir in [nearest(root.path.join(".pruefstand")), nearest(root.reports())] {
        if probed.contains(&dir) {
            continue;
        }
        if let Err(err) = tempfile::Builder::new().prefix(".pruefstand-check.").tempfile_in(&dir) {
            report.fail(
                format!("bench root: cannot write in {}: {err}", dir.display()),
                "make the bench root writable for this user: `start` and the daemon write the queue and the run directories there",
            );
        }
        probed.push(dir);
    }
}

/// The named version's spec, when there is a root to find it in.
fn check_version(root: Option<&Root>, name: Option<&str>, report: &mut Report) -> Option<Version> {
    match (root, name) {
        (Some(root), Some(name)) => match Version::load(&root.versions(), name) {
            Ok(version) => {
                report.ok(format!("version {} ({})", version.name, version.path.display()));
                report.ok(generation_bound(&version));
                Some(version)
            }
            Err(err) => {
                report.fail(
                    format!("version {}: {err:#}", util::cut(name, 80)),
                    "fix the spec, or name one in versions/",
                );
                None
            }
        },
        (None, Some(name)) => {
            report.fail(format!("version {name}: not checked without a bench root"), "see the bench root line");
            None
        }
        _ => None,
    }
}

/// The versions whose model runs in a container here: the named one and its reference
/// (a run makes the reference's run first).
fn versions_in_containers(root: Option<&Root>, version: Option<&Version>) -> Vec<Version> {
    match (root, version) {
        (Some(root), Some(version)) => std::iter::once(version.clone())
            .chain(version.reference().and_then(|name| Version::load(&root.versions(), name).ok()))
            .filter(|v| *v.spec.model.backend.get_ref() == Backend::Docker)
            .collect(),
        _ => Vec::new(),
    }
}

/// The Slurm cluster's probes (tools, controller, partition, a test job).
async fn check_cluster(root: &Root, report: &mut Report) {
    let (config, probe_dir) = (root.config.cluster.clone(), root.path.join(".pruefstand/cluster-check"));
    let slurm = crate::cluster::slurm::Slurm::default();
    let probes = crate::runtime::blocking(move || slurm.check(&config, &probe_dir)).await;
    for probe in probes {
        match probe.ok {
            true => report.ok(probe.what),
            false => report.fail(probe.what, probe.fix),
        }
    }
}

/// Webhook URLs are secrets and exec hooks run commands: the config must not be
/// readable (with hooks) or writable by anyone else.
fn check_config_permissions(root: &Root, report: &mut Report) {
    let path = root.path.join(CONFIG_FILE);
    let mode = match std::fs::metadata(&path) {
        Ok(meta) => meta.permissions().mode() & 0o777,
        Err(err) => return report.fail(format!("{}: {err}", path.display()), "check the file's owner and permissions"),
    };
    let chmod = format!("chmod 600 {}", path.display());
    let hooks = root.config.hooks.len();
    if mode & 0o022 != 0 {
        report.warn(
            format!("{CONFIG_FILE} is writable by group/others (mode {mode:03o}): they could add hooks"),
            Some(chmod),
        );
    } else if mode & 0o044 != 0 && hooks > 0 {
        report.warn(
            format!("{CONFIG_FILE} is readable by group/others (mode {mode:03o}) and holds {hooks} hook(s): webhook URLs are secrets"),
            Some(chmod),
        );
    } else {
        report.ok(format!("{CONFIG_FILE} permissions (mode {mode:03o}, {hooks} hook(s))"));
    }
}

/// The hooks as the daemon takes them and as each delivery would go from here: a FAIL
/// per problem, naming pruefstand.toml, the line and the field.
fn check_hooks(root: &Root, report: &mut Report) {
    let problems = crate::hooks::problems(root, true);
    let hooks = root.config.hooks.len();
    if problems.is_empty() && hooks > 0 {
        report.ok(format!("{hooks} hook(s): outcomes, programs and variables found"));
    }
    for problem in problems {
        report.fail(
            problem,
            format!("fix the hook in {CONFIG_FILE}, or set the variable where the daemon runs and here"),
        );
    }
}

fn check_venv(report: &mut Report) {
    match pyenv::inspect() {
        Ok((python, version)) if version == AGENTDOJO_VERSION => {
            report.ok(format!("Python venv {} with agentdojo {version}", python.display()))
        }
        Ok((python, version)) => report.fail(
            format!("Python venv {} has agentdojo {version}, not {AGENTDOJO_VERSION}", python.display()),
            "remove that venv and run `pruefstand setup`",
        ),
        Err(err) => {
            let python = match pyenv::find_python() {
                Ok(p) => format!("{} is available", p.display()),
                Err(e) => format!("and {e:#}"),
            };
            report
                .fail(format!("Python venv: {err:#}; {python}"), "run `pruefstand setup` (creates it, about a minute)")
        }
    }
}

/// Docker, and the images of `in_containers`. A named version that runs no container
/// (simulated, external) does not need Docker: it is not probed. Without a version the
/// probe runs, and trouble is only a warning.
async fn check_docker(version: Option<&Version>, in_containers: &[Version]) -> Report {
    let mut report = Report::default();
    let needed = !in_containers.is_empty();
    if let Some(version) = version.filter(|_| !needed) {
        report.ok(format!("Docker: not needed ({} runs no model container)", version.name));
        return report;
    }
    let level = if needed { Level::Fail } else { Level::Warn };
    let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
    let fix = Some("start the Docker Engine (`sudo systemctl start docker`) and make sure this user may use its socket (group `docker`)".to_string());
    let docker = match bollard::Docker::connect_with_defaults() {
        Ok(docker) => docker.with_timeout(DOCKER_TIMEOUT),
        Err(err) => {
            report.add(level, format!("Docker not reachable at {host}: {err}"), fix);
            return report;
        }
    };
    match tokio::time::timeout(DOCKER_TIMEOUT, docker.version()).await {
        Ok(Ok(v)) => report.ok(format!(
            "Docker {} (API {}) at {host}",
            v.version.as_deref().unwrap_or("?"),
            v.api_version.as_deref().unwrap_or("?")
        )),
        Ok(Err(err)) => {
            report.add(level, format!("Docker not reachable at {host}: {err}"), fix);
            return report;
        }
        Err(_) => {
            report.add(level, format!("Docker at {host}: no answer within {} s", DOCKER_TIMEOUT.as_secs()), fix);
            return report;
        }
    }
    check_gpu_runtime(&docker, &mut report).await;
    for container in in_containers {
        // The reference's image is named as the reference's: its run comes first.
        let image_of = match version {
            Some(checked) if checked.name != container.name => format!(" (the reference {}'s model)", container.name),
            _ => String::new(),
        };
        match &container.spec.model.image {
            None => report.fail(
                format!("model image of {}: the spec names none", container.name),
                "set [model] image in the version's spec",
            ),
            Some(image) => match tokio::time::timeout(DOCKER_TIMEOUT, docker.inspect_image(image)).await {
                Ok(Ok(_)) => report.ok(format!("image {image}{image_of} present")),
                Ok(Err(err)) => report.fail(
                    match err {
                        bollard::errors::Error::DockerResponseServerError { status_code: 404, .. } => {
                            format!("image {image}{image_of} not present")
                        }
                        err => format!("image {image}{image_of}: {err}"),
                    },
                    crate::container::image_remedy(image),
                ),
                Err(_) => report.fail(format!("image {image}: Docker gave no answer"), "check the Docker Engine"),
            },
        }
    }
    report
}

/// Whether Docker has the NVIDIA runtime a model container needs for the GPU (the
/// Jetson's default; nvidia-container-toolkit elsewhere). A WARN, not a FAIL: a
/// version with `gpu = "none"` runs without it.
async fn check_gpu_runtime(docker: &bollard::Docker, report: &mut Report) {
    match tokio::time::timeout(DOCKER_TIMEOUT, docker.info()).await {
        Ok(Ok(info)) => {
            let runtimes = info.runtimes.unwrap_or_default();
            let default = info.default_runtime.unwrap_or_default();
            if runtimes.contains_key("nvidia") {
                report.ok(format!("Docker GPU runtime: nvidia (default runtime {default})"));
            } else {
                let names: Vec<&String> = runtimes.keys().collect();
                report.warn(
                    format!("Docker GPU runtime: no nvidia runtime (runtimes: {names:?}): a model container gets no GPU"),
                    Some("install nvidia-container-toolkit and run `sudo nvidia-ctk runtime configure --runtime=docker`, then restart Docker".into()),
                );
            }
        }
        Ok(Err(err)) => report.warn(format!("Docker GPU runtime: cannot ask Docker: {err}"), None),
        Err(_) => report.warn("Docker GPU runtime: Docker gave no answer", None),
    }
}

/// An `external` version's server, asked as a run would: its models list, with the
/// version's key. Nothing listening, an error answer or the model not served is a FAIL
/// (a run against it would only collect connection errors).
async fn check_external_server(version: &Version, report: &mut Report) {
    let model = &version.spec.model;
    let (Backend::External, Some(url)) = (model.backend.get_ref(), &model.url) else { return };
    let wanted = version.request_model();
    let client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10)).build();
    let mut request = match client {
        Ok(client) => client.get(url.join("models").expose()),
        Err(err) => return report.fail(format!("model server at {url}: {err}"), "see the error"),
    };
    if let Some(key) = model.api_key_env.as_ref().and_then(|var| std::env::var(var).ok()) {
        request = request.bearer_auth(key);
    }
    let answer = match request.send().await {
        Ok(answer) => answer,
        Err(err) => {
            let why = if err.is_connect() {
                "nothing answers there (connection refused or unreachable)".to_string()
            } else if err.is_timeout() {
                "no answer within 10 s".to_string()
            } else {
                format!("{}", err.without_url())
            };
            return report.fail(
                format!("model server at {url}: {why}"),
                format!("start the server, or fix model.url in {}", version.path.display()),
            );
        }
    };
    if !answer.status().is_success() {
        return report.fail(
            format!("model server at {url}: GET /models answered {}", answer.status()),
            "check the server and the version's model.api_key_env",
        );
    }
    let served: Vec<String> = answer
        .json::<serde_json::Value>()
        .await
        .ok()
        .and_then(|v| v["data"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        // A server's ids reach the terminal: no escape sequence of theirs may.
        .filter_map(|m| m["id"].as_str().map(pruefstand_core::util::printable))
        .collect();
    if served.iter().any(|m| m == wanted) {
        report.ok(format!("model server at {url} serves {wanted}"));
    } else {
        report.fail(
            format!("model server at {url} does not serve {wanted:?} (it serves: {})", served.join(", ")),
            "serve the model (or its adapter) under that name, or fix served_name / adapter.name",
        );
    }
}

/// The held-out guard before a run (docs/training.md): the exports the adapter was
/// trained on must hold no family the plan holds out — FAIL for the plan named, WARN
/// for each shipped profile without one; R1 fails the same clash after a run.
fn check_trained_exports(root: &Root, version: &Version, plan: Option<&str>, report: &mut Report) {
    let paths = version.training_data();
    if paths.is_empty() {
        if let Some(plan) = plan {
            report.ok(format!("plan {plan}: version {} names no export its adapter was trained on", version.name));
        }
        return;
    }
    let exports = match pruefstand_report::export::trained_exports(&paths) {
        Ok(exports) => exports,
        Err(err) => {
            return report.fail(
                format!("[adapter] trained_on_exports or trained_online: {err:#}"),
                format!("export again with `pruefstand export`, or fix [adapter] in {}", version.path.display()),
            );
        }
    };
    let fix = contamination::FIX;
    let plans: Vec<(String, Result<Profile, String>)> = match plan {
        Some(name) => {
            let profile = Profile::load_named(&root.path, name).map(|(_, p, _)| p).map_err(|e| format!("{e:#}"));
            vec![(name.to_string(), profile)]
        }
        None => shipped_profiles(root),
    };
    for (name, profile) in plans {
        let profile = match profile {
            Ok(profile) => profile,
            Err(err) if plan.is_some() => {
                return report.fail(format!("plan {name}: {err}"), "name a plan in profiles/");
            }
            Err(_) => continue,
        };
        let held_out: Vec<String> = profile.held_out.iter().map(|f| f.get_ref().clone()).collect();
        let trained_on: Vec<String> = version.spec.trained_on.iter().map(|f| f.get_ref().clone()).collect();
        let held_out = contamination::held_out_for(&held_out, &trained_on);
        let clashes = contamination::clashes(&held_out, &exports);
        for clash in &clashes {
            let what = format!("plan {name}: {} (version {})", clash.describe(), version.name);
            match plan {
                Some(_) => report.fail(what, fix),
                None => report.warn(what, Some(fix.to_string())),
            }
        }
        if clashes.is_empty() && plan.is_some() {
            report.ok(format!(
                "plan {name}: the {} export(s) the adapter was trained on hold none of its held-out families ({})",
                exports.len(),
                if held_out.is_empty() { "none".to_string() } else { held_out.join(", ") }
            ));
        }
    }
}

/// The profiles under `<root>/profiles/`, by name, each parsed or why not.
fn shipped_profiles(root: &Root) -> Vec<(String, Result<Profile, String>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.path.join("profiles"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            (name, Profile::load(&path).map(|(p, _)| p).map_err(|e| format!("{e:#}")))
        })
        .collect()
}

/// What the version's model server reads here: its vLLM arguments, model folder, served
/// files and adapter.
fn check_model_files(server: &ServerSetup, report: &mut Report) {
    match server.backend() {
        Backend::Docker => {
            for warning in crate::container::vllm_warnings(server) {
                report.warn(
                    format!("vLLM arguments: {warning}"),
                    Some(format!("edit [model] args in {}", server.spec_file.display())),
                );
            }
            readable_dir(report, "model", server.model.path.as_deref(), "set [model] path to the weights' folder");
            for (kind, file) in &server.served_files {
                match std::fs::read(file) {
                    Ok(text) => report.ok(format!(
                        "{} {} (sha256 {}…), passed to the server as {}",
                        kind.label(),
                        file.display(),
                        &pruefstand_core::util::sha256_hex(&text)[..12],
                        kind.flag()
                    )),
                    Err(e) => report.fail(
                        format!("{} {}: {e}", kind.label(), file.display()),
                        format!("set [model] {} in {}", kind.field(), server.spec_file.display()),
                    ),
                }
            }
            if let Some(adapter) = &server.adapter {
                adapter_dir(report, &server.spec_file, &adapter.name, adapter.path.as_deref());
            }
        }
        Backend::Sim => report.ok("model: simulated (no container, GPU or model files needed)"),
        Backend::External => report.ok(format!(
            "model: external server {} (not probed)",
            server.model.url.as_ref().map_or("?".to_string(), |u| u.to_string())
        )),
    }
}

/// The role prompted tool results carry, against the served model's chat template where
/// it can be read here (`chat_template.jinja` or `tokenizer_config.json` in the model's
/// folder, or the file `--chat-template` names): a template that never names the role
/// renders it as it renders an unknown one, or drops it — the model then reads its tool
/// results unlike anything it was trained on. A template with an untrusted-input role
/// (Meta-SecAlign's `input`) while results go as `user` wastes the model's defence.
fn check_tool_result_role(version: &Version, report: &mut Report) {
    let model = &version.spec.model;
    if model.tool_calling != ToolCalling::Prompted {
        return;
    }
    let role = model.tool_result_role.as_str();
    let fix = Some(format!("set [model] tool_result_role in {}", version.path.display()));
    let Some((source, template)) = chat_template(version) else {
        return report.ok(format!(
            "tool results as role {role} (prompted; the served model's chat template is not readable here)"
        ));
    };
    let named = |r: &str| template.contains(&format!("'{r}'")) || template.contains(&format!("\"{r}\""));
    match model.tool_result_role {
        ToolResultRole::User if named("input") => report.warn(
            format!("tool results go as role user, but the chat template ({source}) has a role 'input' for untrusted data"),
            fix,
        ),
        ToolResultRole::User => report.ok(format!("tool results as role user (chat template {source})")),
        _ if named(role) => report.ok(format!("tool results as role {role}: the chat template ({source}) names it")),
        _ => report.warn(
            format!("tool results as role {role}, which the chat template ({source}) never names: it renders them as an unknown role, or drops them"),
            fix,
        ),
    }
}

/// The chat template of a version's model folder, and where it came from.
fn chat_template(version: &Version) -> Option<(String, String)> {
    let model = &version.spec.model;
    let folder = model.path.as_deref();
    // `--chat-template FILE`: a path inside the container's model mount is the folder's.
    let named = model.args.iter().position(|a| a == "--chat-template").and_then(|i| model.args.get(i + 1));
    let mut candidates: Vec<PathBuf> = version.served_file(ServedFileKind::ChatTemplate).into_iter().collect();
    if let Some(file) = named {
        match (file.strip_prefix("/model/"), folder) {
            (Some(inside), Some(folder)) => candidates.push(folder.join(inside)),
            _ => candidates.push(PathBuf::from(file)),
        }
    }
    if let Some(folder) = folder {
        candidates.push(folder.join("chat_template.jinja"));
    }
    for path in candidates {
        if let Ok(text) = input::read_config(&path) {
            return Some((path.display().to_string(), text));
        }
    }
    let config = folder?.join("tokenizer_config.json");
    let value: serde_json::Value = serde_json::from_str(&input::read_config(&config).ok()?).ok()?;
    let template = match value.get("chat_template")? {
        serde_json::Value::String(t) => t.clone(),
        // Several named templates: the role may be in any.
        serde_json::Value::Array(named) => {
            named.iter().filter_map(|t| t.get("template").and_then(|t| t.as_str())).collect::<Vec<_>>().join("\n")
        }
        _ => return None,
    };
    Some((config.display().to_string(), template))
}

fn readable_dir(report: &mut Report, what: &str, path: Option<&Path>, fix: &str) {
    let Some(path) = path else {
        return report.fail(format!("{what} path: the spec names none"), fix);
    };
    match std::fs::read_dir(path).map(|mut entries| entries.next().is_some()) {
        Ok(true) => report.ok(format!("{what} path {} readable", path.display())),
        Ok(false) => {
            report.fail(format!("{what} path {} is empty", path.display()), "copy the files there, or fix the path")
        }
        Err(err) => report.fail(
            format!("{what} path {}: {err}", path.display()),
            format!("make it a folder this user can read, or {fix}"),
        ),
    }
}

/// An adapter folder as vLLM would load it: the path resolved (a symlink to `/etc` is
/// `/etc`), and a LoRA there only with PEFT's `adapter_config.json`.
fn adapter_dir(report: &mut Report, spec_file: &Path, name: &str, path: Option<&Path>) {
    let field = || {
        let text = std::fs::read_to_string(spec_file).unwrap_or_default();
        let offset = input::table_key_offset(&text, "adapter", "path").unwrap_or(0);
        input::at(spec_file, &text, offset, "adapter.path").to_string()
    };
    let Some(path) = path else {
        return report.fail(format!("{}: the spec names none", field()), "set [adapter] path to the LoRA's folder");
    };
    let resolved = match path.canonicalize() {
        Ok(resolved) => resolved,
        Err(err) => {
            return report.fail(
                format!("{} {}: {err}", field(), path.display()),
                "make it a folder this user can read, or set [adapter] path to the LoRA's folder",
            );
        }
    };
    let shown = match resolved == path {
        true => path.display().to_string(),
        false => format!("{} (resolved: {})", path.display(), resolved.display()),
    };
    if resolved.join("adapter_config.json").is_file() {
        report.ok(format!("adapter {name} path {shown} holds a LoRA adapter (adapter_config.json)"));
    } else {
        report.fail(
            format!("{} {shown} holds no adapter_config.json: not a LoRA adapter folder", field()),
            "point [adapter] path at the folder PEFT's save_pretrained wrote",
        );
    }
}

async fn check_gpu(config: &GuardConfig) -> Report {
    let mut report = Report::default();
    let gpu_config = config.gpu.clone();
    let policy = gpu_config.nvml;
    // Not `runtime::blocking`: a hung driver is waited for only NVML_TIMEOUT.
    let probe = tokio::task::spawn_blocking(move || {
        pruefstand_core::blocking::section(move || GpuGuard::new(gpu_config).info())
    });
    let info = match tokio::time::timeout(NVML_TIMEOUT, probe).await {
        Ok(Ok(info)) => info,
        Ok(Err(err)) => Err(format!("probe failed: {err}")),
        Err(_) => Err(format!("no answer within {} s (driver hung?)", NVML_TIMEOUT.as_secs())),
    };
    // Under nvml = "ignore" a missing NVML is what the config asked for: said, not warned.
    let (level, consequence) = match policy {
        Unavailable::Block => (Level::Fail, "jobs would wait forever"),
        Unavailable::Ignore => (Level::Ok, "ignored by config: runs are not guarded, R1 says not observed"),
    };
    let fix = match policy {
        Unavailable::Block => Some("install the NVIDIA driver, point [guard.gpu] library at libnvidia-ml.so.1, or set [guard.gpu] nvml = \"ignore\" on a machine without a GPU".to_string()),
        Unavailable::Ignore => None,
    };
    let info = match info {
        Ok(info) if !info.devices.is_empty() => info,
        Ok(info) => {
            report.add(level, format!("NVML {} sees no GPU: {consequence}", info.library), fix);
            return report;
        }
        Err(err) => {
            report.add(level, format!("NVML: {err}: {consequence}"), fix);
            return report;
        }
    };
    let driver = info.driver.as_deref().unwrap_or("?");
    for (index, name, utilization, processes) in &info.devices {
        let what = format!("NVML: GPU {index} {name} (driver {driver}, {})", info.library);
        match (utilization, processes) {
            (true, true) => report.ok(format!("{what}: utilization and compute processes readable")),
            (false, true) => {
                report.warn(format!("{what}: utilization not supported: idle judged by compute processes only"), None)
            }
            (true, false) => report
                .warn(format!("{what}: compute process list not supported: idle judged by utilization only"), None),
            (false, false) => report.add(
                level,
                format!("{what}: neither utilization nor compute processes readable: {consequence}"),
                fix.clone(),
            ),
        }
    }
    // The GPU right now, as the guard sees it (no processes are ours here).
    let units_off = GuardConfig { gpu: config.gpu.clone(), ..GuardConfig::default() };
    let sample = Guards::new(&units_off).sample(&OwnProcesses::none()).await;
    if sample.is_clear() {
        report.ok(format!("GPU idle now (utilization ≤ {} %, no compute process)", config.gpu.utilization_max));
    } else {
        report.warn(format!("GPU busy now: {}", sample.blocking.join("; ")), Some("jobs wait until it is idle".into()));
    }
    report
}

async fn check_dbus(config: &GuardConfig) -> Report {
    let mut report = Report::default();
    let units = &config.units;
    for (bus, patterns) in [(Bus::User, &units.user), (Bus::System, &units.system)] {
        // Nothing to watch there: whether the bus answers matters to no job.
        if patterns.is_empty() {
            report.ok(format!("D-Bus {bus} bus: no busy units configured (not asked)"));
            continue;
        }
        let mut client = BusClient::new(bus);
        let listed = match client.list(patterns).await {
            Ok(listed) => {
                report.ok(format!("D-Bus {bus} bus: systemd answers"));
                listed
            }
            Err(err) => {
                let (level, then) = match units.unreachable {
                    Unavailable::Block => (Level::Fail, "jobs would wait"),
                    Unavailable::Ignore => (Level::Warn, "ignored by config"),
                };
                let fix = match bus {
                    Bus::User => {
                        "run under a user session with a user bus (`loginctl enable-linger $USER` for services), or check DBUS_SESSION_BUS_ADDRESS"
                    }
                    Bus::System => "check that dbus is running (`systemctl status dbus`), or DBUS_SYSTEM_BUS_ADDRESS",
                };
                report.add(
                    level,
                    format!("D-Bus {err}: busy units {} cannot be checked: {then}", patterns.join(", ")),
                    Some(fix.into()),
                );
                continue;
            }
        };
        for pattern in patterns {
            let matching: Vec<_> = listed.iter().filter(|u| glob_match(pattern, &u.name)).collect();
            let busy: Vec<_> = matching.iter().filter(|u| u.is_busy()).collect();
            if busy.is_empty() {
                report.ok(format!("busy units {pattern} ({bus} bus): none active ({} loaded)", matching.len()));
            }
            for unit in busy {
                report.warn(
                    format!("busy unit {} {} ({bus} bus, pattern {pattern})", unit.name, unit.active_state),
                    Some("jobs wait until it stops".into()),
                );
            }
        }
    }
    report
}

/// systemd's unit globs (fnmatch): `*`, `?`, `[…]` is not used in unit patterns we
/// document; a `[` matches itself. Only to attribute listed units to their pattern.
fn glob_match(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// What bounds one model turn of the version: its `max_tokens` (or the default) — a
/// model that does not stop ends its turn there, scored.
fn generation_bound(version: &Version) -> String {
    match version.spec.model.max_tokens {
        Some(n) => format!("max_tokens {n} per model turn (model.max_tokens)"),
        None => format!(
            "max_tokens {} per model turn (the default; model.max_tokens sets it)",
            pruefstand_agent::llm::DEFAULT_MAX_TOKENS
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real vLLM image's template (SmolLM2 in ChatML, `tool` as `<tool_response>`),
    /// read from the model folder as `tokenizer_config.json` holds it, or the `.jinja`.
    #[test]
    fn the_tool_result_role_is_checked_against_the_served_models_chat_template() {
        let real =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/vllm-cpu/tool_chat_template.jinja"))
                .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (versions, model) = (dir.path().join("versions"), dir.path().join("model"));
        std::fs::create_dir_all(&versions).unwrap();
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("tokenizer_config.json"), serde_json::json!({"chat_template": real}).to_string())
            .unwrap();
        let lines = |role: &str| {
            let spec = format!(
                "[model]\nbackend = \"docker\"\nimage = \"i\"\npath = {:?}\nserved_name = \"m\"\ntool_calling = \"prompted\"\ntool_result_role = \"{role}\"\n",
                model.display().to_string()
            );
            std::fs::write(versions.join("v.toml"), spec).unwrap();
            let mut report = Report::default();
            check_tool_result_role(&Version::load(&versions, "v").unwrap(), &mut report);
            report.0.into_iter().map(|l| (l.level, l.what)).collect::<Vec<_>>()
        };
        let tool = lines("tool");
        assert!(
            tool[0].0 == Level::Ok && tool[0].1.contains("names it") && tool[0].1.contains("tokenizer_config.json"),
            "{:?}",
            tool[0].1
        );
        let input = lines("input");
        assert!(input[0].0 == Level::Warn && input[0].1.contains("never names"), "{:?}", input[0].1);
        assert_eq!(lines("user")[0].0, Level::Ok);
        // A template with an untrusted-input role (SecAlign's), read from the .jinja.
        std::fs::write(model.join("chat_template.jinja"), "{% if message.role == 'input' %}untrusted{% endif %}")
            .unwrap();
        assert_eq!(lines("input")[0].0, Level::Ok);
        let user = lines("user");
        assert!(user[0].0 == Level::Warn && user[0].1.contains("role 'input' for untrusted data"), "{:?}", user[0].1);
        // Nothing readable: said, not guessed.
        std::fs::remove_file(model.join("chat_template.jinja")).unwrap();
        std::fs::remove_file(model.join("tokenizer_config.json")).unwrap();
        assert!(lines("input")[0].1.contains("not readable here"));
    }

    #[test]
    fn unit_globs() {
        assert!(glob_match("training@*.service", "training@llama.service"));
        assert!(glob_match("ollama.service", "ollama.service"));
        assert!(!glob_match("training@*.service", "training.service"));
        assert!(glob_match("a?c", "abc"));
    }
}
