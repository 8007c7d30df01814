//! `pruefstand show RUN [--cases | --traces] [--adaptive]`: a run as JSON on stdout,
//! for scripts — the bench's Python reads runs through it rather than opening a run
//! directory's files (docs/reports.md, "A run as JSON"). It reads through the store's
//! doors only and writes nothing: no lock is taken (a run still being written is shown
//! as far as it has got), no folder made, no file touched.
//!
//! Three shapes, each stable and documented there: the run (one object: its facts, its
//! cases counted, its judgement's verdict, the adaptive attacker's search in short),
//! its case records (`--cases`: JSON lines, the case record's own schema), and its
//! conversations (`--traces`: JSON lines, one per record). `--adaptive` shows the
//! adaptive attacker's run of attempts instead of the run.
//!
//! Not here: judging or summarising what the records say (the judge's, the report's,
//! the bench's), naming which run a word means (`cmd::runs`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;

use pruefstand_core::case::CaseRecord;
use pruefstand_core::record::{AttackerCost, Busy, ConcurrencyFacts, PairLog, Proposer, SearchLog, Verdict};
use pruefstand_judge::{EarlyStopSummary, StoredJudgement};
use pruefstand_store::{RunDir, RunFile};

/// The shape of the run's object: raised when a field changes meaning or goes away (a
/// new field does not raise it).
const VIEW_FORMAT: u32 = 1;

/// The exit status when RUN is not a run directory (or, with `--adaptive`, has no
/// attacker's run): nothing to show, as distinct from a run that could not be read (2).
const EXIT_NOT_A_RUN: u8 = 3;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The run: a run directory, a version name (its newest finished run under
    /// reports/), job:N (job N's run) or latest.
    #[arg(value_name = "RUN")]
    pub(crate) run: PathBuf,
    /// Its case records instead, one JSON line per case recorded, by case id
    /// (scripts/pruefstand_gym/schemas/case-record.schema.json).
    #[arg(long, conflicts_with = "traces")]
    pub(crate) cases: bool,
    /// Its conversations instead: one JSON line per case record, `{"case_id", "trace"}`
    /// (AgentDojo's trace as it was written; null with `trace_error` saying why when it
    /// could not be read).
    #[arg(long)]
    pub(crate) traces: bool,
    /// The adaptive attacker's own run of attempts instead of the run (exit 3 when the
    /// run has none).
    #[arg(long)]
    pub(crate) adaptive: bool,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let dir = crate::cmd::runs::resolve(root.as_deref(), std::slice::from_ref(&args.run))?.remove(0);
    if let Err(why) = is_a_run(&dir) {
        tracing::error!("{why}");
        return Ok(ExitCode::from(EXIT_NOT_A_RUN));
    }
    let mut run = RunDir::open(&dir)?;
    if args.adaptive {
        match run.adaptive_run() {
            Some(attempts) => run = attempts,
            None => {
                tracing::error!(
                    "{}: the run has no adaptive attacker's run of attempts (its plan has no [adaptive])",
                    dir.display()
                );
                return Ok(ExitCode::from(EXIT_NOT_A_RUN));
            }
        }
    }
    if args.cases {
        let records = records(&run)?;
        write_out(|out| records.iter().try_for_each(|record| line(out, record)))?;
    } else if args.traces {
        let records = records(&run)?;
        write_out(|out| records.iter().try_for_each(|record| line(out, &Conversation::of(&run, record))))?;
    } else {
        let view = View::of(&run)?;
        write_out(|out| line(out, &view))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `dir` is a run directory; why not, naming it, when it is not.
fn is_a_run(dir: &Path) -> Result<(), String> {
    if !dir.is_dir() {
        return Err(format!("{}: no such folder, so no run to show", dir.display()));
    }
    if !RunDir::is_run(dir) {
        let run = RunDir::new(dir);
        return Err(format!(
            "{} is not a run directory: neither {} nor {} is in it",
            dir.display(),
            run.shown(RunFile::RunMeta),
            run.shown(RunFile::Cases)
        ));
    }
    Ok(())
}

/// The run's case records, one per case (a case run again: its last record), by case
/// id; read leniently, so a run cut short or still going is shown as far as it got.
/// Each line that could not be read is said on stderr and left out.
fn records(run: &RunDir) -> anyhow::Result<Vec<CaseRecord>> {
    let stored = run.read_cases_lenient()?;
    for damaged in &stored.damaged {
        tracing::warn!("left out: {damaged}");
    }
    Ok(stored.records.into_values().collect())
}

/// Writes to stdout through a buffer; a reader that went away ends the process quietly
/// with status 0, as `console::out` does.
fn write_out(write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    match write(&mut out).and_then(|()| out.flush()) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => Ok(other.map_err(|err| anyhow::anyhow!("writing to stdout: {err}"))?),
    }
}

/// One value as one line of JSON.
fn line(out: &mut dyn Write, value: &impl Serialize) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")
}

/// The run as one object (`pruefstand show RUN`).
#[derive(Serialize)]
struct View {
    /// [`VIEW_FORMAT`].
    view: u32,
    /// The run directory, as the command line named it (a name resolved to its folder).
    run_dir: PathBuf,
    /// The run's facts; null until the run has written them (at its end).
    run: Option<Facts>,
    /// The plan it ran; null when it has none (a hand-made run directory).
    plan: Option<PlanFacts>,
    cases: Counts,
    /// null: not judged (yet).
    judgement: Option<JudgementFacts>,
    /// null: the plan ran no adaptive attacker.
    adaptive: Option<Adaptive>,
}

