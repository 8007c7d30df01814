//! `pruefstand daemon`: runs the queued jobs of one bench root, one at a time.
//!
//! One instance per root (flock on `.pruefstand/daemon.lock`). At rest it blocks on a
//! channel fed by inotify (`jobs/` only), SIGTERM/SIGINT and — when systemd asked for
//! one — the watchdog timer: no polling. Each job goes through the guards' [`Gate`],
//! then becomes a `RunRequest` for the same `Session::run` that `pruefstand run` takes,
//! as a task on the daemon's runtime (the process has one), with the job's snapshot as
//! spec and plan, into the run directory recorded in the job (so a crashed or stopped
//! job resumes there and the gym skips its recorded cases).
//!
//! The executor is `cluster::executor`'s choice: with `[cluster] kind = "slurm"` a job
//! runs as a Slurm job array (no local guards or bench lock; the shards pass their
//! nodes' own), else on the local gym.
//!
//! Hooks fire in background tasks: a slow or dead endpoint never delays the next job.
//! A job's notifications are written down in its folder before the first attempt, and
//! what a stop or crash left owed is sent again when the daemon starts.
//!
//! `pruefstand.toml` is read once, at start: an edit while it runs is logged (once per
//! new content) with the word that a restart applies it — or, when the edited file does
//! not load, with its error and the word that a restart would fail.
//!
//! SIGHUP asks for a reload: the daemon stops as at SIGTERM (a running job goes back as
//! interrupted and resumes) and exits with [`RELOAD_EXIT`], a failure to systemd, so the
//! unit's `Restart=on-failure` starts it again with the config read anew.

mod gate;
mod night;
pub(crate) mod state;

use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::console;
use crate::gym;
use crate::hooks::{self, Facts};
use crate::lock_wait::{self, Waited};
use crate::run::{RunControl, RunRequest, Session};
use crate::runtime;
use gate::{Gate, Guarded};
use pruefstand_core::queue::{self, Headline, Job, Queue, State, Transition};
use pruefstand_core::record::Verdict;
use pruefstand_core::root::{CONFIG_FILE, Root};
use pruefstand_core::util::Failure;
use pruefstand_gym::pyenv::PyEnv;
use pruefstand_store::RunLock;
use pruefstand_store::benchlock;
use state::{Activity, JobProgress, Publisher};
use tracing::Instrument;

/// The exit status after a SIGHUP (EX_TEMPFAIL): not 0, so that `Restart=on-failure`
/// starts the daemon again.
const RELOAD_EXIT: u8 = 75;

/// How long a SIGTERM waits for the running job to stop before the daemon exits anyway
/// (systemd's TimeoutStopSec must be longer).
const STOP_GRACE: Duration = Duration::from_secs(30);
/// How long in-flight hooks may still run when the daemon exits.
const HOOK_GRACE: Duration = Duration::from_secs(5);

enum Event {
    /// Something changed in `jobs/`.
    Queue,
    Signal(&'static str),
    Progress {
        run_dir: PathBuf,
        counts: gym::Counts,
    },
    /// The job's run ended: judged, or why not (a full disk: the job waits for space
    /// and resumes, it has not failed).
    Ended(Result<Judged, Failure>),
}

/// What the job's thread hands back: the judged run.
struct Judged {
    run_dir: PathBuf,
    verdict: Verdict,
    summary: String,
    figures: Headline,
}

/// Runs the daemon until a signal; the exit status to end with (0, or [`RELOAD_EXIT`]
/// after a SIGHUP).
pub(crate) async fn main(root: Root) -> anyhow::Result<std::process::ExitCode> {
    hooks::validate(&root)?;
    let queue = Queue::open(&root)?;
    let Some(lock) = queue::try_daemon_lock(&queue)? else {
        let pid = std::fs::read_to_string(queue.daemon_lock_file()).unwrap_or_default();
        anyhow::bail!("a daemon already runs for {} (pid {})", root.path.display(), pid.trim());
    };
    {
        use std::io::{Seek, Write};
        let mut file: &std::fs::File = &lock;
        let path = queue.daemon_lock_file();
        let noted = file.set_len(0).and_then(|()| file.rewind()).and_then(|_| write!(file, "{}", std::process::id()));
        noted.with_context(|| format!("writing the daemon's pid into {}", path.display()))?;
    }
    if let Some(warning) = hooks::permission_warning(&root) {
        tracing::warn!("{warning}");
    }
    let result = async {
        let mut daemon = Daemon::new(root.clone(), queue, Guarded::new(crate::guard::Guards::new(&root.config.guard)))?;
        daemon.serve().await?;
        anyhow::Ok(daemon.reload.load(std::sync::atomic::Ordering::SeqCst))
    }
    .await;
    drop(lock);
    match result? {
        true => {
            tracing::warn!("SIGHUP: exiting with status {RELOAD_EXIT} so that systemd starts the daemon again");
            Ok(std::process::ExitCode::from(RELOAD_EXIT))
        }
        false => Ok(std::process::ExitCode::SUCCESS),
    }
}

/// The daemon's inbox: every wait goes through [`Inbox::next`], which also keeps the
/// systemd watchdog fed.
struct Inbox {
    rx: mpsc::UnboundedReceiver<Event>,
    stash: std::collections::VecDeque<Event>,
    watchdog: Option<Duration>,
    next_ping: Instant,
}

impl Inbox {
    async fn next(&mut self) -> Event {
        if let Some(event) = self.stash.pop_front() {
            return event;
        }
        loop {
            let ping_at = self.next_ping;
            tokio::select! {
                event = self.rx.recv() => {
                    let event = event.expect("the daemon holds a sender");
                    self.ping_if_due();
                    if let Event::Queue = event {
                        // One rescan answers a burst of file events.
                        while let Ok(next) = self.rx.try_recv() {
                            if !matches!(next, Event::Queue) {
                                self.stash.push_back(next);
                                break;
                            }
                        }
                    }
                    return event;
                }
                _ = tokio::time::sleep_until(ping_at), if self.watchdog.is_some() => self.ping_if_due(),
            }
        }
    }

