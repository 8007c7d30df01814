//! Drives the Python gym (`scripts/gym.py`, docs/protocol.md §2): asks it for the
//! inventory of suites, tasks and attacks and for the ground truth the simulator
//! follows, and runs a plan's cases through it — reading its event stream, appending
//! each finished case to `cases.jsonl` the moment it arrives, and showing progress.
//!
//! It never reads AgentDojo's log folders: results arrive as events. Judging them is
//! `telemetry`'s and `judge`'s job.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::case::{Case, CaseRecord};
use crate::concurrency::{Concurrency, Observer};
use crate::plan::Plan;
use crate::pyenv::{Inventory, PyEnv};
use crate::record::{ConcurrencyFacts, EnvCheck, Wording};
use crate::rundir::RunDir;
use crate::{console, family, telemetry, util};

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
    pub agent_env: Vec<(String, String)>,
    /// The daemon's stop switch and progress sink.
    pub control: Option<std::sync::Arc<Control>>,
    /// Early stopping: the dispatch order and the look that may end the run.
    pub early: Option<EarlyWatch>,
    /// Wording of cases beyond the plan's per-run draws (the adaptive attacker's).
    pub wording: std::collections::BTreeMap<String, Wording>,
}

/// `watch(None)` at the gym's start and `watch(Some(record))` after each finished case:
/// true when the verdict is decided. The gym then starts no new case, lets the cases in
/// flight finish and ends (its `drained` event).
pub type Watch = Box<dyn FnMut(Option<&CaseRecord>) -> bool + Send>;

/// How an early-stopping run dispatches and when it stops starting cases.
pub struct EarlyWatch {
    /// Case ids in dispatch order (the gym keeps it instead of longest-first).
    pub order: Vec<String>,
    pub watch: Watch,
}

pub struct Executed {
    pub gym: GymOutcome,
    pub telemetry: telemetry::Telemetry,
}

/// Runs (or resumes) the plan's cases in a claimed run directory, and writes the
/// telemetry.
pub fn execute(
    pyenv: &PyEnv,
    run_dir: &RunDir,
    plan: &Plan,
    inventory: &Inventory,
    settings: GymSettings,
) -> anyhow::Result<Executed> {
    run_dir.write_plan(&plan_json(plan, inventory))?;
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
        cases: plan.cases.clone(),
        done: Vec::new(),
        order: settings.early.as_ref().map(|e| e.order.clone()),
        wording: family::wordings(&plan.cases, settings.seed).into_iter().chain(settings.wording).collect(),
    };
    let steer = Steering { concurrency: settings.concurrency, metrics_url: settings.metrics_url };
    let watch = settings.early.map(|e| e.watch);
    let outcome = run(pyenv, run_dir, request, &settings.agent_env, settings.control.as_deref(), &steer, watch)?;
    if outcome.skipped > 0 || !outcome.rerun.is_empty() {
        tracing::info!("resumed: {} cases already recorded, {} run again", outcome.skipped, outcome.rerun.len());
    }
    let telemetry = write_telemetry(run_dir, plan, &outcome.records)?;
    Ok(Executed { gym: outcome, telemetry })
}

/// `plan.json`: the cases a run directory runs.
pub fn plan_json(plan: &Plan, inventory: &Inventory) -> serde_json::Value {
    serde_json::json!({
        "name": plan.name,
        "source": plan.source,
        "hash": plan.hash,
        "benchmark_version": plan.benchmark_version,
        "agentdojo_version": inventory.agentdojo_version,
        "cases": plan.cases,
        "adaptive": plan.adaptive,
    })
}

/// `telemetry.json` and `telemetry.md` over a run's records.
pub fn write_telemetry(run_dir: &RunDir, plan: &Plan, records: &[CaseRecord]) -> anyhow::Result<telemetry::Telemetry> {
    let telemetry = telemetry::compute(&plan.benchmark_version, plan.cases.len(), records);
    util::write_json_atomic(&run_dir.file("telemetry.json"), &telemetry)?;
    let title = format!("{} — plan {}", crate::root::run_id(&run_dir.path), plan.name);
    util::write_atomic(&run_dir.file("telemetry.md"), telemetry::markdown(&title, &telemetry).as_bytes())?;
    Ok(telemetry)
}

