//! Drives the Python gym (`scripts/gym.py`, docs/protocol.md §2): runs a plan's cases
//! through it as a child process on the runtime (`tokio::process`), reads its event
//! stream line by line as typed [`GymEvent`]s and fans each out to the pass's sinks —
//! the events log, the records, the progress, the daemon's status, whatever the caller
//! adds (early stop) and the concurrency steering. A sink that asks to drain gets the
//! gym told once. The sinks and the run directory's reads and writes (fsync'd) run on
//! the blocking pool, never on a runtime worker.
//!
//! It never reads AgentDojo's log folders: results arrive as events. Judging them is
//! `telemetry`'s and `judge`'s job; deciding when to stop early is the run's.

#[cfg(test)]
mod contract;
pub(crate) use pruefstand_gym::events;
pub(crate) use pruefstand_gym::request::DetectorRequest;
use pruefstand_gym::request::GymRequest;
pub(crate) mod open;
pub(crate) mod sinks;

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::concurrency::{Concurrency, Observer};
use crate::runtime;
pub(crate) use events::{Ask, GymEvent, Seen, Sink};
use pruefstand_core::case::{Case, CaseRecord};
use pruefstand_core::inventory::Inventory;
use pruefstand_core::plan::Plan;
use pruefstand_core::record::{ConcurrencyFacts, Wording};
use pruefstand_core::{family, telemetry, util};
use pruefstand_gym::pyenv::PyEnv;
use pruefstand_store::{PlanFile, RunDir, RunFile};

/// How to run a plan's cases (the `gym` command's arguments, or a version's run).
pub(crate) struct GymSettings {
    pub(crate) agent_cmd: Vec<String>,
    pub(crate) concurrency: Concurrency,
    /// The model server's `/metrics` (None: no gauges to read; steered by latency).
    pub(crate) metrics_url: Option<String>,
    pub(crate) display_name: String,
    pub(crate) case_timeout_s: f64,
    pub(crate) seed: u64,
    pub(crate) defence: Option<String>,
    /// The classifier of the `pi_detector` defence.
    pub(crate) detector: Option<DetectorRequest>,
    pub(crate) agent_env: Vec<(String, String)>,
    /// The caller's stop switch and progress handle.
    pub(crate) control: Option<std::sync::Arc<Control>>,
    /// Case ids in the order to dispatch them (early stopping); None: the gym's own (a user task's cases together, longest first).
    pub(crate) order: Option<Vec<String>>,
    /// The caller's own sinks (early stop), after the pass's standard ones.
    pub(crate) sinks: Vec<Box<dyn Sink>>,
    /// Wording of cases beyond the plan's per-run draws (the adaptive attacker's).
    pub(crate) wording: std::collections::BTreeMap<String, Wording>,
    /// Templates of cases an attacker model wrote (the adaptive attacker's).
    pub(crate) templates: std::collections::BTreeMap<String, String>,
    /// How the caller's handle sees this pass (a run with an attacker campaign: one run
    /// of plan and campaign together); None: as it is.
    pub(crate) frame: Option<Frame>,
}

/// A pass's counts as part of a larger whole: reported under `run_dir`, `done_before`
/// added to what is done, `total` the whole's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) run_dir: std::path::PathBuf,
    pub(crate) done_before: usize,
    pub(crate) total: usize,
}

impl Frame {
    /// A later pass of the whole (an attacker campaign's round): what its first pass
    /// said (the run directory, a resume) is said again only at debug, so a campaign of
    /// 20 rounds does not repeat it 20 times.
    fn continues(&self) -> bool {
        self.done_before > 0
    }
}

pub(crate) struct Executed {
    pub(crate) gym: GymOutcome,
    pub(crate) telemetry: telemetry::Telemetry,
}

/// The template each case of a found family injects (fixed per case id).
pub(crate) fn found_templates(plan: &Plan) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    for family in &plan.found {
        let attack = family.attack();
        for case in plan.cases.iter().filter(|c| c.attack.as_deref() == Some(attack.as_str())) {
            out.insert(case.id.clone(), family.template_for(&case.id).to_string());
        }
    }
    out
}

/// Runs (or resumes) the plan's cases in a claimed run directory, and writes the
/// telemetry.
pub(crate) async fn execute(
    pyenv: &PyEnv,
    run_dir: &RunDir,
    plan: &Plan,
    inventory: &Inventory,
    settings: GymSettings,
) -> anyhow::Result<Executed> {
    let continues = settings.frame.as_ref().is_some_and(Frame::continues);
    let (request, pass) = prepare(run_dir, plan, inventory, settings).await?;
    let outcome = run(pyenv, run_dir, request, pass).await?;
    executed(run_dir, plan, outcome, continues).await
}