    fn ping_if_due(&mut self) {
        if let Some(interval) = self.watchdog
            && Instant::now() >= self.next_ping
        {
            let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
            self.next_ping = Instant::now() + interval / 2;
        }
    }
}

struct Daemon<G: Gate> {
    root: Root,
    queue: Queue,
    gate: G,
    inbox: Inbox,
    tx: mpsc::UnboundedSender<Event>,
    state: Publisher,
    hooks: tokio::task::JoinSet<()>,
    /// The last copy of the job being started or run, as the daemon wrote it: what a
    /// job file damaged meanwhile is written again from.
    known: Option<Job>,
    /// The notifications of those hooks, to say at exit what is still owed.
    ledgers: Vec<Arc<hooks::Ledger>>,
    /// Model containers kept warm from one job to the next (same image, model, args).
    pool: Arc<crate::container::Pool>,
    /// Set by a SIGHUP: the daemon exits with [`RELOAD_EXIT`].
    reload: Arc<std::sync::atomic::AtomicBool>,
    /// Kept alive for their inotify threads.
    _watcher: pruefstand_core::watch::Watch,
    _config_watcher: pruefstand_core::watch::Watch,
}

enum Flow {
    Continue,
    /// The daemon exits: a signal (its name, for the log line) stopped the job.
    Exit(&'static str),
}

/// How [`Daemon::start`] left a job.
enum Started {
    /// Its run is a task now, under this control.
    Running(Arc<RunControl>),
    /// It ended before its run started (failed, or cancelled meanwhile).
    Ended(Flow),
}

/// What stopped a job's run before it ended by itself.
enum Stop {
    Cancel,
    Signal(&'static str),
}

/// A training job's first half: the training (resumed from its checkpoints when the job
/// was interrupted), then the version it made, to be judged into the job's run folder
/// (under the trained version's name, fixed when the job was queued).
async fn trained(
    session: &Session,
    job_id: u64,
    order: serde_json::Value,
    base: pruefstand_core::spec::Version,
    plan: &str,
) -> anyhow::Result<pruefstand_core::spec::Version> {
    let mut order: crate::train::Order = serde_json::from_value(order).context("reading the job's training order")?;
    if let Some(job) = order.rows_of {
        let (root, kind, name) = (session.root.clone(), order.kind, order.name.clone());
        let kind = kind.context("a chained training names the kind of its rows")?;
        let name = name.context("a chained training's version is named when it is queued")?;
        let rows = crate::runtime::blocking(move || crate::train::export_rows_of(&root, job, kind, &name)).await?;
        order.exports = vec![rows];
    }
    let stop = session.control.until_stopped();
    let trained = crate::train::train_for_job(&session.root, job_id, order.ask(base, plan.to_string()), stop).await?;
    let m = &trained.manifest;
    tracing::info!(
        "trained {}: {} step(s), adapter {}; judging it now",
        trained.version,
        m.steps,
        m.adapter.path.display()
    );
    pruefstand_core::spec::Version::load(&session.root.versions(), &trained.version)
}

/// A started job's run: what its task needs.
struct JobRun {
    id: u64,
    version: pruefstand_core::spec::Version,
    plan_path: PathBuf,
    run_dir: PathBuf,
    control: Arc<RunControl>,
    /// A training job's order: train first, then judge what it made.
    training: Option<serde_json::Value>,
}

impl JobRun {
    /// The job's run, as `pruefstand run` makes one, judged. Making the venv ready (a
    /// flock, maybe the pip build) and resolving the plan against the installed
    /// AgentDojo (a Python process) block: they run on the blocking pool.
    async fn run(self, root: Root, pool: Arc<crate::container::Pool>) -> Result<Judged, Failure> {
        let JobRun { id, version, plan_path, run_dir, control, training } = self;
        let pyenv = runtime::blocking(PyEnv::ensure).await?;
        let session = Session { pyenv, root, pool, control };
        let plan = plan_path.to_string_lossy();
        let version = match training {
            Some(order) => trained(&session, id, order, version, &plan).await?,
            None => version,
        };
        let request = RunRequest::builder(&session, version, &plan).out(Some(run_dir)).resolve().await?;
        let executor = crate::cluster::executor(&session.root, id)?;
        let finished = session.run(&request, executor.as_ref()).await?;
        Ok(Judged {
            run_dir: finished.run_dir.path().to_path_buf(),
            verdict: finished.judgement.verdict,
            summary: finished.judgement.summary.clone(),
            figures: Headline::from(&finished.judgement.figures),
        })
    }
}

impl<G: Gate> Daemon<G> {
    fn new(root: Root, queue: Queue, gate: G) -> anyhow::Result<Daemon<G>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = watch_jobs(&queue, tx.clone())?;
        let config_watcher = watch_config(&root.path)?;
        let reload = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for (kind, name) in [
            (tokio::signal::unix::SignalKind::terminate(), "SIGTERM"),
            (tokio::signal::unix::SignalKind::interrupt(), "SIGINT"),
            (tokio::signal::unix::SignalKind::hangup(), "SIGHUP"),
        ] {
            let mut signal = tokio::signal::unix::signal(kind).context("installing signal handlers")?;
            let (tx, reload) = (tx.clone(), reload.clone());
            tokio::spawn(async move {
                while signal.recv().await.is_some() {
                    if name == "SIGHUP" {
                        reload.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    let _ = tx.send(Event::Signal(name));
                }
            });
        }
        let mut usec = 0;
        let watchdog = sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec));
        let state = Publisher::new(queue.daemon_state_file());
        let pool_dir = queue.daemon_state_file().with_file_name("containers");
        Ok(Daemon {
            root,
            queue,
            gate,
            inbox: Inbox { rx, stash: Default::default(), watchdog, next_ping: Instant::now() },
            tx,
            state,
            hooks: tokio::task::JoinSet::new(),
            known: None,
            ledgers: Vec::new(),
            pool: Arc::new(crate::container::Pool::new(pool_dir)),
            reload,
            _watcher: watcher,
            _config_watcher: config_watcher,
        })
    }

