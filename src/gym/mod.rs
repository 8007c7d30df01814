//! Drives the Python gym (`scripts/gym.py`, docs/protocol.md §2): runs a plan's cases
//! through it as a child process on the runtime (`tokio::process`), reads its event
//! stream line by line as typed [`GymEvent`]s and fans each out to the pass's sinks —
//! the records, the progress, the concurrency steering, and whatever the caller adds
//! (early stop, the daemon's status). A sink that asks to drain gets the gym told once.
//!
//! It never reads AgentDojo's log folders: results arrive as events. Judging them is
//! `telemetry`'s and `judge`'s job; deciding when to stop early is the run's.

#[cfg(test)]
mod contract;
pub mod events;
pub mod sinks;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::case::{Case, CaseRecord};
use crate::concurrency::{Concurrency, Observer};
use crate::plan::Plan;
use crate::pyenv::{Inventory, PyEnv};
use crate::record::{ConcurrencyFacts, Wording};
use crate::rundir::{PlanFile, RunDir, RunFile};
use crate::{family, telemetry, util};
pub use events::{Ask, GymEvent, Seen, Sink};

/// How to run a plan's cases (the `gym` command's arguments, or a version's run).
pub struct GymSettings {
    pub agent_cmd: Vec<String>,
    pub concurrency: Concurrency,
    /// The model server's `/metrics` (None: no gauges to read; steered by latency).
    pub metrics_url: Option<String>,
    pub display_name: String,
    pub case_timeout_s: f64,
    pub seed: u64,
    pub defence: Option<String>,
    /// The classifier of the `pi_detector` defence.
    pub detector: Option<DetectorRequest>,
    pub agent_env: Vec<(String, String)>,
    /// The caller's stop switch and progress handle.
    pub control: Option<std::sync::Arc<Control>>,
    /// Case ids in the order to dispatch them (early stopping); None: the gym's own (a user task's cases together, longest first).
    pub order: Option<Vec<String>>,
    /// The caller's own sinks (early stop), after the pass's standard ones.
    pub sinks: Vec<Box<dyn Sink>>,
    /// Wording of cases beyond the plan's per-run draws (the adaptive attacker's).
    pub wording: std::collections::BTreeMap<String, Wording>,
}

pub struct Executed {
    pub gym: GymOutcome,
    pub telemetry: telemetry::Telemetry,
}

/// Runs (or resumes) the plan's cases in a claimed run directory, and writes the
/// telemetry.
pub async fn execute(
    pyenv: &PyEnv,
    run_dir: &RunDir,
    plan: &Plan,
    inventory: &Inventory,
    settings: GymSettings,
) -> anyhow::Result<Executed> {
    run_dir.write_plan(&PlanFile::new(plan, inventory))?;
    tracing::info!("run directory: {}", run_dir.path.display());
    let request = GymRequest {
        run_dir: run_dir.path.canonicalize()?,
        benchmark_version: plan.benchmark_version.clone(),
        jobs: settings.concurrency.start().max(1),
        max_in_flight: settings.concurrency.ceiling().max(1),
        agent_cmd: settings.agent_cmd,
        model_display_name: settings.display_name,
        case_timeout_s: settings.case_timeout_s,
        seed: settings.seed,
        defence: settings.defence,
        detector: settings.detector,
        cases: plan.cases.clone(),
        done: Vec::new(),
        order: settings.order,
        wording: family::wordings(&plan.cases, settings.seed).into_iter().chain(settings.wording).collect(),
    };
    let pass = Pass {
        agent_env: settings.agent_env,
        control: settings.control,
        concurrency: settings.concurrency,
        metrics_url: settings.metrics_url,
        sinks: settings.sinks,
    };
    let outcome = run(pyenv, run_dir, request, pass).await?;
    if outcome.skipped > 0 || !outcome.rerun.is_empty() {
        tracing::info!("resumed: {} cases already recorded, {} run again", outcome.skipped, outcome.rerun.len());
    }
    let telemetry = write_telemetry(run_dir, plan, &outcome.records)?;
    Ok(Executed { gym: outcome, telemetry })
}