/// A pass's request and connections from its settings, with `plan.json` written and
/// the run directory said (at debug for a later pass of a whole).
async fn prepare(
    run_dir: &RunDir,
    plan: &Plan,
    inventory: &Inventory,
    settings: GymSettings,
) -> anyhow::Result<(GymRequest, Pass)> {
    let plan_file = PlanFile::new(plan, inventory);
    blocking_in(run_dir, move |run_dir| run_dir.write_plan(&plan_file)).await?;
    if settings.frame.as_ref().is_some_and(Frame::continues) {
        tracing::debug!("run directory: {}", run_dir.path().display());
    } else {
        tracing::info!("run directory: {}", run_dir.path().display());
    }
    let request = GymRequest {
        run_dir: run_dir.path().canonicalize()?,
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
        templates: found_templates(plan).into_iter().chain(settings.templates).collect(),
        open: None,
    };
    let pass = Pass {
        agent_env: settings.agent_env,
        control: settings.control,
        concurrency: settings.concurrency,
        metrics_url: settings.metrics_url,
        sinks: settings.sinks,
        frame: settings.frame,
    };
    Ok((request, pass))
}

/// A finished pass said (a resume) and its telemetry written.
async fn executed(run_dir: &RunDir, plan: &Plan, outcome: GymOutcome, continues: bool) -> anyhow::Result<Executed> {
    if outcome.skipped > 0 || !outcome.rerun.is_empty() {
        let line = format!("resumed: {} cases already recorded, {} run again", outcome.skipped, outcome.rerun.len());
        // A later pass of a run (an attacker campaign's): the run's resume is said once.
        if continues && outcome.rerun.is_empty() {
            tracing::debug!("{line}");
        } else {
            tracing::info!("{line}");
        }
    }
    let plan = plan.clone();
    let (outcome, telemetry) = blocking_in(run_dir, move |run_dir| {
        let telemetry = write_telemetry(run_dir, &plan, &outcome.records);
        (outcome, telemetry)
    })
    .await;
    Ok(Executed { gym: outcome, telemetry: telemetry? })
}

/// `telemetry.json` and `telemetry.md` over a run's records.
pub(crate) fn write_telemetry(
    run_dir: &RunDir,
    plan: &Plan,
    records: &[CaseRecord],
) -> anyhow::Result<telemetry::Telemetry> {
    let telemetry = telemetry::compute(&plan.benchmark_version, plan.cases.len(), records);
    run_dir.write(&telemetry)?;
    let title = format!("{} — plan {}", pruefstand_core::root::run_id(run_dir.path()), plan.name);
    run_dir.write_telemetry_markdown(&telemetry::markdown(&title, &telemetry))?;
    Ok(telemetry)
}

/// What a finished gym run leaves behind.
pub(crate) struct GymOutcome {
    /// One record per planned case, in plan order.
    pub(crate) records: Vec<CaseRecord>,
    /// Cases already in `cases.jsonl` that were not run again.
    pub(crate) skipped: usize,
    /// Cases run again because their record or trace was damaged.
    pub(crate) rerun: Vec<String>,
    /// How many cases were in flight (None when none ran).
    pub(crate) concurrency: Option<ConcurrencyFacts>,
    /// Cases never started because the watch said the verdict was decided.
    pub(crate) not_started: Option<usize>,
}

/// One pass's connections: what the agents get by environment, the caller's handle,
/// how the in-flight count is steered, the caller's sinks.
pub(crate) struct Pass {
    pub(crate) agent_env: Vec<(String, String)>,
    pub(crate) control: Option<std::sync::Arc<Control>>,
    pub(crate) concurrency: Concurrency,
    /// The model server's `/metrics` (None: steered by latency).
    pub(crate) metrics_url: Option<String>,
    pub(crate) sinks: Vec<Box<dyn Sink>>,
    pub(crate) frame: Option<Frame>,
}

/// `progress(run_dir, counts)`.
type ProgressSink = dyn Fn(&Path, Counts) + Send + Sync;

