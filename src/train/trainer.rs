//! The trainer in its container: made from the base version's model image as the model
//! server is (`container::Setup`: the same image, the model folder and the served chat
//! template mounted read-only at the same paths, the same GPU request, labels and
//! owner, so orphan removal and the GPU guard know it), given its request, its exports
//! (read-only) and its durable folders; run as `python -m pruefstand_train
//! /work/request.json` — an argv, no shell. Its JSON-line events (the contract in
//! docs/training.md) are read as they come: step, loss and ETA shown, every line kept
//! in `trainer-events.jsonl`, its stderr in `trainer.log`.
//!
//! The model server it checks its rows against (`/tokenize`) is stopped as soon as the
//! trainer says every row matched, so the trainer never shares the GPU with it.
//! Host networking: the server publishes on the host's 127.0.0.1 only.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::models::{Mount, MountBindOptions, MountType};
use futures_util::StreamExt;
use serde::Deserialize;

use super::request::{self, TrainingDir};
use crate::container::{self, ServerSetup};
use crate::model;

/// One event line of the trainer's stdout.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(crate) enum Event {
    /// Every row rendered and matched the server's /tokenize.
    Checked {
        rows: u64,
        tokens: u64,
    },
    /// Training begins (`resumed_from`: the last checkpoint's step, 0 when fresh).
    Start {
        steps: u64,
        resumed_from: u64,
    },
    /// After an optimizer step (its checkpoint durable); `seconds`: that step's wall
    /// time. Either may be null (a loss that was not finite, a time not measured).
    Step {
        step: u64,
        steps: u64,
        loss: Option<f64>,
        seconds: Option<f64>,
    },
    Done {
        adapter: String,
        sha256: BTreeMap<String, String>,
        losses: Vec<Option<f64>>,
        rows_used: u64,
    },
    /// Bad input, before the first step.
    Refused {
        reason: String,
    },
}

/// What one attempt of the trainer came to.
#[derive(Debug, Default)]
pub(crate) struct Attempt {
    pub(crate) checked: Option<(u64, u64)>,
    pub(crate) resumed_from: Option<u64>,
    /// Per step seen in this attempt: (step, loss, seconds).
    pub(crate) steps: Vec<(u64, Option<f64>, Option<f64>)>,
    pub(crate) done: Option<Event>,
    pub(crate) refused: Option<String>,
    pub(crate) exit_code: i64,
    pub(crate) wall_s: f64,
}

/// The model server a trainer checks its rows against, stopped once they match.
pub(crate) struct CheckServer {
    pub(crate) endpoint: model::Endpoint,
    pub(crate) pool: container::Pool,
}

impl CheckServer {
    pub(super) fn tokenize_url(&self) -> Option<String> {
        self.endpoint.container().map(|c| format!("http://127.0.0.1:{}/tokenize", c.host_port))
    }

    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.endpoint.down(&self.pool).await?;
        self.pool.shutdown().await
    }
}

/// What the trainer's container is made of.
pub(crate) struct Launch<'a> {
    pub(crate) docker: &'a Docker,
    pub(crate) server: &'a ServerSetup,
    pub(crate) model_host: &'a Path,
    pub(crate) dir: &'a TrainingDir,
    pub(crate) exports: &'a [PathBuf],
    /// The server's key, for /tokenize (by environment, never in request.json).
    pub(crate) api_key: Option<String>,
    pub(crate) version: &'a str,
    /// The trainer stops after its rows matched the server (`train --check-only`).
    pub(crate) check_only: bool,
}

/// Runs the trainer once, to its exit; `check` is stopped when the trainer has
/// checked its rows (or at the end). `stop` ends it early: the container is removed,
/// the checkpoints stay.
pub(crate) async fn run(
    launch: &Launch<'_>,
    mut check: Option<CheckServer>,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Attempt> {
    let started = Instant::now();
    let body = body(launch)?;
    let name = format!(
        "pruefstand-train-{}-{:08x}",
        launch.version.chars().filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c)).take(40).collect::<String>(),
        rand::RngExt::random::<u32>(&mut rand::rng())
    );
    let id = container::create(launch.docker, &name, body).await?;
    let result = follow(launch, &id, &mut check, stop, started).await;
    // The container is ours whatever happened; its checkpoints are on the host.
    if let Err(e) = container::stop_and_remove(launch.docker, &id).await {
        tracing::warn!("removing the trainer's container {name}: {e:#}");
    }
    if let Some(server) = check.take()
        && let Err(e) = server.stop().await
    {
        tracing::warn!("stopping the model server: {e:#}");
    }
    result
}