/// Everything `gym.py run` needs (docs/protocol.md §2).
#[derive(Serialize, Debug)]
pub struct GymRequest {
    pub run_dir: PathBuf,
    pub benchmark_version: String,
    /// Cases in flight to begin with.
    pub jobs: usize,
    /// The most cases in flight; between the two, pruefstand's `concurrency` commands
    /// on the gym's stdin decide.
    pub max_in_flight: usize,
    pub agent_cmd: Vec<String>,
    pub model_display_name: String,
    pub case_timeout_s: f64,
    pub seed: u64,
    pub defence: Option<String>,
    pub cases: Vec<Case>,
    pub done: Vec<String>,
    /// Case ids in the order to dispatch them (early stopping); absent: longest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<String>>,
    /// The wording of every case whose attack is worded from a family grammar, by case
    /// id: drawn from the run's seed (docs/attacks.md), so a resume injects the same text.
    pub wording: std::collections::BTreeMap<String, Wording>,
}

/// The gym's stdout events.
#[derive(Deserialize, Debug)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Event {
    Start { total: usize, to_run: usize, jobs: usize, processes: Option<usize> },
    Skip {},
    Rerun { case_id: String, reason: String },
    CaseStart { case_id: String },
    Case { record: Box<CaseRecord> },
    EnvironmentCheck { checks: Vec<EnvCheck> },
    Warning { message: String },
    Drained { not_started: usize },
    Done,
}

/// What a finished gym run leaves behind.
pub struct GymOutcome {
    /// One record per planned case, in plan order.
    pub records: Vec<CaseRecord>,
    pub environment_checks: Vec<EnvCheck>,
    /// Cases already in `cases.jsonl` that were not run again.
    pub skipped: usize,
    /// Cases run again because their record or trace was damaged.
    pub rerun: Vec<String>,
    /// How many cases were in flight (None when none ran).
    pub concurrency: Option<ConcurrencyFacts>,
    /// Cases never started because the watch said the verdict was decided.
    pub not_started: Option<usize>,
}