/// A caller's handle on a running gym (the daemon's): a progress sink, and a stop
/// switch that kills the gym's whole process group — its workers and the agents they
/// spawned — so a cancelled or interrupted job leaves nothing running.
#[derive(Default)]
pub(crate) struct Control {
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
    /// `progress(run_dir, counts)` after the start and every case.
    pub(crate) fn with_progress(progress: impl Fn(&Path, Counts) + Send + Sync + 'static) -> Control {
        Control { progress: Some(Box::new(progress)), state: Default::default() }
    }

    /// No progress reports: only the stop switches.
    pub(crate) fn new() -> Control {
        Control { progress: None, state: Default::default() }
    }

    /// Ends the running gym now (SIGKILL to its process group; `cases.jsonl` keeps every
    /// finished case) but lets a later gym start — to resume after the model server was
    /// restarted. True when a gym was running.
    pub(crate) fn interrupt(&self) -> bool {
        let state = util::lock(&self.state);
        if let Some(pgid) = state.pgid {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
        }
        state.pgid.is_some()
    }

    /// Stops the gym now (SIGKILL to its process group; `cases.jsonl` keeps every
    /// finished case) and refuses to start another.
    pub(crate) fn stop(&self) {
        let mut state = util::lock(&self.state);
        state.stopped = true;
        if let Some(pgid) = state.pgid {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
        }
    }

    pub(crate) fn is_stopped(&self) -> bool {
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
    pub(crate) fn report(&self, run_dir: &Path, counts: Counts) {
        if let Some(progress) = &self.progress {
            progress(run_dir, counts);
        }
    }
}

/// A run's cases at a progress report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Recorded, this time or before (a resumed run's).
    pub(crate) done: usize,
    pub(crate) total: usize,
    /// Running now (0 where not known: a cluster's shards).
    pub(crate) in_flight: usize,
}

/// Runs `request.cases` into `run_dir`, resuming what is already recorded there: the
/// resume state, the gym started, the environment handshake, its events followed
/// through the pass's sinks, then the records compacted.
/// `agent_env` (the model's URL and key) reaches the agents only: the gym reads it from
/// its stdin and adds it to their environments, never to its own.
/// With a `control`, the gym runs in its own process group so it can be stopped.
pub(crate) async fn run(
    pyenv: &PyEnv,
    run_dir: &RunDir,
    request: GymRequest,
    pass: Pass,
) -> anyhow::Result<GymOutcome> {
    let control = pass.control.clone();
    if control.as_deref().is_some_and(Control::is_stopped) {
        bail!("stopped before the gym started");
    }
    let request = blocking_in(run_dir, move |run_dir| resume(run_dir, request)).await?;
    let planned = request.cases.len();
    let mut child = spawn(pyenv, run_dir, control.is_some())?;
    let commands =
        hand_over(child.stdin.take().expect("piped stdin"), &pass.agent_env, &pass.concurrency, false).await?;
    let observer = Observer::spawn(&pass.concurrency, pass.metrics_url.clone(), commands, planned);
    if let (Some(control), Some(pid)) = (&control, child.id()) {
        control.attach(pid);
    }
    let (caller, feed, frame) = (pass.sinks, observer.feed(), pass.frame);
    let follow =
        blocking_in(run_dir, move |run_dir| Follow::open(run_dir, (control, frame), caller, feed, planned)).await?;
    let (follow, result) = follow_events(&mut child, follow).await;
    if result.is_err() {
        let _ = child.start_kill();
    }
    let status = child.wait().await?;
    ended(run_dir, (status, follow, result), observer, pass.control.as_deref(), request.cases).await
}

/// A pass whose gym has ended (its exit status, the events followed, whether reading
/// them failed): the steering's facts, a stop or a failed gym said as such, the records
/// compacted to `cases`.
async fn ended(
    run_dir: &RunDir,
    (status, follow, result): (std::process::ExitStatus, Follow, anyhow::Result<()>),
    observer: Observer,
    control: Option<&Control>,
    cases: Vec<Case>,
) -> anyhow::Result<GymOutcome> {
    let Follow { fanout, tally, .. } = follow;
    // The progress bar ends with its sink, before anything more is said.
    drop(fanout);
    let concurrency = Some(observer.finish().await).filter(|f| f.peak_in_flight > 0);
    if let Some(control) = control {
        control.detach();
        if control.is_stopped() {
            bail!(
                "stopped on request (the gym was killed; finished cases are kept in {})",
                run_dir.shown(RunFile::Cases)
            );
        }
    }
    result?;
    let log_path = run_dir.gym_log_path();
    if !status.success() || !tally.finished {
        bail!("the gym failed ({status}); {}", log_quote(&log_path));
    }
    let drained = tally.not_started.is_some();
    let records = blocking_in(run_dir, move |run_dir| compact(run_dir, &cases, drained)).await?;
    Ok(GymOutcome { records, skipped: tally.skipped, rerun: tally.rerun, concurrency, not_started: tally.not_started })
}

