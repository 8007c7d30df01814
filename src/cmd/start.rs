//! `pruefstand start <version>`: validate the spec and the plan, snapshot both into a
//! queued job and print its id. With `--wait`, follow the job (inotify, no polling),
//! print what `run` prints at its end (summary, rules, report, verdict) and exit with
//! `run`'s verdict codes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc;

use anyhow::Context;

use crate::cmd::run::print_judgement;
use crate::hooks;
use pruefstand_core::queue::{Job, Prepared, Queue, State};
use pruefstand_core::root::Root;
use pruefstand_judge::Judgement;
use pruefstand_judge::contamination;
use pruefstand_store::RunDir;

#[derive(clap::Args)]
pub struct Args {
    /// A version name from the root's versions/ or a spec file.
    pub version: String,
    /// `schnell`, `voll` or a plan file.
    #[arg(long, default_value = "schnell")]
    pub plan: String,
    /// Higher runs first; equal priorities run in the order queued.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Wait for the verdict and exit with its code (0 approved, 10 rejected, 11
    /// inconclusive, 12 invalid, 2 failed or cancelled).
    #[arg(long)]
    pub wait: bool,
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    hooks::validate(&root)?;
    let queue = Queue::open(&root)?;
    let prepared = queue.prepare(&root, &args.version, &args.plan)?;
    refuse_held_out_clash(&prepared)?;
    let job = queue.enqueue(prepared, args.priority)?;
    outln!("{}", job.id);
    tracing::info!("queued job {}: {} on {} (priority {})", job.id, job.version, job.plan, job.priority);
    note_without_daemon(&root, &queue)?;
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let job = wait_final(&queue, job.id, say_progress)?;
    Ok(print_end(&job))
}

/// A state a waited-for job passes through, on stderr; its end is [`print_end`]'s to
/// say, once (a failed job's error said here too would be said twice).
pub fn say_progress(job: &Job) {
    if !job.state.is_final() {
        tracing::info!("job {}: {}", job.id, describe(job));
    }
}

/// The held-out guard `run` applies before its first case, at `start` already: a plan
/// holding out a family the adapter's exports hold is refused in `check --plan`'s words,
/// and nothing is queued (a nightly job would otherwise run the whole plan to an
/// invalid verdict).
fn refuse_held_out_clash(prepared: &Prepared) -> anyhow::Result<()> {
    let version = &prepared.version;
    let paths = version.trained_on_exports();
    if paths.is_empty() {
        return Ok(());
    }
    let exports = pruefstand_report::export::trained_exports(&paths)?;
    let trained_on: Vec<String> = version.spec.trained_on.iter().map(|f| f.get_ref().clone()).collect();
    let plan = &prepared.profile.name;
    match contamination::refusal(plan, &version.name, &prepared.held_out(), &trained_on, &exports) {
        Some(refusal) => anyhow::bail!("refused, nothing queued: {refusal}"),
        None => Ok(()),
    }
}

/// What `run` prints at its end (run folder, summary, rules, report, verdict), from
/// the run's judgement.json, for an ended job; its exit code is `run`'s.
pub fn print_end(job: &Job) -> ExitCode {
    if let Some(run_dir) = &job.run_dir {
        outln!("{}", run_dir.display());
    }
    let judgement = job.run_dir.as_ref().filter(|_| job.verdict.is_some()).and_then(|dir| {
        let run = RunDir::open(dir).ok()?;
        Some((run.read::<Judgement>().ok()??, run.report_path()))
    });
    match (&judgement, &job.verdict) {
        (Some((judgement, report)), _) => {
            outln!("{}", judgement.summary);
            print_judgement(judgement, report);
        }
        (None, Some(verdict)) => outln!("verdict: {}", verdict.as_str()),
        (None, None) => outln!("{}: {}", job.state.as_str(), job.error.as_deref().unwrap_or("")),
    }
    ExitCode::from(job.exit_code())
}

/// Whether an inotify event tells of a change: a file's opening, or its closing after
/// a read, does not (a watcher's own reads of the folder would wake it again and again).
pub fn is_change(event: &notify::Result<notify::Event>) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    event.as_ref().map_or(
        true,
        |event| !matches!(event.kind, EventKind::Access(kind) if kind != AccessKind::Close(AccessMode::Write)),
    )
}