    async fn serve(&mut self) -> anyhow::Result<()> {
        let queue = self.queue.clone();
        runtime::blocking(move || recover(&queue)).await?;
        self.resend_owed()?;
        self.remove_orphans().await;
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
        self.inbox.ping_if_due();
        tracing::info!("daemon ready for {} (pid {})", self.root.path.display(), std::process::id());
        loop {
            while self.hooks.try_join_next().is_some() {}
            self.ledgers.retain(|ledger| !ledger.owed().is_empty());
            if self.queue.is_paused() {
                self.state.set(Activity::Paused);
                match self.inbox.next().await {
                    Event::Signal(name) => return self.exit(name).await,
                    _ => continue,
                }
            }
            self.stop_chains().await?;
            let Some(next) = self.queue.next_pending()? else {
                self.state.set(Activity::Idle);
                match self.inbox.next().await {
                    Event::Signal(name) => return self.exit(name).await,
                    _ => continue,
                }
            };
            // On a cluster the shards pass their nodes' guards; this machine's GPU is
            // not the one they use.
            let clustered = self.root.config.cluster.is_slurm();
            if !clustered {
                match self.wait_gate(next.id).await? {
                    GateEnd::Clear => {}
                    GateEnd::Recheck => continue,
                    GateEnd::Signal(name) => return self.exit(name).await,
                }
            }
            // The gate may have waited a while: take whatever is first now.
            let Some(job) = self.queue.next_pending()? else { continue };
            let _gpu = match if clustered { LockEnd::Held(None) } else { self.bench_lock(&job).await? } {
                LockEnd::Held(lock) => lock,
                LockEnd::Recheck => continue,
                LockEnd::Signal(name) => return self.exit(name).await,
            };
            let span = tracing::info_span!("job", job = job.id);
            let night = job.night.clone();
            if let Flow::Exit(signal) = self.run_job(job).instrument(span).await? {
                return self.exit(signal).await;
            }
            self.morning(night).await;
            // A warm model container is kept only for a job that is already waiting: an
            // idle daemon must not hold the shared GPU.
            if self.queue.next_pending()?.is_none()
                && let Err(err) = self.pool.shutdown().await
            {
                tracing::warn!("stopping the warm model container: {err:#}");
            }
        }
    }

