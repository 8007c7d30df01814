//! Online training (`pruefstand train VERSION --online PLAN`, docs/training.md): GRPO on
//! a LoRA by TRL in the base version's image, its rewards from pruefstand's environment
//! of PLAN, the adapter of each step loaded into the running vLLM for the next rollouts.
//!
//! Three processes: the base version's model server, started as a run starts it but
//! with runtime LoRA loading on (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`, `--enable-lora`,
//! `--max-lora-rank`) and the training's `out/live/` mounted at `/adapters`; the
//! environment (`python -m pruefstand_env serve`, the managed venv, on the host's
//! 127.0.0.1), which plays each episode after its first turn against that server; the
//! trainer (`scripts/pruefstand_train/grpo.py`) in its container on the host's network,
//! which generates the first turns, asks the environment for each one's reward, steps,
//! writes the step's adapter into `out/live/step-N/` and loads it into the server.
//!
//! What it leaves: the adapter (`adapter/`), `online-training.json` (the environment's
//! manifest and dataset sha256, the rewards and their spread per step, the rollouts and
//! the errored ones, the adapters loaded), and the new version's spec, whose
//! `[adapter] trained_online` names the environment's manifest, so the held-out guard
//! and R1 read what it was trained on. No checkpoints: an interrupted online training
//! starts again from step 0; a finished one is reused.
//!
//! Not here: the environment (scripts/pruefstand_env), the trainer's steps
//! (scripts/pruefstand_train/grpo.py), judging the new version (`cmd::train`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;

use super::request::{self, Hyper, TrainingDir};
use super::{output, trainer};
use crate::container::{self, ServerSetup};
use crate::model;
use pruefstand_core::root::Root;
use pruefstand_core::spec::{ServedFileKind, Version};
use pruefstand_core::util;

/// The manifest an online training writes beside its adapter (not `training.json`,
/// whose lineage is that of exports).
pub(crate) const MANIFEST: &str = "online-training.json";

/// The online knobs (`pruefstand train --online`'s options).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct Online {
    /// Completions a case's group holds (GRPO's advantages are within a group).
    pub(crate) generations: u32,
    /// Cases a step takes.
    pub(crate) prompts_per_step: u32,
    /// Tokens of a first turn the trainer generates.
    pub(crate) completion_tokens: u32,
    /// The trainer's sampling temperature for the first turns.
    pub(crate) temperature: f64,
    /// Text every first turn begins with (given, not generated); empty: none.
    pub(crate) first_turn_prefix: String,
    /// The policy's turns after the first (then the case ends as AgentDojo scores it).
    pub(crate) max_turns: u32,
    /// Tokens of each later turn (the server's, greedy).
    pub(crate) turn_tokens: u32,
    /// The environment's cases to train on (ids); empty: all it offers.
    pub(crate) cases: Vec<String>,
}

/// What `pruefstand train --online` is asked.
pub(crate) struct Ask {
    pub(crate) base: Version,
    /// The plan whose cases the environment offers (its held-out families never).
    pub(crate) env_plan: String,
    pub(crate) hyper: Hyper,
    pub(crate) seed: u64,
    pub(crate) name: Option<String>,
    pub(crate) online: Online,
}

/// `online-training.json`.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct OnlineManifest {
    pub(crate) version: String,
    pub(crate) base_version: String,
    pub(crate) base_spec_hash: String,
    pub(crate) training: String,
    pub(crate) kind: String,
    pub(crate) environment: Environment,
    pub(crate) hyperparameters: Hyper,
    pub(crate) online: Online,
    pub(crate) seed: u64,
    pub(crate) base_model: output::BaseModel,
    pub(crate) image: output::ImageRef,
    pub(crate) trainer_sha256: String,
    pub(crate) steps: usize,
    pub(crate) losses: Vec<Option<f64>>,
    pub(crate) step_seconds: Vec<f64>,
    /// Per step: the rewards of its rollouts (null: errored, no reward) and their
    /// population standard deviation over the scored ones (0: no advantage, no update).
    pub(crate) rewards: Vec<Vec<Option<f64>>>,
    pub(crate) reward_spread: Vec<f64>,
    pub(crate) rollouts: u64,
    /// Rollouts that errored after the environment's retries: no reward, not 0.
    pub(crate) rollout_errors: u64,
    pub(crate) rollouts_retried: u64,
    /// Every adapter loaded into the running server (step 0: the initial one).
    pub(crate) adapters_loaded: Vec<String>,
    pub(crate) wall_s: f64,
    pub(crate) adapter: output::AdapterRef,
    pub(crate) finished_at: String,
    pub(crate) written_by: String,
}