/// `telemetry.json` and `telemetry.md` over a run's records.
pub fn write_telemetry(run_dir: &RunDir, plan: &Plan, records: &[CaseRecord]) -> anyhow::Result<telemetry::Telemetry> {
    let telemetry = telemetry::compute(&plan.benchmark_version, plan.cases.len(), records);
    run_dir.write_json(RunFile::Telemetry, &telemetry)?;
    let title = format!("{} — plan {}", crate::root::run_id(&run_dir.path), plan.name);
    util::write_atomic(
        &run_dir.path_of(RunFile::TelemetryMarkdown),
        telemetry::markdown(&title, &telemetry).as_bytes(),
    )?;
    Ok(telemetry)
}

/// Everything `gym.py run` needs (docs/protocol.md §2).
#[derive(Serialize, schemars::JsonSchema, Debug)]
pub struct GymRequest {
    pub run_dir: PathBuf,
    pub benchmark_version: String,
    /// Cases in flight to begin with.
    #[schemars(range(min = 1, max = crate::settings::MAX_IN_FLIGHT))]
    pub jobs: usize,
    /// The most cases in flight; between the two, pruefstand's `concurrency` commands
    /// on the gym's stdin decide.
    #[schemars(range(min = 1, max = crate::settings::MAX_IN_FLIGHT))]
    pub max_in_flight: usize,
    pub agent_cmd: Vec<String>,
    pub model_display_name: String,
    pub case_timeout_s: f64,
    pub seed: u64,
    pub defence: Option<String>,
    /// With `defence = "pi_detector"`: the classifier AgentDojo's detector asks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detector: Option<DetectorRequest>,
    pub cases: Vec<Case>,
    pub done: Vec<String>,
    /// Case ids in the order to dispatch them (early stopping); absent: the gym's own (a user task's cases together, longest first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<String>>,
    /// The wording of every case whose attack is worded from a family grammar, by case
    /// id: drawn from the run's seed (docs/attacks.md), so a resume injects the same text.
    pub wording: std::collections::BTreeMap<String, Wording>,
}

/// The classification endpoint of the gym's prompt-injection detector
/// (docs/defences.md): POST `{"model", "input": [text]}`, answered with vLLM's
/// `{"data": [{"label", "probs"}]}`.
#[derive(Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct DetectorRequest {
    /// The endpoint, e.g. `http://127.0.0.1:8001/classify`.
    pub url: String,
    pub model: String,
    pub safe_label: String,
    /// A text is an injection when P(`safe_label`) < threshold.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub threshold: f64,
    pub timeout_s: f64,
    /// Send the model server's key (from the agents' environment): the endpoint is the
    /// version's own model server.
    pub model_server_key: bool,
}

impl DetectorRequest {
    /// The request for a version's `[guardrail] kind = "classifier"`, its model server at
    /// `base_url` (`…/v1`): vLLM serves `/classify` beside `/v1`, not under it.
    pub fn of(spec: &crate::settings::defence::ClassifierSpec, base_url: &str) -> Self {
        let own = || format!("{}/classify", base_url.trim_end_matches('/').trim_end_matches("/v1"));
        DetectorRequest {
            url: spec.url.clone().unwrap_or_else(own),
            model: spec.model.clone(),
            safe_label: spec.safe_label.clone(),
            threshold: spec.threshold,
            timeout_s: spec.timeout_s,
            model_server_key: spec.url.is_none(),
        }
    }
}