async fn follow(
    launch: &Launch<'_>,
    id: &str,
    check: &mut Option<CheckServer>,
    stop: impl std::future::Future<Output = ()>,
    started: Instant,
) -> anyhow::Result<Attempt> {
    let docker = launch.docker;
    docker.start_container(id, None::<bollard::query_parameters::StartContainerOptions>).await.with_context(|| {
        format!("starting the trainer's container from {}", launch.server.model.image.as_deref().unwrap_or("?"))
    })?;
    let options =
        bollard::query_parameters::LogsOptionsBuilder::default().follow(true).stdout(true).stderr(true).build();
    let mut logs = docker.logs(id, Some(options));
    let open = |path: PathBuf| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))
    };
    let mut events_file = open(launch.dir.events())?;
    let mut log_file = open(launch.dir.log())?;
    let mut attempt = Attempt::default();
    let mut eta = StepClock::default();
    let (mut out_buf, mut err_buf) = (Vec::new(), Vec::new());
    tokio::pin!(stop);
    loop {
        let chunk = tokio::select! {
            chunk = logs.next() => chunk,
            () = &mut stop => bail!("interrupted: the trainer's container was removed; its checkpoints stay, and the same command resumes from the last"),
        };
        let Some(chunk) = chunk else { break };
        match chunk.context("reading the trainer's output")? {
            bollard::container::LogOutput::StdOut { message } => {
                out_buf.extend_from_slice(&message);
                while let Some(at) = out_buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = out_buf.drain(..=at).collect();
                    events_file.write_all(&line)?;
                    on_line(&line, &mut attempt, &mut eta, check).await;
                }
            }
            bollard::container::LogOutput::StdErr { message } => {
                err_buf.extend_from_slice(&message);
                log_file.write_all(&message)?;
                // The last lines are all a failure needs.
                if err_buf.len() > 64 << 10 {
                    err_buf.drain(..err_buf.len() - (32 << 10));
                }
            }
            _ => {}
        }
    }
    if !out_buf.is_empty() {
        events_file.write_all(&out_buf)?;
        on_line(&out_buf, &mut attempt, &mut eta, check).await;
    }
    events_file.sync_all()?;
    let info = docker.inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>).await?;
    attempt.exit_code = info.state.and_then(|s| s.exit_code).unwrap_or(-1);
    attempt.wall_s = started.elapsed().as_secs_f64();
    if attempt.exit_code != 0 && attempt.refused.is_none() {
        let text = String::from_utf8_lossy(&err_buf);
        let tail: Vec<&str> = text.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
        bail!(
            "the trainer exited with code {}{}; its last lines ({}):\n    {}",
            attempt.exit_code,
            if attempt.exit_code == 137 { " (killed)" } else { "" },
            launch.dir.log().display(),
            tail.join("\n    ")
        );
    }
    Ok(attempt)
}