impl View {
    fn of(run: &RunDir) -> anyhow::Result<View> {
        let plan = run.read_plan()?;
        let cases = run.read_cases_lenient()?;
        Ok(View {
            view: VIEW_FORMAT,
            run_dir: run.path().to_path_buf(),
            run: run.read_run_meta_if_written()?.map(|meta| Facts {
                run_id: meta.run_id,
                version: meta.version,
                plan: meta.plan,
                plan_hash: meta.plan_hash,
                benchmark_version: meta.benchmark_version,
                started_at: meta.started_at,
                reference_for: meta.reference_for,
                concurrency: meta.concurrency,
            }),
            cases: Counts {
                planned: plan.as_ref().map(|plan| plan.cases.len()),
                recorded: cases.records.len(),
                errors: cases.records.values().filter(|record| record.is_error()).count(),
                damaged: cases.damaged.len(),
            },
            plan: plan.map(|plan| PlanFacts { name: plan.name, hash: plan.hash }),
            judgement: StoredJudgement::read(run)?.map(|judgement| JudgementFacts {
                verdict: judgement.verdict,
                summary: judgement.current.as_ref().map(|current| current.summary.clone()),
                judged_at: judgement.judged_at.clone(),
                early_stop: judgement.current.and_then(|current| current.early_stop),
            }),
            adaptive: run.read_search_log()?.map(Adaptive::of),
        })
    }
}

/// Of `run.json`: who ran what, and how many cases the gym kept in flight.
#[derive(Serialize)]
struct Facts {
    run_id: String,
    version: String,
    plan: String,
    plan_hash: String,
    benchmark_version: String,
    started_at: Option<String>,
    /// The candidate this run was made as the reference of (else null).
    reference_for: Option<String>,
    /// Where the cases in flight started and settled, the peak, the server's gauges
    /// and busy share (null for a run that recorded none).
    concurrency: Option<ConcurrencyFacts>,
}

#[derive(Serialize)]
struct PlanFacts {
    name: String,
    hash: String,
}

/// The run's cases counted.
#[derive(Serialize)]
struct Counts {
    /// Cases the plan holds (null: no plan in the run directory).
    planned: Option<usize>,
    /// Cases recorded (a case run again counts once; a run that stopped early has
    /// fewer than planned).
    recorded: usize,
    /// Of those, cases the bench failed (`error` set).
    errors: usize,
    /// Lines that could not be read as a record (left out of `recorded`).
    damaged: usize,
}

/// Of the judgement: its verdict and, for a run that stopped early, how.
#[derive(Serialize)]
struct JudgementFacts {
    /// null: a judgement whose verdict this build does not read.
    verdict: Option<Verdict>,
    /// The verdict and why, in one line (null for a judgement of an older layout).
    summary: Option<String>,
    judged_at: Option<String>,
    /// As the judgement holds it (docs/statistics.md, "Stopping early"); null for a run
    /// that ran its whole plan.
    early_stop: Option<EarlyStopSummary>,
}

/// The adaptive attacker's search, attempt by attempt, without the texts.
#[derive(Serialize)]
struct Adaptive {
    proposer: Proposer,
    /// Whether the proposer saw each attempt's feedback.
    feedback: bool,
    /// Attempts per searched pair.
    budget: usize,
    /// The searched pairs.
    pairs: Vec<Pair>,
    /// The held-out pairs, each tried with every frozen attempt.
    held_out: Vec<Pair>,
    /// The model server's busy readings over the campaign (null: none read).
    busy: Option<Busy>,
    /// Why the search ended before its budget (null: it did not).
    abandoned: Option<String>,
}

impl Adaptive {
    fn of(log: SearchLog) -> Adaptive {
        Adaptive {
            proposer: log.proposer,
            feedback: log.feedback,
            budget: log.attempts,
            pairs: log.pairs.iter().map(Pair::of).collect(),
            held_out: log.held_out.iter().map(Pair::of).collect(),
            busy: log.busy,
            abandoned: log.abandoned,
        }
    }
}

#[derive(Serialize)]
struct Pair {
    suite: String,
    user_task: String,
    injection_task: String,
    attempts: Vec<AttemptFacts>,
}

impl Pair {
    fn of(pair: &PairLog) -> Pair {
        Pair {
            suite: pair.suite.clone(),
            user_task: pair.user_task.clone(),
            injection_task: pair.injection_task.clone(),
            attempts: pair
                .attempts
                .iter()
                .map(|attempt| AttemptFacts {
                    case_id: attempt.case_id.clone(),
                    landed: attempt.landed,
                    refused: attempt.refused.as_ref().map(ToString::to_string),
                    bench_error: attempt.refused.as_ref().is_some_and(|why| why.is_bench_error()),
                    cost: attempt.cost,
                })
                .collect(),
        }
    }
}

#[derive(Serialize)]
struct AttemptFacts {
    case_id: String,
    /// null: the attempt never reached the target, or its case errored.
    landed: Option<bool>,
    /// Why it never ran, in words (null: it ran).
    refused: Option<String>,
    /// Whether that was the bench's failure rather than the attacker model declining.
    bench_error: bool,
    /// What writing it cost the attacker model (null: no model wrote it).
    cost: Option<AttackerCost>,
}

/// One case's conversation (`pruefstand show RUN --traces`).
#[derive(Serialize)]
struct Conversation {
    case_id: String,
    /// AgentDojo's trace as the gym wrote it (null: not read, see `trace_error`).
    trace: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_error: Option<String>,
}

impl Conversation {
    fn of(run: &RunDir, record: &CaseRecord) -> Conversation {
        let (trace, trace_error) = match run.trace(record) {
            Ok(trace) => (Some(trace), None),
            Err(err) => (None, Some(err.to_string())),
        };
        Conversation { case_id: record.case_id.clone(), trace, trace_error }
    }
}