/// Runs `f` over the run directory on the blocking pool (`crate::runtime::blocking`).
async fn blocking_in<R: Send + 'static>(run_dir: &RunDir, f: impl FnOnce(&RunDir) -> R + Send + 'static) -> R {
    let run_dir = run_dir.clone();
    runtime::blocking(move || f(&run_dir)).await
}

/// The resume state: which recorded cases the gym skips (all planned ones but those
/// that ended in a bench error, which run again), written with the request where the
/// gym reads it (`gym-request.json`).
fn resume(run_dir: &RunDir, mut request: GymRequest) -> anyhow::Result<GymRequest> {
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
    run_dir.write(&request)?;
    Ok(request)
}

/// Starts `gym.py run` on the run directory's request, its stderr appended to the gym's
/// log, its stdin and stdout piped.
fn spawn(pyenv: &PyEnv, run_dir: &RunDir, own_group: bool) -> anyhow::Result<tokio::process::Child> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(run_dir.gym_log_path())?;
    let mut command = tokio::process::Command::from(pyenv.gym_command());
    if own_group {
        // Its own group: a stop kills workers and agents too, and a terminal's Ctrl-C
        // reaches the daemon only, which then stops the gym itself.
        command.process_group(0);
    }
    command
        .arg("run")
        .arg("--request")
        .arg(run_dir.gym_request_path())
        .arg("--agent-env-stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting the gym with {}", pyenv.python.display()))
}

/// The environment handshake: the agents' environment is the first line on the gym's
/// stdin. Then the gym reads commands from its stdin: the steering's, an open pass's
/// cases (`open`: kept whatever the count), or none for a fixed count (closed here: EOF).
async fn hand_over(
    mut stdin: tokio::process::ChildStdin,
    agent_env: &[(String, String)],
    concurrency: &Concurrency,
    open: bool,
) -> anyhow::Result<crate::concurrency::Commands> {
    let agent_env: std::collections::BTreeMap<&str, &str> =
        agent_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut line = serde_json::to_vec(&serde_json::json!({ "agent_env": agent_env }))?;
    line.push(b'\n');
    // A gym that died at once shows in its status later; this write must not hide it.
    if let Err(err) = stdin.write_all(&line).await {
        tracing::debug!("handing the agent environment to the gym: {err}");
    }
    Ok(match concurrency {
        Concurrency::Fixed(_) if !open => None,
        _ => Some(Box::new(stdin)),
    })
}

/// Reads the gym's stdout to its end, each line taken by the pass's [`Follow`] on the
/// blocking pool (the records sink fsyncs every case); the first drain a sink asks for
/// is passed on to the gym (SIGUSR1), and a stop (SIGUSR2). The fan-out comes back also when reading failed.
async fn follow_events(child: &mut tokio::process::Child, mut follow: Follow) -> (Follow, anyhow::Result<()>) {
    let stdout = child.stdout.take().expect("piped stdout");
    let gym_pid = child.id().map(|pid| nix::unistd::Pid::from_raw(pid as i32));
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut asked = Ask::Continue;
    loop {
        let line = match lines.next_line().await.context("reading the gym's events") {
            Ok(Some(line)) if line.trim().is_empty() => continue,
            Ok(Some(line)) => line,
            Ok(None) => return (follow, Ok(())),
            Err(err) => return (follow, Err(err)),
        };
        let ask;
        (follow, ask) = runtime::blocking(move || {
            let ask = follow.take(&line);
            (follow, ask)
        })
        .await;
        use nix::sys::signal::Signal;
        match ask {
            Err(err) => return (follow, Err(err)),
            Ok(ask) if ask > asked => {
                asked = ask;
                let signal = match ask {
                    Ask::Stop => {
                        tracing::info!("the verdict is decided: no new case starts, the cases in flight are stopped");
                        Signal::SIGUSR2
                    }
                    _ => {
                        tracing::info!("no new case starts, the cases in flight finish");
                        Signal::SIGUSR1
                    }
                };
                if let Some(pid) = gym_pid {
                    let _ = nix::sys::signal::kill(pid, signal);
                }
            }
            Ok(_) => {}
        }
    }
}

