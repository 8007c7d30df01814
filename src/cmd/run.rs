//! `pruefstand run <version>`: benchmark a version on a plan and judge it — the main
//! job. Prints the run directory, the headline figures, the rules, the report's path
//! and the verdict (or all of it as JSON); the exit status is the verdict's (README:
//! exit codes). A version whose model runs on the GPU first takes the bench lock
//! (`benchlock`), waiting for a daemon job or another run that holds it.
//! It acts, then shows: `act` runs and returns what happened, `show` says it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use crate::lock_wait;
use crate::run::{Extent, LocalGym, RunControl, RunRequest, Session};
use pruefstand_core::record::PrefixCache;
use pruefstand_core::root::Root;
use pruefstand_core::spec::Version;
use pruefstand_core::util::Failure;
use pruefstand_judge::Judgement;
use pruefstand_store::benchlock;
use pruefstand_store::{LockError, RunLock};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A version name from the root's versions/ (e.g. demo-kandidat) or a spec file.
    pub(crate) version: String,
    /// `schnell`, `voll` or a plan file.
    #[arg(long, default_value = "schnell")]
    pub(crate) plan: String,
    /// Hold this many cases in flight (default: as many as the model server has room
    /// for, up to `[run] max_in_flight`).
    #[arg(long, value_parser = crate::cmd::jobs_parser)]
    pub(crate) jobs: Option<usize>,
    /// The run directory itself; an existing one of the same plan is resumed.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Run every case of the plan even when it stops early once decided (`voll`); with
    /// --out, continues a run that stopped early to the whole plan.
    #[arg(long)]
    pub(crate) full: bool,
    /// When a GPU-backed version finds the GPU taken by another run or a daemon job,
    /// exit 2 naming it instead of waiting.
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// The result as JSON on stdout: run directory, report, reference and the judgement.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) async fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let json = args.json;
    let outcome = act(root, args).await?;
    show(outcome, json)
}

/// What `run` did, for [`show`] to say.
enum Outcome {
    /// `--no-wait` found the GPU taken (by `holder`).
    GpuTaken {
        holder: String,
    },
    /// Stopped after its run directory was claimed: resumable with `--out`. `shutdown`:
    /// how stopping the pool went.
    Interrupted {
        run_dir: PathBuf,
        cause: anyhow::Error,
        shutdown: anyhow::Result<()>,
    },
    Judged(Box<Judged>),
}

/// A run carried out and judged: one block per version, the reference first.
struct Judged {
    reference: Option<VersionBlock>,
    candidate: VersionBlock,
    report: PathBuf,
    judgement: Judgement,
    prefix_cache: Option<PrefixCache>,
}

/// Runs the version: the bench lock when its model needs the GPU, the run under a
/// signal handler, the pool shut down whatever happened; the result read for [`show`].
async fn act(root: Option<PathBuf>, args: Args) -> anyhow::Result<Outcome> {
    let root = Root::find(root)?;
    let version = Version::load(&root.versions(), &args.version)?;
    // One model server on the GPU at a time: the daemon's job, or this run.
    let _gpu = if benchlock::needs_gpu(&version)? {
        match bench_lock(&root, &version, args.no_wait).await {
            Ok(lock) => Some(lock),
            Err(LockError::Busy { holder }) => return Ok(Outcome::GpuTaken { holder }),
            Err(LockError::Failed(err)) => return Err(err),
        }
    } else {
        None
    };
    let (control, signals) = stop_on_signals();
    let session = Session::open(root, control).await?;
    let finished = async {
        let request = RunRequest::builder(&session, version, &args.plan)
            .jobs(args.jobs)
            .out(args.out)
            .extent(if args.full { Extent::Full } else { Extent::Plan })
            .resolve()
            .await?;
        session.run(&request, &LocalGym).await
    }
    .await;
    signals.abort();
    // A fresh pool, shut down at the end whatever happened.
    let shutdown = session.shutdown().await;
    let finished = match finished {
        Ok(finished) => finished,
        Err(Failure::Interrupted { run_dir, cause }) => return Ok(Outcome::Interrupted { run_dir, cause, shutdown }),
        Err(failure) => return Err(failure.into()),
    };
    shutdown?;
    let reference = match &finished.reference {
        Some((dir, made_now)) => Some(VersionBlock::reference(dir, *made_now)?),
        None => None,
    };
    let candidate = VersionBlock {
        version: finished.run_dir.read_run_meta().map(|m| m.version).unwrap_or_default(),
        made_now: None,
        run_dir: finished.run_dir.path().to_path_buf(),
        telemetry: finished.executed.telemetry,
    };
    Ok(Outcome::Judged(Box::new(Judged {
        reference,
        candidate,
        report: finished.run_dir.report_path(),
        judgement: finished.judgement,
        prefix_cache: finished.executed.gym.concurrency.as_ref().and_then(|c| c.prefix_cache),
    })))
}