    /// Fails the jobs whose chain stopped — the job they wait for failed, was cancelled
    /// or is invalid — their hooks posting why, and writes the morning report of each
    /// night that thereby ended.
    async fn stop_chains(&mut self) -> anyhow::Result<()> {
        let queue = self.queue.clone();
        for (job, why) in runtime::blocking(move || queue.stopped_chains()).await? {
            self.failed(job.id, why).await?;
            self.morning(job.night).await;
        }
        Ok(())
    }

    /// The night's morning report, once its last job has ended ([`night`]). A report
    /// that cannot be written is said, not fatal: the jobs and their runs are kept.
    async fn morning(&self, night: Option<String>) {
        let Some(night) = night else { return };
        let (root, queue) = (self.root.clone(), self.queue.clone());
        match runtime::blocking(move || night::morning_if_over(&root, &queue, &night)).await {
            Ok(Some(path)) => tracing::info!("the night's morning report: {}", path.display()),
            Ok(None) => {}
            Err(err) => tracing::warn!("writing the night's morning report: {err:#}"),
        }
    }

    /// Notifications a previous daemon still owed (it stopped mid-retry, or crashed)
    /// are sent again, with the attempts it made counted.
    fn resend_owed(&mut self) -> anyhow::Result<()> {
        for job in self.queue.list()? {
            match hooks::Ledger::read(&self.queue.job_dir(job.id)) {
                Ok(Some(ledger)) if !ledger.owed().is_empty() => {
                    let names: Vec<String> = ledger.owed().iter().map(|(name, _)| format!("{name:?}")).collect();
                    let text = format!("job {}: notifications still owed, sent again: {}", job.id, names.join(", "));
                    ledger.say(tracing::Level::INFO, &text);
                    self.send(ledger);
                }
                Ok(_) => {}
                Err(err) => tracing::warn!("job {}: {err:#}", job.id),
            }
        }
        Ok(())
    }

    async fn wait_gate(&mut self, next_job: u64) -> anyhow::Result<GateEnd> {
        let Daemon { gate, inbox, state, queue, .. } = self;
        let mut on_status = |reason: &str| state.set(Activity::Waiting { next_job, reason: reason.to_string() });
        let mut wait = pin!(gate.wait_clear(&mut on_status));
        loop {
            tokio::select! {
                result = &mut wait => { result.context("the guards")?; return Ok(GateEnd::Clear) }
                event = inbox.next() => match event {
                    Event::Signal(name) => return Ok(GateEnd::Signal(name)),
                    // Cancelled meanwhile, or another job first: start over.
                    Event::Queue if queue.is_paused() || queue.next_pending()?.map(|j| j.id) != Some(next_job) => {
                        return Ok(GateEnd::Recheck)
                    }
                    _ => {}
                },
            }
        }
    }

    /// The bench lock for a job whose version runs its model on the GPU (`None` for one
    /// that does not), waited for while a plain `run` holds it.
    async fn bench_lock(&mut self, job: &Job) -> anyhow::Result<LockEnd> {
        // A snapshot that does not load fails in `run_job`, with its reason.
        let needs_gpu = self
            .queue
            .materialise(&self.root, job)
            .and_then(|(version, _)| benchlock::needs_gpu(&version))
            .unwrap_or(false);
        if !needs_gpu {
            return Ok(LockEnd::Held(None));
        }
        let holder =
            format!("job {} ({} on {}) of the daemon, pid {}", job.id, job.version, job.plan, std::process::id());
        let (root, queue, state, inbox) = (&self.root, &self.queue, &mut self.state, &mut self.inbox);
        let waiting =
            |other: &str| state.set(Activity::Waiting { next_job: job.id, reason: benchlock::held_by(other) });
        // A signal, or a queue change that makes another job next, ends the wait.
        let stop = async {
            loop {
                match inbox.next().await {
                    Event::Signal(name) => return anyhow::Ok(LockEnd::Signal(name)),
                    Event::Queue if queue.is_paused() || queue.next_pending()?.map(|j| j.id) != Some(job.id) => {
                        return Ok(LockEnd::Recheck);
                    }
                    _ => {}
                }
            }
        };
        match lock_wait::wait(|| benchlock::try_take(root, &holder), waiting, stop).await? {
            Waited::Taken(lock) => Ok(LockEnd::Held(Some(lock))),
            Waited::Stopped(end) => end,
        }
    }

    /// One job, in three steps: [`Daemon::start`] (its log line, its state, its
    /// snapshot, its run as a task), [`Daemon::follow`] (progress, a cancel, a signal,
    /// until the run ends) and [`Daemon::settle`] (the ending's transitions and hooks).
    async fn run_job(&mut self, job: Job) -> anyhow::Result<Flow> {
        let id = job.id;
        let _log = match open_log(&self.queue.log_file(id)) {
            Ok(file) => Some(console::job_log(id, file)),
            Err(err) => {
                tracing::warn!("job {id}: no log of its own: {err:#}");
                None
            }
        };
        let control = match self.start(job).await? {
            Started::Running(control) => control,
            Started::Ended(flow) => return Ok(flow),
        };
        let (result, stop) = self.follow(id, &control).await;
        self.settle(id, result, stop).await
    }