/// One stdout line: typed, shown, and the server stopped once the rows matched.
async fn on_line(line: &[u8], attempt: &mut Attempt, clock: &mut StepClock, check: &mut Option<CheckServer>) {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    let event: Event = match serde_json::from_str(text) {
        Ok(event) => event,
        Err(e) => {
            // A line of another kind (a newer trainer's) is kept in trainer-events.jsonl only.
            tracing::debug!(
                "trainer: a line that is no event of ours ({e}): {}",
                pruefstand_core::util::cut(text, 200)
            );
            return;
        }
    };
    match &event {
        Event::Checked { rows, tokens } => {
            tracing::info!("trainer: {rows} row(s), {tokens} tokens, rendered as the server renders them (/tokenize)");
            attempt.checked = Some((*rows, *tokens));
            if let Some(server) = check.take() {
                tracing::info!("stopping the model server: the trainer does not share it");
                if let Err(e) = server.stop().await {
                    tracing::warn!("stopping the model server: {e:#}");
                }
            }
        }
        Event::Start { steps, resumed_from } => {
            attempt.resumed_from = Some(*resumed_from);
            match resumed_from {
                0 => tracing::info!("training: {steps} step(s)"),
                k => tracing::info!("training: resumed after step {k} of {steps} (its checkpoint)"),
            }
        }
        Event::Step { step, steps, loss, seconds } => {
            attempt.steps.push((*step, *loss, *seconds));
            if let Some(seconds) = seconds {
                clock.observe(*seconds);
            }
            let eta = clock
                .remaining_s(steps.saturating_sub(*step))
                .map_or_else(String::new, |s| format!(", ETA {}", span(s)));
            let loss = loss.map_or_else(|| "not finite".to_string(), |l| format!("{l:.4}"));
            let took = seconds.map_or_else(String::new, |s| format!(" ({s:.1} s)"));
            tracing::info!("step {step}/{steps}: loss {loss}{took}{eta}");
        }
        Event::Done { .. } => attempt.done = Some(event.clone()),
        Event::Refused { reason } => attempt.refused = Some(reason.clone()),
    }
}

/// The ETA of the steps left: the median of the last few steps' seconds times the
/// steps left (a step's time is steady; a median keeps a checkpoint's write from
/// swinging it).
#[derive(Default)]
pub(super) struct StepClock {
    recent: Vec<f64>,
}

impl StepClock {
    const KEEP: usize = 5;

    pub(crate) fn observe(&mut self, seconds: f64) {
        if seconds.is_finite() && seconds >= 0.0 {
            self.recent.push(seconds);
            if self.recent.len() > Self::KEEP {
                self.recent.remove(0);
            }
        }
    }

    pub(crate) fn remaining_s(&self, steps_left: u64) -> Option<f64> {
        let median = pruefstand_core::util::percentile(self.recent.clone(), 0.5)?;
        Some(median * steps_left as f64)
    }
}

/// Seconds in words: `8 s`, `3 min 05 s`, `2 h 07 min`.
pub(crate) fn span(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min {:02} s", s / 60, s % 60),
        s => format!("{} h {:02} min", s / 3600, (s % 3600) / 60),
    }
}