/// The environment the adapter was trained in.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct Environment {
    pub(crate) plan: String,
    /// Its `dataset.jsonl.manifest.json` (what the spec's `trained_online` names).
    pub(crate) manifest: PathBuf,
    pub(crate) manifest_sha256: String,
    /// Cases offered per family, as the manifest says.
    pub(crate) families: BTreeMap<String, u64>,
    pub(crate) cases: u64,
}

/// A training done.
pub(crate) struct Trained {
    pub(crate) version: String,
    pub(crate) spec: PathBuf,
    pub(crate) dir: TrainingDir,
    pub(crate) manifest: OnlineManifest,
    pub(crate) reused: bool,
}

fn training_id(ask: &Ask, plan_text: &str) -> String {
    let asked = serde_json::json!({
        "base": ask.base.hash, "kind": "grpo", "plan": util::sha256_hex(plan_text.as_bytes()),
        "hyper": ask.hyper, "seed": ask.seed, "online": ask.online,
    });
    util::sha256_hex(asked.to_string().as_bytes())[..16].to_string()
}

/// Trains (or finds the finished training of the same ask) and writes the new spec.
pub(crate) async fn train(
    root: &Root,
    ask: Ask,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Trained> {
    let base = ask.base.clone();
    let model_path = super::checks::base_usable(&base)?;
    let (plan_path, _, plan_text) = pruefstand_core::plan::Profile::load_named(&root.path, &ask.env_plan)?;
    let id = training_id(&ask, &plan_text);
    let name = ask.name.clone().unwrap_or_else(|| format!("{}-grpo-{}", base.name, &id[..8]));
    pruefstand_core::input::check_name(&name).map_err(|why| anyhow::anyhow!("--name {name:?}: {why}"))?;
    if name == base.name {
        bail!("--name {name}: that is the base version's name; the trained version needs its own");
    }
    let dir = TrainingDir::new(&root.reports(), &name, &id);
    let manifest_path = dir.path.join(MANIFEST);
    std::fs::create_dir_all(&dir.path).with_context(|| format!("creating {}", dir.path.display()))?;
    let _lock = super::lock(root, &dir)?;
    if let Some(manifest) = finished(&dir) {
        tracing::info!("already trained: the adapter in {} (same command, same inputs)", dir.adapter().display());
        let spec = write_spec(&root.versions(), &base, &name, &manifest, &manifest_path)?;
        return Ok(Trained { version: name, spec, dir, manifest, reused: true });
    }
    // An interrupted online training starts afresh: its rollouts cannot be replayed.
    for folder in [dir.out(), dir.checkpoints(), dir.path.join("env")] {
        if folder.exists() {
            std::fs::remove_dir_all(&folder).with_context(|| format!("removing {}", folder.display()))?;
        }
    }
    let live = dir.out().join("live");
    for folder in [dir.checkpoints(), dir.code(), live.clone()] {
        std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    }
    // The server's container reads what the trainer (this user) writes there.
    std::fs::set_permissions(&live, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    tracing::info!(
        "online training {name} from {} in the environment of {}: {}",
        base.name,
        ask.env_plan,
        dir.path.display()
    );
    let trainer_sha256 = super::write_code(&dir)?;
    let base_model = crate::runtime::blocking({
        let path = model_path.clone();
        move || output::base_model(&path)
    })
    .await?;

    let mut server = ServerSetup::of(&base);
    server.model.runtime_lora = true;
    if !server.model.args.iter().any(|a| a == "--max-lora-rank" || a.starts_with("--max-lora-rank=")) {
        server.model.args.extend(["--max-lora-rank".to_string(), ask.hyper.lora_r.to_string()]);
    }
    server.lora_dir = Some(live.clone());
    let docker = container::connect().await?;
    for orphan in container::remove_orphans(&docker).await? {
        tracing::info!("{orphan}");
    }
    let image_name = server.model.image.clone().context("backend \"docker\" needs model.image")?;
    let image = container::ensure_image(&docker, &image_name, server.model.pull)
        .await
        .with_context(|| base.path.display().to_string())?;
    tracing::info!("starting {}'s model server with runtime LoRA loading", base.name);
    let pool = container::Pool::new(dir.path.join("server"));
    let context = model::UpContext {
        pool: &pool,
        run_dir: &dir.path,
        job: &format!("train-{}", std::process::id()),
        run_id: &id,
        interrupt_clients: Arc::new(|| false),
    };
    let endpoint = match model::up(&server, &dir.path.join("no-truth.json"), &context).await {
        Ok(endpoint) => endpoint,
        Err(e) => {
            let _ = pool.shutdown().await;
            return Err(anyhow::Error::new(e).context(format!("starting {}'s model server", base.name)));
        }
    };
    let api_key = endpoint.api_key.clone();
    let server_check = trainer::CheckServer { endpoint, pool };
    let result = async {
        let port =
            server_check.endpoint.container().map(|c| c.host_port).context("the model server has no container")?;
        let env = Env::start(root, &ask, &plan_path, &dir, api_key.as_deref()).await?;
        let policy_url = format!("http://127.0.0.1:{port}/v1");
        let request = serde_json::json!({
            "kind": "grpo",
            "base_model": request::MODEL,
            "base_model_name": base.spec.model.served_name,
            "chat_template": base.served_file(ServedFileKind::ChatTemplate)
                .map(|_| ServedFileKind::ChatTemplate.container_path().to_string()),
            "rows": [],
            "tokenize_url": null,
            "served_model": base.spec.model.served_name,
            "out": request::OUT,
            "checkpoints": request::CHECKPOINTS,
            "seed": ask.seed,
            "steps": ask.hyper.steps,
            "learning_rate": ask.hyper.learning_rate,
            "lora_r": ask.hyper.lora_r,
            "lora_alpha": ask.hyper.lora_alpha,
            "max_length": ask.hyper.max_length,
            "beta": ask.hyper.beta,
            "batch_size": ask.hyper.batch_size,
            "online": {
                "env_url": env.url,
                "policy_url": policy_url,
                "served_model": base.spec.model.served_name,
                "adapter_name": name,
                "live_dir": format!("{}/live", request::OUT),
                "live_dir_server": "/adapters",
                "num_generations": ask.online.generations,
                "prompts_per_step": ask.online.prompts_per_step,
                "max_completion_length": ask.online.completion_tokens,
                "temperature": ask.online.temperature,
                "prefix": ask.online.first_turn_prefix,
                "cases": ask.online.cases,
            },
        });
        util::write_json_atomic(&dir.request(), &request)?;
        Ok::<_, anyhow::Error>((env, port))
    }
    .await;
    let (mut env, _port) = match result {
        Ok(x) => x,
        Err(e) => {
            let _ = server_check.stop().await;
            return Err(e);
        }
    };
    let launch = trainer::Launch {
        docker: &docker,
        server: &server,
        model_host: &model_path,
        dir: &dir,
        exports: &[],
        api_key,
        version: &name,
        check_only: false,
    };
    // The server stays up for the whole training (the trainer emits no `checked`); the
    // trainer's run stops it at the end.
    let attempt = trainer::run(&launch, Some(server_check), stop).await;
    env.stop().await;
    let attempt = attempt?;
    if let Some(reason) = &attempt.refused {
        bail!("refused before the first step: the trainer says: {reason}");
    }
    let Some(trainer::Event::Done { sha256, losses, .. }) = attempt.done else {
        bail!("the trainer ended without its `done` line (its log: {})", dir.log().display());
    };
    let adapter = output::install_adapter(&dir, &sha256)?;
    let (step_seconds, _) = output::steps_from_events(&dir.events());
    let events = Events::read(&dir.events())?;
    let env_manifest = env.manifest.clone();
    let manifest_bytes = std::fs::read(&env_manifest).with_context(|| format!("reading {}", env_manifest.display()))?;
    let env_json: serde_json::Value =
        serde_json::from_slice(&manifest_bytes).with_context(|| format!("{}: not JSON", env_manifest.display()))?;
    let families: BTreeMap<String, u64> =
        serde_json::from_value(env_json.get("families").cloned().unwrap_or_default()).unwrap_or_default();
    let manifest = OnlineManifest {
        version: name.clone(),
        base_version: base.name.clone(),
        base_spec_hash: base.hash.clone(),
        training: id.clone(),
        kind: "grpo".into(),
        environment: Environment {
            plan: ask.env_plan.clone(),
            manifest: env_manifest.clone(),
            manifest_sha256: util::sha256_hex(&manifest_bytes),
            cases: env_json.get("rows").and_then(serde_json::Value::as_u64).unwrap_or(0),
            families,
        },
        hyperparameters: ask.hyper.clone(),
        online: ask.online.clone(),
        seed: ask.seed,
        base_model,
        image: output::ImageRef { name: image.name.clone(), id: image.id.clone(), digest: image.digest() },
        trainer_sha256,
        steps: losses.len(),
        losses,
        step_seconds,
        reward_spread: events.spread,
        rollouts: events.rewards.iter().map(|r| r.len() as u64).sum(),
        rollout_errors: events.rewards.iter().flatten().filter(|r| r.is_none()).count() as u64,
        rollouts_retried: events.retried,
        rewards: events.rewards,
        adapters_loaded: events.adapters,
        wall_s: attempt.wall_s,
        adapter,
        finished_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        written_by: format!("pruefstand {}", env!("CARGO_PKG_VERSION")),
    };
    util::write_json_atomic(&manifest_path, &manifest)?;
    let spec = write_spec(&root.versions(), &base, &name, &manifest, &manifest_path)?;
    Ok(Trained { version: name, spec, dir, manifest, reused: false })
}

/// The finished training in `dir`: its manifest, when the adapter still has its files.
fn finished(dir: &TrainingDir) -> Option<OnlineManifest> {
    let manifest: OnlineManifest = serde_json::from_slice(&std::fs::read(dir.path.join(MANIFEST)).ok()?).ok()?;
    let intact =
        manifest.adapter.sha256.iter().all(|(name, sha)| {
            pruefstand_core::files::sha256_regular(&dir.adapter().join(name)).is_ok_and(|s| s == *sha)
        });
    intact.then_some(manifest)
}

/// What the trainer's event lines say of the rollouts and adapters.
#[derive(Default)]
struct Events {
    rewards: Vec<Vec<Option<f64>>>,
    spread: Vec<f64>,
    retried: u64,
    adapters: Vec<String>,
}

impl Events {
    fn read(path: &Path) -> anyhow::Result<Events> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut out = Events::default();
        for line in text.lines() {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            match value.get("event").and_then(serde_json::Value::as_str) {
                Some("rollouts") => {
                    let rewards: Vec<Option<f64>> =
                        serde_json::from_value(value["rewards"].clone()).unwrap_or_default();
                    out.rewards.push(rewards);
                    out.spread.push(value["spread"].as_f64().unwrap_or(0.0));
                    out.retried += value["retried"].as_u64().unwrap_or(0);
                }
                Some("adapter") => {
                    if let Some(name) = value["name"].as_str() {
                        out.adapters.push(name.to_string());
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

/// The environment's service on the host: `python -m pruefstand_env serve`.
struct Env {
    child: tokio::process::Child,
    url: String,
    manifest: PathBuf,
}

impl Env {
    async fn start(root: &Root, ask: &Ask, plan: &Path, dir: &TrainingDir, key: Option<&str>) -> anyhow::Result<Env> {
        let pyenv = crate::runtime::blocking(pruefstand_gym::pyenv::PyEnv::ensure).await?;
        let bin = std::env::current_exe().context("finding this binary")?;
        let out = dir.path.join("env");
        let log = std::fs::File::create(dir.path.join("env.log")).context("creating env.log")?;
        let mut cmd = std::process::Command::new(&pyenv.python);
        util::minimal_env(&mut cmd);
        util::die_with_parent(&mut cmd);
        cmd.args(["-m", "pruefstand_env", "serve", "--plan"])
            .arg(plan)
            .arg("--seed")
            .arg(ask.seed.to_string())
            .arg("--root")
            .arg(&root.path)
            .arg("--out")
            .arg(&out)
            .args(["--kind", "attacked", "--kind", "clean"])
            .args(["--max-turns", &ask.online.max_turns.to_string()])
            .args(["--max-tokens", &ask.online.turn_tokens.to_string()])
            .env("PYTHONPATH", &pyenv.scripts)
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PRUEFSTAND_BIN", &bin)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log);
        if let Some(key) = key {
            // By environment only: never argv or a file.
            cmd.env("PRUEFSTAND_API_KEY", key);
        }
        let mut child = tokio::process::Command::from(cmd)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the environment with {}", pyenv.python.display()))?;
        let stdout = child.stdout.take().context("the environment's stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(600), lines.next_line()).await;
        let line = match first {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) | Ok(Err(_)) => {
                let _ = child.kill().await;
                let log = std::fs::read_to_string(dir.path.join("env.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
                bail!("the environment ended before it served (its log, env.log):\n    {}", tail.join("\n    "));
            }
            Err(_) => {
                let _ = child.kill().await;
                bail!("the environment did not serve within 600 s (its log: {})", dir.path.join("env.log").display());
            }
        };
        #[derive(Deserialize)]
        struct Ready {
            url: String,
            manifest: PathBuf,
            cases: u64,
        }
        let ready: Ready = serde_json::from_str(&line)
            .with_context(|| format!("the environment's first line is not its address: {line}"))?;
        tracing::info!("environment: {} case(s) at {} ({})", ready.cases, ready.url, ready.manifest.display());
        Ok(Env { child, url: ready.url, manifest: ready.manifest })
    }

    async fn stop(&mut self) {
        if let Some(pid) = self.child.id() {
            // SIGTERM: it writes its counts and ends.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}

/// The new version's spec: the base's, with its reference the base, `[adapter]` the
/// trained one and `trained_online` the environment's manifest (absolute), vLLM's LoRA
/// rank limit raised where the base sets none, the served files by absolute path.
fn write_spec(
    versions: &Path,
    base: &Version,
    name: &str,
    manifest: &OnlineManifest,
    manifest_path: &Path,
) -> anyhow::Result<PathBuf> {
    let description = format!(
        "{} + a GRPO LoRA (r {}) trained online {} step(s) in the environment of {} by `pruefstand train`",
        base.name, manifest.hyperparameters.lora_r, manifest.steps, manifest.environment.plan
    );
    let env_manifest = std::path::absolute(&manifest.environment.manifest)?;
    let spec = output::NewSpec {
        description,
        lora_r: manifest.hyperparameters.lora_r,
        adapter: &manifest.adapter.path,
        trained_on: ("trained_online", vec![env_manifest.display().to_string()]),
        training: &manifest.training,
        how: ", online",
        manifest_path,
    };
    output::write_spec_of(versions, base, name, spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trainers_events_give_each_steps_rewards_errors_and_the_adapters_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trainer-events.jsonl");
        let lines = [
            r#"{"event": "adapter", "step": 0, "name": "v-step-0", "served": ["m", "v-step-0"]}"#,
            r#"{"event": "start", "steps": 2, "resumed_from": 0}"#,
            r#"{"event": "rollouts", "step": 1, "rewards": [0.0, 0.5, null, 0.5], "spread": 0.2357, "retried": 1}"#,
            "a line of another kind",
            r#"{"event": "adapter", "step": 1, "name": "v-step-1"}"#,
            r#"{"event": "rollouts", "step": 2, "rewards": [0.5, 0.5], "spread": 0.0, "retried": 0}"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let events = Events::read(&path).unwrap();
        assert_eq!(events.rewards, vec![vec![Some(0.0), Some(0.5), None, Some(0.5)], vec![Some(0.5), Some(0.5)]]);
        assert_eq!(events.spread, vec![0.2357, 0.0]);
        assert_eq!(events.retried, 1);
        assert_eq!(events.adapters, ["v-step-0", "v-step-1"]);
        // An errored rollout is no reward, never a 0.
        assert_eq!(events.rewards.iter().flatten().filter(|r| r.is_none()).count(), 1);
    }
}