    /// Marks the job running, loads its snapshot and starts its run as a task; the
    /// run's control, or how the job ended before it could start.
    async fn start(&mut self, job: Job) -> anyhow::Result<Started> {
        let id = job.id;
        // A training job's run is the trained version's (its name fixed when queued).
        let judged = job.training.as_ref().and_then(|o| serde_json::from_value::<crate::train::Order>(o.clone()).ok());
        let judged = judged.and_then(|o| o.name).unwrap_or_else(|| job.version.clone());
        let run_dir = job.run_dir.clone().unwrap_or_else(|| self.root.new_run_dir(&judged, &job.plan));
        let attempts = job.attempt;
        self.known = Some(job);
        if attempts >= queue::MAX_ATTEMPTS {
            let error = format!("gave up after {attempts} attempts that ended in a crash");
            return self.failed(id, error).await.map(Started::Ended);
        }
        let job = match self.transition(id, Transition::Start { run_dir: run_dir.clone() }).await {
            Ok(job) if job.state == State::Failed => {
                let error = job.error.clone().unwrap_or_default();
                self.fire_hooks(Facts::failed(&job, &error)).await;
                return Ok(Started::Ended(Flow::Continue));
            }
            Ok(job) => job,
            // Cancelled between the pick and now.
            Err(err) => {
                tracing::info!("job {id} not started: {err:#}");
                return Ok(Started::Ended(Flow::Continue));
            }
        };
        let (version, plan_path) = match self.queue.materialise(&self.root, &job) {
            Ok(loaded) => loaded,
            Err(err) => return self.failed(id, format!("{err:#}")).await.map(Started::Ended),
        };
        self.state.set(Activity::Running(JobProgress {
            job: id,
            version: job.version.clone(),
            plan: job.plan.clone(),
            run_dir: Some(run_dir.clone()),
            done: 0,
            total: 0,
            eta_s: None,
            started_at: queue::now(),
            reference: None,
        }));
        let control = self.control();
        let training = job.training.clone();
        self.spawn_run(JobRun { id, version, plan_path, run_dir, control: control.clone(), training });
        Ok(Started::Running(control))
    }

    /// A job's control: its progress reaches the inbox, and the guards' watch says
    /// whether the GPU stayed ours.
    fn control(&mut self) -> Arc<RunControl> {
        let observation = self.gate.watch();
        let progress_tx = self.tx.clone();
        Arc::new(RunControl::new(
            Arc::new(gym::Control::with_progress(move |run_dir, counts| {
                let _ = progress_tx.send(Event::Progress { run_dir: run_dir.to_path_buf(), counts });
            })),
            Some(Box::new(move || observation.exclusivity())),
        ))
    }

    /// The job runs as a task on the daemon's own runtime (its Docker client and the
    /// warm pool live there), in the job's span so its messages carry the job id; its
    /// end arrives in the inbox.
    fn spawn_run(&self, run: JobRun) {
        let (root, tx, pool) = (self.root.clone(), self.tx.clone(), self.pool.clone());
        tokio::spawn(
            async move {
                let _ = tx.send(Event::Ended(run.run(root, pool).await));
            }
            .instrument(tracing::Span::current()),
        );
    }

    /// Waits for the job's run to end, reporting its progress and stopping it on a
    /// cancel or a signal (a signal gives it [`STOP_GRACE`]); how it ended, and what
    /// stopped it.
    async fn follow(&mut self, id: u64, control: &RunControl) -> (Result<Judged, Failure>, Option<Stop>) {
        let mut stop: Option<Stop> = None;
        let mut deadline = None;
        loop {
            let event = match deadline {
                Some(at) => tokio::select! {
                    event = self.inbox.next() => event,
                    _ = tokio::time::sleep_until(at) => {
                        return (Err(Failure::Other(anyhow::anyhow!("did not stop in time"))), stop)
                    }
                },
                None => self.inbox.next().await,
            };
            match event {
                Event::Progress { run_dir, counts } => self.state.progress(&run_dir, counts),
                Event::Ended(result) => return (result, stop),
                Event::Queue if stop.is_none() && self.queue.load(id).is_ok_and(|j| j.cancel_requested) => {
                    tracing::info!("job {id}: cancel requested, stopping the run");
                    self.state.set(Activity::Stopping { reason: format!("job {id} cancelled") });
                    control.stop();
                    stop = Some(Stop::Cancel);
                }
                Event::Signal(name) if !matches!(stop, Some(Stop::Signal(_))) => {
                    tracing::info!("{name}: stopping job {id}; it resumes when a daemon starts again");
                    self.state.set(Activity::Stopping { reason: format!("{name}, job {id} goes back to the queue") });
                    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
                    control.stop();
                    stop = Some(Stop::Signal(name));
                    deadline = Some(Instant::now() + STOP_GRACE);
                }
                _ => {}
            }
        }
    }