/// The run's control, stopped by Ctrl-C or SIGTERM: the gym is killed, the model server
/// stopped and removed, every finished case kept for `--out` to resume. The task that
/// listens is aborted when the run is over.
fn stop_on_signals() -> (Arc<RunControl>, tokio::task::JoinHandle<()>) {
    let mut control = RunControl::default();
    control.stop_abandons_start = true;
    let control = Arc::new(control);
    let signals = tokio::spawn({
        let control = control.clone();
        async move {
            let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            control.stop();
        }
    });
    (control, signals)
}

/// Says what [`act`] did — the blocks, the prefix cache, the judgement, or all of it as
/// JSON — and gives the exit status.
fn show(outcome: Outcome, json: bool) -> anyhow::Result<ExitCode> {
    let ran = match outcome {
        Outcome::GpuTaken { holder } => {
            tracing::error!(
                "the GPU is taken: {}; without --no-wait this run waits for it",
                benchlock::held_by(&holder)
            );
            return Ok(ExitCode::from(pruefstand_core::util::EXIT_COULD_NOT_RUN));
        }
        Outcome::Interrupted { run_dir, cause, shutdown } => {
            tracing::error!("{cause:#}");
            tracing::info!("resume with: {}", resume_command(std::env::args_os(), &run_dir));
            shutdown?;
            return Ok(ExitCode::from(pruefstand_core::util::EXIT_COULD_NOT_RUN));
        }
        Outcome::Judged(ran) => ran,
    };
    let exit = ExitCode::from(ran.judgement.verdict.exit_code());
    if json {
        let value = serde_json::json!({
            "reference": ran.reference.as_ref().map(VersionBlock::json),
            "candidate": ran.candidate.json(),
            "report": ran.report,
            "judgement": ran.judgement,
        });
        outln!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(exit);
    }
    for block in ran.reference.iter().chain([&ran.candidate]) {
        block.print();
    }
    if let Some((cache, rate)) = ran.prefix_cache.and_then(|c| Some((c, c.hit_rate()?))) {
        outln!("prefix cache: {:.1} % of {} prompt tokens were cached", rate * 100.0, cache.queries);
    }
    crate::client::print_judgement(&ran.judgement, &ran.report);
    Ok(exit)
}

/// What `run` says of one version it ran or compared with: its name, for the reference
/// whether it was run now or reused (none for the candidate), its run directory and
/// its headline figures.
struct VersionBlock {
    version: String,
    made_now: Option<bool>,
    run_dir: PathBuf,
    telemetry: pruefstand_core::telemetry::Telemetry,
}