/// A pass's fan-out of sinks, and the counts the driver keeps over its events.
struct Follow {
    fanout: Vec<Box<dyn Sink>>,
    seen: Seen,
    /// The ids of the cases in flight.
    started: std::collections::HashSet<String>,
    tally: Tally,
}

impl Follow {
    /// The pass's standard sinks (events log, records, progress, the caller's handle),
    /// the caller's own (early stop), and the steering last.
    fn open(
        run_dir: &RunDir,
        (control, frame): (Option<std::sync::Arc<Control>>, Option<Frame>),
        caller: Vec<Box<dyn Sink>>,
        feed: crate::concurrency::Feed,
        planned: usize,
    ) -> anyhow::Result<Follow> {
        let records = sinks::Records::open(run_dir)?;
        let events = sinks::EventsLog::open(run_dir)?;
        let progress = sinks::Progress::new(planned, frame.as_ref().is_some_and(Frame::continues));
        let mut fanout: Vec<Box<dyn Sink>> = vec![Box::new(events), Box::new(records), Box::new(progress)];
        if let Some(control) = control {
            fanout.push(Box::new(sinks::Report::new(control, run_dir, frame)));
        }
        fanout.extend(caller);
        fanout.push(Box::new(sinks::Steering::new(feed)));
        let seen = Seen::new(planned);
        Ok(Follow { fanout, seen, started: Default::default(), tally: Tally::default() })
    }

    /// One line of the gym's stdout: every sink gets it as printed, then — when it is an
    /// event — counted and handed to every sink in turn; whether one asked to drain.
    fn take(&mut self, line: &str) -> anyhow::Result<Ask> {
        for sink in &mut self.fanout {
            sink.line(line)?;
        }
        let event: GymEvent = match serde_json::from_str(line) {
            Ok(event) => event,
            Err(err) => {
                tracing::warn!("ignoring a gym output line that is not an event ({err}): {line}");
                return Ok(Ask::Continue);
            }
        };
        self.seen.take(&event, &mut self.started);
        self.tally.take(&event);
        let mut ask = Ask::Continue;
        for sink in &mut self.fanout {
            ask = ask.max(sink.on(&event, &self.seen)?);
        }
        Ok(ask)
    }
}

/// The pass's records in plan order, `cases.jsonl` compacted to them; a planned case
/// without one fails the pass, unless the gym drained.
fn compact(run_dir: &RunDir, cases: &[Case], drained: bool) -> anyhow::Result<Vec<CaseRecord>> {
    let stored = run_dir.read_cases_lenient()?;
    let records = run_dir.compact_cases(cases, &stored)?;
    if records.len() != cases.len() && !drained {
        bail!(
            "the gym finished but {} of {} planned cases have no record (see {})",
            cases.len() - records.len(),
            cases.len(),
            run_dir.gym_log_path().display()
        );
    }
    Ok(records)
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
            GymEvent::Drained { not_started, stopped } => {
                // A stop after a drain says so in a second event: both count.
                self.not_started = Some(self.not_started.unwrap_or(0) + not_started);
                if *stopped > 0 {
                    tracing::info!("{stopped} cases in flight stopped: the verdict was decided without them");
                }
            }
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
    let done: Vec<String> = recorded
        .iter()
        .filter(|r| r.outcome() != pruefstand_core::case::Outcome::Error)
        .map(|r| r.case_id.clone())
        .collect();
    let errors = recorded.len() - done.len();
    (done, errors)
}

/// The end of the gym's log for an error, or why there is none: never an empty quote.
fn log_quote(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => format!("its log {}:\n{}", path.display(), tail(path, 20)),
        Ok(_) => format!("its log {} is empty (nothing written: a full disk, or a kill before a word)", path.display()),
        Err(err) => format!("its log {} cannot be read: {err}", path.display()),
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_core::case::Outcome;

    #[test]
    fn an_empty_gym_log_is_said_so_not_quoted_as_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = RunDir::new(dir.path()).gym_log_path();
        std::fs::write(&log, "").unwrap();
        assert!(log_quote(&log).ends_with("is empty (nothing written: a full disk, or a kill before a word)"));
        std::fs::write(&log, "one\ntwo\n").unwrap();
        assert_eq!(log_quote(&log), format!("its log {}:\none\ntwo", log.display()));
        assert!(log_quote(&dir.path().join("missing")).contains("cannot be read"));
    }

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