    /// Records how the job ended. Each ending's line goes into the job's log before its
    /// state changes: `log --follow` ends once it reads a final state, and must have the
    /// line by then.
    async fn settle(&mut self, id: u64, result: Result<Judged, Failure>, stop: Option<Stop>) -> anyhow::Result<Flow> {
        match (result, stop) {
            // Judged within the grace a signal gave it: recorded, and the daemon still
            // exits as the signal asked.
            (Ok(outcome), Some(Stop::Signal(name))) => {
                self.finished(id, outcome).await?;
                Ok(Flow::Exit(name))
            }
            (Ok(outcome), _) => self.finished(id, outcome).await,
            (Err(_), Some(Stop::Signal(name))) => {
                tracing::info!("job {id}: interrupted; back in the queue at the next start");
                self.record(id, Transition::Interrupt { reason: format!("stopped by {name}"), crashed: false }).await?;
                Ok(Flow::Exit(name))
            }
            (Err(_), Some(Stop::Cancel)) => {
                tracing::info!("job {id}: cancelled");
                self.record(id, Transition::Stopped).await?;
                Ok(Flow::Continue)
            }
            // The gym's own write failing shows only as its exit: look at the disk too.
            (Err(failure), None) => {
                if !matches!(failure, Failure::DiskFull(_)) && self.full_disk().await.is_none() {
                    return self.failed(id, format!("{failure:#}")).await;
                }
                tracing::warn!("job {id}: the disk is full ({failure:#}); it resumes when there is space");
                self.wait_for_space(Some(id)).await?;
                let reason = "the disk was full".to_string();
                let job = self.record(id, Transition::Interrupt { reason, crashed: false }).await?;
                if job.state == State::Interrupted {
                    self.record(id, Transition::Requeue).await?;
                }
                Ok(Flow::Continue)
            }
        }
    }

    /// A judged job: its verdict recorded, its hooks fired.
    async fn finished(&mut self, id: u64, outcome: Judged) -> anyhow::Result<Flow> {
        tracing::info!("job {id}: done, {} ({})", outcome.verdict.as_str(), outcome.run_dir.display());
        let finish = Transition::Finish {
            verdict: outcome.verdict,
            summary: outcome.summary.clone(),
            figures: outcome.figures.clone(),
        };
        let job = self.record(id, finish).await?;
        let Headline { utility, utility_under_attack, asr, .. } = outcome.figures;
        self.fire_hooks(Facts::finished(&job, &outcome.run_dir, utility, utility_under_attack, asr)).await;
        Ok(Flow::Continue)
    }

    async fn failed(&mut self, id: u64, error: String) -> anyhow::Result<Flow> {
        tracing::warn!("job {id} failed: {error}");
        let job = self.transition(id, Transition::Fail { error: error.clone() }).await?;
        let error = job.error.clone().unwrap_or(error);
        self.fire_hooks(Facts::failed(&job, &error)).await;
        Ok(Flow::Continue)
    }

    /// Applies a transition to the job as stored ([`transition_or_repair`], on the
    /// blocking pool: a flock and fsyncs), remembering the job as it now is.
    async fn transition(&mut self, id: u64, transition: Transition) -> Result<Job, Failure> {
        let (queue, known) = (self.queue.clone(), self.known.clone().filter(|job| job.id == id));
        let job = runtime::blocking(move || transition_or_repair(&queue, known, id, transition)).await?;
        self.known = Some(job.clone());
        Ok(job)
    }

    /// Records a job's transition; on a full disk it waits for space first instead of
    /// exiting — systemd would restart the daemon and count a crash against the job.
    async fn record(&mut self, id: u64, transition: Transition) -> anyhow::Result<Job> {
        loop {
            match self.transition(id, transition.clone()).await {
                Ok(job) => return Ok(job),
                Err(Failure::DiskFull(err)) => {
                    tracing::warn!("job {id}: cannot record its state, the disk is full: {err:#}");
                    self.wait_for_space(Some(id)).await?;
                }
                Err(failure) => return Err(failure.into()),
            }
        }
    }

    /// The folder without room for a small file: the queue's, or the running job's run
    /// directory (it may lie on another disk); None when both have room. Probed on the
    /// blocking pool ([`has_space`] writes and fsyncs).
    async fn full_disk(&self) -> Option<PathBuf> {
        let run_dir = self.known.as_ref().and_then(|job| job.run_dir.clone());
        let dirs: Vec<PathBuf> = [Some(self.queue.dir.clone()), run_dir].into_iter().flatten().collect();
        runtime::blocking(move || dirs.into_iter().find(|dir| dir.is_dir() && !has_space(dir))).await
    }