/// What a finished gym run leaves behind.
pub struct GymOutcome {
    /// One record per planned case, in plan order.
    pub records: Vec<CaseRecord>,
    /// Cases already in `cases.jsonl` that were not run again.
    pub skipped: usize,
    /// Cases run again because their record or trace was damaged.
    pub rerun: Vec<String>,
    /// How many cases were in flight (None when none ran).
    pub concurrency: Option<ConcurrencyFacts>,
    /// Cases never started because the watch said the verdict was decided.
    pub not_started: Option<usize>,
}

/// One pass's connections: what the agents get by environment, the caller's handle,
/// how the in-flight count is steered, the caller's sinks.
pub struct Pass {
    pub agent_env: Vec<(String, String)>,
    pub control: Option<std::sync::Arc<Control>>,
    pub concurrency: Concurrency,
    /// The model server's `/metrics` (None: steered by latency).
    pub metrics_url: Option<String>,
    pub sinks: Vec<Box<dyn Sink>>,
}

/// `progress(run_dir, cases done, cases planned)`.
type ProgressSink = dyn Fn(&Path, usize, usize) + Send + Sync;

/// A caller's handle on a running gym (the daemon's): a progress sink, and a stop
/// switch that kills the gym's whole process group — its workers and the agents they
/// spawned — so a cancelled or interrupted job leaves nothing running.
#[derive(Default)]
pub struct Control {
    progress: Option<Box<ProgressSink>>,
    state: std::sync::Mutex<ControlState>,
}

#[derive(Default)]
struct ControlState {
    stopped: bool,
    /// The running gym's process group.
    pgid: Option<i32>,
}

impl Control {
    /// `progress(run_dir, cases done, cases planned)` after the start and every case.
    pub fn with_progress(progress: impl Fn(&Path, usize, usize) + Send + Sync + 'static) -> Control {
        Control { progress: Some(Box::new(progress)), state: Default::default() }
    }

    /// No progress reports: only the stop switches.
    pub fn new() -> Control {
        Control { progress: None, state: Default::default() }
    }

    /// Ends the running gym now (SIGKILL to its process group; `cases.jsonl` keeps every
    /// finished case) but lets a later gym start — to resume after the model server was
    /// restarted. True when a gym was running.
    pub fn interrupt(&self) -> bool {
        let state = util::lock(&self.state);
        if let Some(pgid) = state.pgid {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
        }
        state.pgid.is_some()
    }

    /// Stops the gym now (SIGKILL to its process group; `cases.jsonl` keeps every
    /// finished case) and refuses to start another.
    pub fn stop(&self) {
        let mut state = util::lock(&self.state);
        state.stopped = true;
        if let Some(pgid) = state.pgid {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
        }
    }

    pub fn is_stopped(&self) -> bool {
        util::lock(&self.state).stopped
    }

    /// Registers the gym's process group; false (and the group killed) when a stop
    /// came first. Under one lock with `stop`, so no gym escapes a stop.
    fn attach(&self, pgid: u32) -> bool {
        let mut state = util::lock(&self.state);
        state.pgid = Some(pgid as i32);
        if state.stopped {
            let _ =
                nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid as i32), nix::sys::signal::Signal::SIGKILL);
        }
        !state.stopped
    }

    fn detach(&self) {
        util::lock(&self.state).pgid = None;
    }

    /// Reports progress to the caller's sink (also for cases run elsewhere: a cluster's
    /// shards).
    pub fn report(&self, run_dir: &Path, done: usize, total: usize) {
        if let Some(progress) = &self.progress {
            progress(run_dir, done, total);
        }
    }
}