impl VersionBlock {
    /// The reference's block, its figures from its stored records.
    fn reference(dir: &Path, made_now: bool) -> anyhow::Result<VersionBlock> {
        let run_dir = pruefstand_store::RunDir::open(dir)?;
        let meta = run_dir.read_run_meta()?;
        let records: Vec<_> = run_dir.read_cases_lenient()?.records.into_values().collect();
        let telemetry =
            pruefstand_core::telemetry::compute(&meta.benchmark_version, meta.planned_case_ids.len(), &records);
        Ok(VersionBlock { version: meta.version, made_now: Some(made_now), run_dir: dir.to_path_buf(), telemetry })
    }

    fn print(&self) {
        match self.made_now {
            Some(made_now) => {
                outln!("reference: {} ({})", self.version, if made_now { "run now" } else { "reused" })
            }
            None => outln!("candidate: {}", self.version),
        }
        outln!("  run directory: {}", self.run_dir.display());
        outln!("  {}: {}", self.version, crate::client::headline(&self.telemetry));
        outln!("  model format health: {}", self.telemetry.format_health.line(self.telemetry.counts.recorded));
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "version": self.version,
            "made_now": self.made_now,
            "run_dir": self.run_dir,
            "telemetry": self.telemetry,
        })
    }
}

/// `run --help`'s last words: the exit codes, one per verdict and one for a run that
/// could not be carried out.
pub(crate) fn exit_codes() -> String {
    use pruefstand_core::util::*;
    format!(
        "Exit codes:\n  {EXIT_APPROVED:<3} approved\n  {EXIT_REJECTED:<3} rejected (a rule failed)\n  \
         {EXIT_INCONCLUSIVE:<3} inconclusive (no rule failed, one could not decide)\n  \
         {EXIT_INVALID:<3} invalid (R1 failed: the run cannot be trusted)\n  \
         {EXIT_COULD_NOT_RUN:<3} could not run (bad input, missing tools, interrupted: the message says how to resume)"
    )
}

/// The command line that resumes an interrupted run: this one's arguments as given,
/// with `--out` the run directory (replacing one given), shell-quoted.
fn resume_command(argv: impl IntoIterator<Item = std::ffi::OsString>, run_dir: &Path) -> String {
    let mut words = Vec::new();
    let mut argv = argv.into_iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(arg) = argv.next() {
        match arg.as_str() {
            "--out" => {
                argv.next();
            }
            _ if arg.starts_with("--out=") => {}
            _ => words.push(arg),
        }
    }
    words.extend(["--out".to_string(), run_dir.to_string_lossy().into_owned()]);
    // Arguments from the OS hold no NUL, the one thing that cannot be quoted.
    shlex::try_join(words.iter().map(String::as_str)).unwrap_or_else(|_| words.join(" "))
}

/// The bench lock, waited for (saying for whom) unless `no_wait`; busy when `no_wait`
/// finds it taken. Ctrl-C ends the wait.
async fn bench_lock(root: &Root, version: &Version, no_wait: bool) -> Result<RunLock, LockError> {
    let holder = format!("`pruefstand run {}`, pid {}", version.name, std::process::id());
    if no_wait {
        return benchlock::try_take(root, &holder);
    }
    Ok(lock_wait::bench_lock(root, &holder).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<std::ffi::OsString> {
        words.iter().map(Into::into).collect()
    }

    #[test]
    fn the_resume_command_is_the_one_given_with_its_run_directory() {
        let dir = Path::new("/tmp/reports/demo kandidat/schnell/20260102T030405Z-abc");
        assert_eq!(
            resume_command(argv(&["pruefstand", "run", "demo-kandidat", "--plan", "schnell"]), dir),
            "pruefstand run demo-kandidat --plan schnell --out '/tmp/reports/demo kandidat/schnell/20260102T030405Z-abc'"
        );
        assert_eq!(
            resume_command(argv(&["./pf", "--root", "/b", "run", "v", "--out", "old", "--jobs", "2"]), Path::new("d")),
            "./pf --root /b run v --jobs 2 --out d"
        );
        assert_eq!(resume_command(argv(&["pf", "run", "--out=old", "v"]), Path::new("d")), "pf run v --out d");
    }
}