/// Says so when no daemon will pick the queue up, or when the queue is paused.
pub fn note_without_daemon(root: &Root, queue: &Queue) -> anyhow::Result<()> {
    if !daemon_running(queue)? {
        let how = how_to_start(root);
        tracing::info!("note: no daemon runs for {}; start one: {how}", root.path.display());
    }
    if queue.is_paused() {
        tracing::info!("note: the queue is paused; `pruefstand resume` lets the daemon start jobs again");
    }
    Ok(())
}

pub fn daemon_running(queue: &Queue) -> anyhow::Result<bool> {
    crate::daemon::state::lock_held(queue)
}

/// A job's state in a few words.
pub fn describe(job: &Job) -> String {
    match job.state {
        State::Running => format!(
            "running (try {}) into {}",
            job.starts.max(job.attempt),
            job.run_dir.as_deref().map(|p| p.display().to_string()).unwrap_or_default()
        ),
        State::Done => format!("done, {}", job.verdict.map_or("?", |v| v.as_str())),
        State::Failed => format!("failed: {}", job.error.as_deref().unwrap_or("")),
        state => state.as_str().to_string(),
    }
}

/// Blocks until the job is done, failed or cancelled, calling `on_change` on every
/// state it passes through. Wakes on inotify events of `jobs/` (the queue's own writes
/// bump `jobs/.changed`) and of the job's `job.json` in its folder: a file changed in
/// place, by anything but the queue, bumps nothing else. The job's other files (its
/// log grows with every line) do not wake it.
pub fn wait_final(queue: &Queue, id: u64, mut on_change: impl FnMut(&Job)) -> anyhow::Result<Job> {
    use notify::Watcher;
    let (tx, rx) = mpsc::channel();
    let jobs_dir = queue.jobs_dir();
    let job_dir = queue.job_dir(id);
    let watched_jobs = jobs_dir.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = event.as_ref().map_or(true, |event| {
            event.paths.iter().any(|path| {
                path.parent() == Some(watched_jobs.as_path()) || path.file_name().is_some_and(|n| n == "job.json")
            })
        });
        if relevant && is_change(&event) {
            let _ = tx.send(());
        }
    })
    .context("starting inotify")?;
    watcher.watch(&jobs_dir, notify::RecursiveMode::NonRecursive)?;
    // The folder, not the file: an atomic replace puts a new file in its place, and a
    // watch on the old one would see no more.
    watcher
        .watch(&job_dir, notify::RecursiveMode::NonRecursive)
        .with_context(|| format!("watching {}", job_dir.display()))?;
    let mut last = None;
    let mut unreadable = None;
    loop {
        let job = match queue.load(id) {
            Ok(job) => job,
            // A file changed in place is seen half-written at times, and a damaged one
            // the daemon replaces: wait for its next change. One that is gone ends it.
            Err(err) if job_dir.join("job.json").exists() => {
                let said = format!("{err:#}");
                if unreadable.as_ref() != Some(&said) {
                    tracing::warn!("job {id}: its file does not load now ({said}); waiting for it to change");
                    unreadable = Some(said);
                }
                rx.recv().context("inotify ended")?;
                while rx.try_recv().is_ok() {}
                continue;
            }
            Err(err) => return Err(err),
        };
        unreadable = None;
        if last != Some((job.state, job.starts)) {
            last = Some((job.state, job.starts));
            on_change(&job);
        }
        if job.state.is_final() {
            return Ok(job);
        }
        rx.recv().context("inotify ended")?;
        while rx.try_recv().is_ok() {}
    }
}

/// How to start a daemon here, as `status` and `start` say it: the user unit where a
/// systemd user manager runs, else the command to run it by hand and where it logs.
pub fn how_to_start(root: &Root) -> String {
    if user_systemd() {
        "`systemctl --user start pruefstand` (or `pruefstand daemon` in a terminal)".to_string()
    } else {
        // Without a user manager `systemctl --user` only fails: say what works.
        format!(
            "there is no systemd user session here, so run it yourself: `nohup pruefstand --root {} daemon >> \
             daemon.log 2>&1 &` (its lines go to daemon.log, each job's also to `pruefstand log <id>`)",
            root.path.display()
        )
    }
}

/// Whether this login has a systemd user manager to run the unit (its private socket
/// under `$XDG_RUNTIME_DIR`): not in a container, nor after `su` or `sudo -u`.
fn user_systemd() -> bool {
    std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|dir| std::path::Path::new(&dir).join("systemd/private").exists())
}