    /// Returns once there is space again, checking with a back-off up to a minute; a
    /// signal ends the wait (and the daemon). Meanwhile the state says where the disk
    /// is full and how much is free there.
    async fn wait_for_space(&mut self, job: Option<u64>) -> anyhow::Result<()> {
        let mut wait = Duration::from_secs(1);
        loop {
            let Some(path) = self.full_disk().await else {
                tracing::info!("there is disk space again");
                return Ok(());
            };
            let free_bytes = free_bytes(&path);
            self.state.set(Activity::WaitingForSpace { job, path, free_bytes });
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                event = self.inbox.next() => if let Event::Signal(name) = event {
                    anyhow::bail!("{name} while waiting for disk space");
                },
            }
            wait = (wait * 2).min(Duration::from_secs(60));
        }
    }

    /// The job's notifications, written down in its folder before the first attempt (a
    /// stop or a crash from here on cannot lose them), then sent in the background.
    async fn fire_hooks(&mut self, facts: Facts) {
        let dir = self.queue.job_dir(facts.job);
        let Some(ledger) = hooks::Ledger::new(Some(dir), &self.root.config.hooks, facts) else { return };
        let saving = ledger.clone();
        if let Err(err) = runtime::blocking(move || saving.save()).await {
            tracing::warn!("job {}: cannot write down its notifications (sent all the same): {err:#}", ledger.job());
        }
        self.send(ledger);
    }

    fn send(&mut self, ledger: Arc<hooks::Ledger>) {
        self.ledgers.push(ledger.clone());
        self.hooks.spawn(hooks::fire_all(self.root.config.hooks.clone(), ledger));
    }

    /// Model containers left by a daemon or run that died (`kill -9`, a reboot) are
    /// removed at start-up. No Docker on this machine is fine: then there are none.
    async fn remove_orphans(&self) {
        let docker = match self.pool.docker().await {
            Ok(docker) => docker,
            Err(err) => return tracing::info!("no orphan check: {err:#}"),
        };
        match crate::container::remove_orphans(docker).await {
            Ok(orphans) => orphans.iter().for_each(|orphan| tracing::warn!("{orphan}")),
            Err(err) => tracing::warn!("checking for orphaned containers: {err:#}"),
        }
    }

    async fn exit(&mut self, why: &str) -> anyhow::Result<()> {
        tracing::info!("{why}: daemon exits");
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
        if !self.hooks.is_empty() {
            let hooks = &mut self.hooks;
            let _ = tokio::time::timeout(HOOK_GRACE, async { while hooks.join_next().await.is_some() {} }).await;
            hooks.abort_all();
            while hooks.join_next().await.is_some() {}
        }
        for ledger in &self.ledgers {
            for (hook, made) in ledger.owed() {
                let text = format!(
                    "job {}: the notification to hook {hook:?} is still owed ({made} attempts made); it is sent when the daemon starts again",
                    ledger.job()
                );
                ledger.say(tracing::Level::WARN, &text);
            }
        }
        if let Err(err) = self.pool.shutdown().await {
            tracing::warn!("stopping the warm model container: {err:#}");
        }
        self.state.set(Activity::Stopped);
        Ok(())
    }
}

/// Jobs a previous daemon left running crashed with it; interrupted ones go back into
/// the queue. Both resume into their run directory. Blocking: flocks and fsyncs.
fn recover(queue: &Queue) -> anyhow::Result<()> {
    for job in queue.list()? {
        let id = job.id;
        if job.state == State::Running {
            let transition = if job.cancel_requested {
                Transition::Stopped
            } else {
                Transition::Interrupt {
                    reason: "the daemon ended without finishing it (crash or kill)".into(),
                    crashed: true,
                }
            };
            let job = queue.transition(id, transition)?;
            tracing::warn!("job {id} was running when the daemon ended: now {}", job.state.as_str());
        }
        if queue.load(id)?.state == State::Interrupted {
            queue.transition(id, Transition::Requeue)?;
            tracing::info!("job {id} back in the queue; it resumes into its run directory");
        }
    }
    Ok(())
}