/// Runs `request.cases` into `run_dir`, resuming what is already recorded there.
/// `agent_env` (the model's URL and key) reaches the agents only: the gym reads it from
/// its stdin and adds it to their environments, never to its own.
/// With a `control`, the gym runs in its own process group so it can be stopped.
pub async fn run(pyenv: &PyEnv, run_dir: &RunDir, mut request: GymRequest, pass: Pass) -> anyhow::Result<GymOutcome> {
    let control = pass.control.as_deref();
    if control.is_some_and(Control::is_stopped) {
        bail!("stopped before the gym started");
    }
    let stored = run_dir.read_cases_lenient()?;
    for damage in &stored.damaged {
        tracing::warn!("{damage} (that case runs again)");
    }
    let planned: std::collections::BTreeSet<&str> = request.cases.iter().map(|c| c.id.as_str()).collect();
    let (done, bench_errors) = resumable(&stored.records, &planned);
    if bench_errors > 0 {
        tracing::info!("{bench_errors} recorded cases ended in a bench error (server, timeout, agent): they run again");
    }
    request.done = done;
    let request_path = run_dir.path_of(RunFile::GymRequest);
    util::write_json_atomic(&request_path, &request)?;

    let log_path = run_dir.path_of(RunFile::GymLog);
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
    let mut command = tokio::process::Command::from(pyenv.gym_command());
    if control.is_some() {
        // Its own group: a stop kills workers and agents too, and a terminal's Ctrl-C
        // reaches the daemon only, which then stops the gym itself.
        command.process_group(0);
    }
    let mut child = command
        .arg("run")
        .arg("--request")
        .arg(&request_path)
        .arg("--agent-env-stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting the gym with {}", pyenv.python.display()))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut stdin = child.stdin.take().expect("piped stdin");
    {
        let agent_env: std::collections::BTreeMap<&str, &str> =
            pass.agent_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut line = serde_json::to_vec(&serde_json::json!({ "agent_env": agent_env }))?;
        line.push(b'\n');
        // A gym that died at once shows in its status below; this write must not hide it.
        if let Err(err) = stdin.write_all(&line).await {
            tracing::debug!("handing the agent environment to the gym: {err}");
        }
    }
    // Then the gym reads commands from its stdin; a fixed count needs none (closed: EOF).
    let commands: crate::concurrency::Commands = match pass.concurrency {
        Concurrency::Auto { .. } => Some(Box::new(stdin)),
        Concurrency::Fixed(_) => None,
    };
    let mut steering = sinks::Steering::new(Observer::spawn(
        &pass.concurrency,
        pass.metrics_url.clone(),
        commands,
        request.cases.len(),
    ));
    let gym_pid = child.id().map(|pid| nix::unistd::Pid::from_raw(pid as i32));
    if let (Some(control), Some(pid)) = (control, child.id()) {
        control.attach(pid);
    }

    // The pass's standard sinks, then the caller's (steering apart: its task is ended
    // and read after the pass).
    let mut fanout: Vec<Box<dyn Sink>> =
        vec![Box::new(sinks::Records::open(run_dir)?), Box::new(sinks::Progress::new(request.cases.len()))];
    if let Some(control) = &pass.control {
        fanout.push(Box::new(sinks::Report::new(control.clone(), run_dir)));
    }
    fanout.extend(pass.sinks);
    let mut events_log =
        std::fs::OpenOptions::new().create(true).append(true).open(run_dir.path_of(RunFile::Events))?;
    let mut tally = Tally::default();
    let mut seen = Seen::new(request.cases.len());
    let mut started = std::collections::HashSet::new();
    let mut drain_asked = false;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let result: anyhow::Result<()> = async {
        while let Some(line) = lines.next_line().await.context("reading the gym's events")? {
            if line.trim().is_empty() {
                continue;
            }
            std::io::Write::write_all(&mut events_log, format!("{line}\n").as_bytes())?;
            let event: GymEvent = match serde_json::from_str(&line) {
                Ok(event) => event,
                Err(err) => {
                    tracing::warn!("ignoring a gym output line that is not an event ({err}): {line}");
                    continue;
                }
            };
            seen.take(&event, &mut started);
            tally.take(&event);
            let mut ask = Ask::Continue;
            let all = fanout.iter_mut().map(|s| s.as_mut() as &mut dyn Sink);
            for sink in all.chain(std::iter::once(&mut steering as &mut dyn Sink)) {
                if sink.on(&event, &seen)? == Ask::Drain {
                    ask = Ask::Drain;
                }
            }
            if ask == Ask::Drain && !drain_asked {
                drain_asked = true;
                tracing::info!("the verdict is decided: no new case starts, the cases in flight finish");
                if let Some(pid) = gym_pid {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1);
                }
            }
        }
        Ok(())
    }
    .await;
    if result.is_err() {
        let _ = child.start_kill();
    }
    let status = child.wait().await?;
    // The progress bar ends with its sink, before anything more is said.
    drop(fanout);
    let concurrency = steering.finish().await;
    if let Some(control) = control {
        control.detach();
        if control.is_stopped() {
            bail!(
                "stopped on request (the gym was killed; finished cases are kept in {})",
                run_dir.cases_file().display()
            );
        }
    }
    result?;
    if !status.success() || !tally.finished {
        bail!("the gym failed ({status}); its log {}:\n{}", log_path.display(), tail(&log_path, 20));
    }
    let stored = run_dir.read_cases_lenient()?;
    let records = run_dir.compact_cases(&request.cases, &stored)?;
    if records.len() != request.cases.len() && tally.not_started.is_none() {
        bail!(
            "the gym finished but {} of {} planned cases have no record (see {})",
            request.cases.len() - records.len(),
            request.cases.len(),
            log_path.display()
        );
    }
    Ok(GymOutcome { records, skipped: tally.skipped, rerun: tally.rerun, concurrency, not_started: tally.not_started })
}