/// How the gym's in-flight count is steered during a run.
pub struct Steering {
    pub concurrency: Concurrency,
    pub metrics_url: Option<String>,
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
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pgid) = state.pgid {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
        }
        state.pgid.is_some()
    }

    /// Stops the gym now (SIGKILL to its process group; `cases.jsonl` keeps every
    /// finished case) and refuses to start another.
    pub fn stop(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.stopped = true;
        if let Some(pgid) = state.pgid {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).stopped
    }

    /// Registers the gym's process group; false (and the group killed) when a stop
    /// came first. Under one lock with `stop`, so no gym escapes a stop.
    fn attach(&self, pgid: u32) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.pgid = Some(pgid as i32);
        if state.stopped {
            let _ =
                nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid as i32), nix::sys::signal::Signal::SIGKILL);
        }
        !state.stopped
    }

    fn detach(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).pgid = None;
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
pub fn run(
    pyenv: &PyEnv,
    run_dir: &RunDir,
    mut request: GymRequest,
    agent_env: &[(String, String)],
    control: Option<&Control>,
    steer: &Steering,
    mut watch: Option<Watch>,
) -> anyhow::Result<GymOutcome> {
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
    let request_path = run_dir.file("gym-request.json");
    util::write_json_atomic(&request_path, &request)?;

    let log_path = run_dir.file("gym.log");
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
    let mut command = pyenv.gym_command();
    if control.is_some() {
        // Its own group: a stop kills workers and agents too, and a terminal's Ctrl-C
        // reaches the daemon only, which then stops the gym itself.
        use std::os::unix::process::CommandExt;
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
        .spawn()
        .with_context(|| format!("starting the gym with {}", pyenv.python.display()))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut stdin = child.stdin.take().expect("piped stdin");
    {
        let agent_env: std::collections::BTreeMap<&str, &str> =
            agent_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut line = serde_json::to_vec(&serde_json::json!({ "agent_env": agent_env }))?;
        line.push(b'\n');
        // A gym that died at once shows in its status below; this write must not hide it.
        if let Err(err) = stdin.write_all(&line) {
            tracing::debug!("handing the agent environment to the gym: {err}");
        }
    }
    // Then the gym reads commands from its stdin; a fixed count needs none (closed: EOF).
    let commands: Option<Box<dyn Write + Send>> = match steer.concurrency {
        Concurrency::Auto { .. } => Some(Box::new(stdin)),
        Concurrency::Fixed(_) => None,
    };
    let mut observer =
        Some(Observer::spawn(&steer.concurrency, steer.metrics_url.clone(), commands, request.cases.len()));
    let mut started = std::collections::HashSet::new();
    if let Some(control) = control {
        control.attach(child.id());
    }

    let mut events_log = std::fs::OpenOptions::new().create(true).append(true).open(run_dir.file("events.jsonl"))?;
    let mut writer = run_dir.open_cases_for_append()?;
    let mut progress = console::Progress::new(request.cases.len());
    let mut outcome = GymOutcome {
        records: Vec::new(),
        environment_checks: Vec::new(),
        skipped: 0,
        rerun: Vec::new(),
        concurrency: None,
        not_started: None,
    };
    let mut finished = false;
    // Asks the gym (SIGUSR1 to its main process) to start no new case, once.
    let gym_pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let mut drain_asked = false;
    let mut look = |record: Option<&CaseRecord>| {
        if !drain_asked && watch.as_mut().is_some_and(|w| w(record)) {
            drain_asked = true;
            tracing::info!("the verdict is decided: no new case starts, the cases in flight finish");
            let _ = nix::sys::signal::kill(gym_pid, nix::sys::signal::Signal::SIGUSR1);
        }
    };
    let result: anyhow::Result<()> = (|| {
        for line in BufReader::new(stdout).lines() {
            let line = line.context("reading the gym's events")?;
            if line.trim().is_empty() {
                continue;
            }
            writeln!(events_log, "{line}")?;
            let event: Event = match serde_json::from_str(&line) {
                Ok(event) => event,
                Err(err) => {
                    tracing::warn!("ignoring a gym output line that is not an event ({err}): {line}");
                    continue;
                }
            };
            match event {
                Event::Start { total, to_run, jobs, processes } => {
                    progress.start(total, to_run, jobs, processes.unwrap_or(jobs));
                    if let Some(observer) = &observer {
                        observer.live().to_start = to_run;
                    }
                    look(None);
                    if let Some(control) = control {
                        control.report(&run_dir.path, progress.done(), progress.total());
                    }
                }
                Event::Skip { .. } => outcome.skipped += 1,
                Event::Rerun { case_id, reason } => {
                    tracing::info!("re-running {case_id}: {reason}");
                    outcome.rerun.push(case_id);
                }
                Event::CaseStart { case_id } => {
                    tracing::debug!("case {case_id} started");
                    started.insert(case_id);
                    if let Some(observer) = &observer {
                        let mut live = observer.live();
                        live.set_in_flight(started.len());
                        live.to_start = live.to_start.saturating_sub(1);
                    }
                    progress.in_flight(started.len());
                }
                Event::Case { record } => {
                    writer.append(&record)?;
                    started.remove(&record.case_id);
                    if let Some(observer) = &observer {
                        let mut live = observer.live();
                        live.set_in_flight(started.len());
                        if let Some(per_call) = per_call_s(&record) {
                            live.per_call_s.push(per_call);
                        }
                    }
                    progress.in_flight(started.len());
                    progress.case_done(record.is_error());
                    look(Some(&record));
                    if let Some(control) = control {
                        control.report(&run_dir.path, progress.done(), progress.total());
                    }
                }
                Event::EnvironmentCheck { checks } => {
                    util::write_json_atomic(
                        &run_dir.file("environment_check.json"),
                        &serde_json::json!({ "checks": checks }),
                    )?;
                    outcome.environment_checks = checks;
                }
                Event::Warning { message } => tracing::warn!("{message}"),
                Event::Drained { not_started } => outcome.not_started = Some(not_started),
                Event::Done => finished = true,
            }
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = child.kill();
    }
    let status = child.wait()?;
    drop(progress);
    let facts = observer.take().map(Observer::finish);
    outcome.concurrency = facts.filter(|f| f.peak_in_flight > 0);
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
    if !status.success() || !finished {
        bail!("the gym failed ({status}); its log {}:\n{}", log_path.display(), tail(&log_path, 20));
    }
    let stored = run_dir.read_cases_lenient()?;
    outcome.records = run_dir.compact_cases(&request.cases, &stored)?;
    if outcome.records.len() != request.cases.len() && outcome.not_started.is_none() {
        bail!(
            "the gym finished but {} of {} planned cases have no record (see {})",
            request.cases.len() - outcome.records.len(),
            request.cases.len(),
            log_path.display()
        );
    }
    if outcome.environment_checks.is_empty()
        && let Ok(text) = std::fs::read_to_string(run_dir.file("environment_check.json"))
    {
        let value: serde_json::Value = serde_json::from_str(&text)?;
        outcome.environment_checks = serde_json::from_value(value["checks"].clone())?;
    }
    Ok(outcome)
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

/// Seconds per model call of a scored case (what the latency rule steers by).
fn per_call_s(record: &CaseRecord) -> Option<f64> {
    let calls = record.llm_calls.filter(|&n| n > 0)?;
    (!record.is_error()).then(|| record.duration_s / calls as f64)
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