/// Applies a transition to job `id` as stored. When its file no longer loads (it was
/// damaged while the job ran), the job is failed instead, from the daemon's last copy
/// (`known`), naming the file and why, with the verdict it reached: one bad file must
/// not stop the queue. Blocking: a flock and fsyncs.
fn transition_or_repair(queue: &Queue, known: Option<Job>, id: u64, transition: Transition) -> Result<Job, Failure> {
    let failure = match queue.transition(id, transition.clone()) {
        Ok(job) => return Ok(job),
        Err(err) => Failure::of(err),
    };
    let damaged = || queue.job_dir(id).join("job.json").exists() && queue.load(id).is_err();
    let Some(mut job) = known.filter(|_| !matches!(failure, Failure::DiskFull(_)) && damaged()) else {
        return Err(failure);
    };
    let _ = job.apply(transition);
    let error =
        format!("{failure:#} (the daemon wrote it again from its own copy, the damaged file is job.json.damaged)");
    job.apply(Transition::Damaged { error })?;
    queue.replace_damaged(&job)?;
    tracing::warn!("job {id} failed: {}", job.error.as_deref().unwrap_or_default());
    Ok(job)
}

/// Whether `dir` has room for a small file: 64 KiB written (and fsynced) and removed.
fn has_space(dir: &std::path::Path) -> bool {
    let probe = dir.join(".space-probe");
    let written = pruefstand_core::util::write_atomic(&probe, &[0u8; 64 * 1024]);
    let _ = std::fs::remove_file(&probe);
    written.is_ok()
}

/// The bytes an unprivileged writer may still use on `path`'s file system.
fn free_bytes(path: &std::path::Path) -> u64 {
    nix::sys::statvfs::statvfs(path).map_or(0, |s| s.blocks_available() * s.fragment_size())
}

enum GateEnd {
    Clear,
    Recheck,
    Signal(&'static str),
}

enum LockEnd {
    Held(Option<RunLock>),
    Recheck,
    Signal(&'static str),
}

/// A job's log, appended to across attempts (user-only, like the rest of the queue).
fn open_log(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

/// inotify on the root's folder for `pruefstand.toml`: the daemon keeps the config it
/// started with, so an edit gets a log line saying a restart applies it — once per new
/// content (an editor's save is several events; a save that changes nothing is none).
///
/// The file is read only once its events have been quiet for [`CONFIG_SETTLE`]: an
/// event's handler that reads at once can find the file truncated by the next writer
/// (a close of one write arriving after the next `open(O_TRUNC)`), and would log an
/// empty or half-written file as one more change.
fn watch_config(root: &std::path::Path) -> anyhow::Result<pruefstand_core::watch::Watch> {
    use std::sync::mpsc::RecvTimeoutError;
    let file = root.join(CONFIG_FILE);
    let read = |file: &std::path::Path| std::fs::read(file).ok().map(|bytes| pruefstand_core::util::sha256_hex(&bytes));
    let mut last = read(&file);
    let (touched, events) = std::sync::mpsc::channel::<()>();
    // Reads (ours among them) are no edit, and `watch` does not report them; every other
    // event on the file is.
    let watcher = pruefstand_core::watch::folders(&[root.to_path_buf()], move |path| {
        if path.is_some_and(|p| p.ends_with(CONFIG_FILE)) {
            let _ = touched.send(());
        }
    })?;
    let root = root.to_path_buf();
    // The thread ends when the watcher, and with it the sender, is dropped.
    std::thread::Builder::new()
        .name("config-watch".into())
        .spawn(move || {
            while events.recv().is_ok() {
                loop {
                    match events.recv_timeout(CONFIG_SETTLE) {
                        Ok(()) => continue,
                        Err(RecvTimeoutError::Timeout) => break,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
                let now = read(&file);
                if now.is_some() && now != last {
                    config_changed(&root, &file);
                    last = now;
                }
            }
        })
        .context("starting the config watch thread")?;
    Ok(watcher)
}

/// The log line for an edited `pruefstand.toml`: a restart applies it — unless it does
/// not load as a daemon start would load it, when a restart would fail.
fn config_changed(root: &std::path::Path, file: &std::path::Path) {
    match Root::find(Some(root.to_path_buf())).and_then(|root| hooks::validate(&root)) {
        Ok(()) => tracing::warn!(
            "{} changed: restart the daemon to apply it (`systemctl --user restart pruefstand`); until then it runs with the config it started with",
            file.display()
        ),
        Err(err) => tracing::error!(
            "{} changed and does not load: {err:#} — a restart would fail; fix it first (`pruefstand check`). The daemon runs on with the config it started with",
            file.display()
        ),
    }
}

/// How long `pruefstand.toml`'s events must be quiet before it is read (see [`watch_config`]).
const CONFIG_SETTLE: Duration = Duration::from_millis(300);

/// The queue's watch on `jobs/` alone (a new job is renamed into it; every transition
/// and pause bumps `jobs/.changed`). Reads are no change to it, so the daemon's own
/// rescans do not wake it again.
fn watch_jobs(queue: &Queue, tx: mpsc::UnboundedSender<Event>) -> anyhow::Result<pruefstand_core::watch::Watch> {
    queue.watch(&[pruefstand_core::watch::Folder::Jobs], move |_| {
        let _ = tx.send(Event::Queue);
    })
}