/// The container: the model server's body for this image and model (GPU, shm, ulimits,
/// labels and owner, no-new-privileges), with the trainer's command, environment and
/// mounts instead of the server's, no published port, and the host's network.
fn body(launch: &Launch<'_>) -> anyhow::Result<bollard::models::ContainerCreateBody> {
    let setup = container::Setup::new(launch.server, launch.model_host.to_path_buf(), None)?;
    let labels = HashMap::from([
        (container::LABEL_JOB.to_string(), format!("train-{}", std::process::id())),
        (container::LABEL_RUN.to_string(), launch.dir.id.clone()),
        (container::LABEL_VERSION.to_string(), launch.version.to_string()),
    ]);
    let mut body = setup.body("", 0, labels);
    let mut cmd = vec!["python", "-m", "pruefstand_train"];
    if launch.check_only {
        cmd.push("--check-only");
    }
    cmd.push(request::REQUEST);
    body.cmd = Some(cmd.into_iter().map(String::from).collect());
    let mut env = vec![
        "PYTHONHASHSEED=0".to_string(),
        format!("PYTHONPATH={}", request::CODE),
        "PYTHONUNBUFFERED=1".into(),
        "PYTHONDONTWRITEBYTECODE=1".into(),
        "HF_HUB_OFFLINE=1".into(),
        "TRANSFORMERS_OFFLINE=1".into(),
        // Caches of torch and friends: somewhere any user may write.
        "HOME=/tmp".into(),
    ];
    if let Some(key) = &launch.api_key {
        env.push(format!("PRUEFSTAND_TOKENIZE_KEY={key}"));
    }
    body.env = Some(env);
    body.exposed_ports = None;
    // The files it writes are the user's, not root's.
    body.user = Some(format!("{}:{}", nix::unistd::getuid(), nix::unistd::getgid()));
    let host = body.host_config.get_or_insert_with(Default::default);
    host.port_bindings = None;
    host.network_mode = Some("host".into());
    // An init as PID 1, so a stop's SIGTERM ends the trainer at once (Python as PID 1
    // ignores it, and the stop would wait out its grace period).
    host.init = Some(true);
    let mut mounts: Vec<Mount> =
        host.mounts.take().unwrap_or_default().into_iter().filter(|m| m.typ == Some(MountType::BIND)).collect();
    let bind = |source: &Path, target: &str, read_only: bool| Mount {
        source: Some(source.display().to_string()),
        target: Some(target.to_string()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        bind_options: Some(MountBindOptions { non_recursive: Some(true), ..Default::default() }),
        ..Default::default()
    };
    let dir = launch.dir;
    mounts.push(bind(&std::path::absolute(dir.request())?, request::REQUEST, true));
    mounts.push(bind(&std::path::absolute(dir.code())?, request::CODE, true));
    mounts.push(bind(&std::path::absolute(dir.out())?, request::OUT, false));
    mounts.push(bind(&std::path::absolute(dir.checkpoints())?, request::CHECKPOINTS, false));
    for (i, export) in launch.exports.iter().enumerate() {
        mounts.push(bind(&std::path::absolute(export)?, &request::export_in_container(i), true));
    }
    host.mounts = Some(mounts);
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contracts_event_lines_are_typed() {
        let parse = |s: &str| serde_json::from_str::<Event>(s).unwrap();
        assert_eq!(parse(r#"{"event":"checked","rows":3,"tokens":900}"#), Event::Checked { rows: 3, tokens: 900 });
        assert_eq!(
            parse(r#"{"event":"start","steps":4,"resumed_from":2}"#),
            Event::Start { steps: 4, resumed_from: 2 }
        );
        assert_eq!(
            parse(r#"{"event":"step","step":1,"steps":4,"loss":0.693,"seconds":21.5}"#),
            Event::Step { step: 1, steps: 4, loss: Some(0.693), seconds: Some(21.5) }
        );
        let done = parse(
            r#"{"event":"done","adapter":"/work/out/adapter","sha256":{"adapter_config.json":"ab"},"losses":[0.69,0.5],"rows_used":3}"#,
        );
        assert!(matches!(done, Event::Done { rows_used: 3, ref losses, .. } if losses.len() == 2));
        assert_eq!(
            parse(r#"{"event":"refused","reason":"row a.jsonl:2: token 5 differs"}"#),
            Event::Refused { reason: "row a.jsonl:2: token 5 differs".into() }
        );
        assert_eq!(
            parse(r#"{"event":"step","step":2,"steps":4,"loss":null,"seconds":null}"#),
            Event::Step { step: 2, steps: 4, loss: None, seconds: None }
        );
        assert!(serde_json::from_str::<Event>(r#"{"event":"step","steps":4}"#).is_err(), "a step without its number");
        assert!(
            matches!(parse(r#"{"event":"checked","rows":1,"tokens":2,"server":true}"#), Event::Checked { rows: 1, .. }),
            "a field of a newer trainer is no error"
        );
    }

    #[test]
    fn the_eta_is_the_median_step_times_the_steps_left() {
        let mut clock = StepClock::default();
        assert_eq!(clock.remaining_s(3), None, "no step yet, no ETA");
        for s in [20.0, 22.0, 90.0, 21.0] {
            clock.observe(s);
        }
        assert_eq!(clock.remaining_s(2), Some(2.0 * 21.0), "one slow step (a checkpoint) does not swing it");
        clock.observe(f64::NAN);
        assert_eq!(clock.remaining_s(0), Some(0.0));
        assert_eq!(span(8.4), "8 s");
        assert_eq!(span(88.0), "1 min 28 s");
        assert_eq!(span(7620.0), "2 h 07 min");
    }
}