/// What the driver itself keeps of a pass's events for its outcome.
#[derive(Default)]
struct Tally {
    skipped: usize,
    rerun: Vec<String>,
    not_started: Option<usize>,
    finished: bool,
}

impl Tally {
    fn take(&mut self, event: &GymEvent) {
        match event {
            GymEvent::Skip {} => self.skipped += 1,
            GymEvent::Rerun { case_id, reason } => {
                tracing::info!("re-running {case_id}: {reason}");
                self.rerun.push(case_id.clone());
            }
            GymEvent::Warning { message } => tracing::warn!("{message}"),
            GymEvent::Drained { not_started } => self.not_started = Some(*not_started),
            GymEvent::Done => self.finished = true,
            _ => {}
        }
    }
}

/// The recorded cases a resume keeps — every planned one except those that ended in
/// a bench error (the server failed, the agent died, a timeout), which say nothing
/// about the model and run again — and how many of those there were.
fn resumable(
    records: &std::collections::BTreeMap<String, CaseRecord>,
    planned: &std::collections::BTreeSet<&str>,
) -> (Vec<String>, usize) {
    let recorded: Vec<&CaseRecord> = records.values().filter(|r| planned.contains(r.case_id.as_str())).collect();
    let done: Vec<String> =
        recorded.iter().filter(|r| r.outcome() != crate::case::Outcome::Error).map(|r| r.case_id.clone()).collect();
    let errors = recorded.len() - done.len();
    (done, errors)
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::Outcome;

    #[test]
    fn a_resume_runs_bench_errors_again_and_keeps_everything_else() {
        let case = |id: &str, outcome: Outcome, error: Option<&str>| {
            let mut record = CaseRecord::of(&Case::clean("s", id), Some(false), None);
            record.case_id = id.into();
            record.outcome = Some(outcome);
            record.error = error.map(String::from);
            (id.to_string(), record)
        };
        let records = [
            case("scored", Outcome::Scored, None),
            case("overflow", Outcome::ContextOverflow, None),
            case("agent-died", Outcome::Error, Some("the agent died")),
            case("not-planned", Outcome::Scored, None),
        ]
        .into_iter()
        .collect();
        let planned = ["scored", "overflow", "agent-died"].into_iter().collect();
        let (done, errors) = resumable(&records, &planned);
        assert_eq!(done, ["overflow", "scored"]);
        assert_eq!(errors, 1);
    }
}
