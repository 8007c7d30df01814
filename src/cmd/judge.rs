//! `pruefstand judge <run>`: re-judges a stored run from its files, without running a
//! case or touching a GPU. Reads `cases.jsonl`, `run.json` ([`RunMeta`]),
//! `environment_check.json` and the thresholds. Says so when `cases.jsonl` is not the
//! file the run wrote (`cases.sha256`). Judges with `judge::judge_dir` and writes with
//! `report::write`, as `run` does (never `cases.jsonl`).
//!
//! Where the judgement goes, said on stderr every time:
//! - Under the run's own terms (its `thresholds.json` and reference), or for a run not
//!   yet judged: the run's `judgement.json`, `judgement.md`, `report.html` and the
//!   reports index, in place.
//! - Under other terms (`--profile` with other thresholds, `--reference` another run)
//!   of a run that has its judgement: beside it, as `judgement-<label>.json`,
//!   `judgement-<label>.md` and `report-<label>.html` (the label names the profile
//!   and the reference): the run's own verdict — the one the index, the queue and
//!   the hooks showed — stays. `--in-place` replaces it instead, and says what it was.
//!
//! `<run>` is a run directory, a version name, `job:N` or `latest` (`cmd::runs`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pruefstand_core::util;
use pruefstand_judge as judge;
use pruefstand_report as report;
use pruefstand_store::{LockError, RunDir, RunFile};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The run: its directory (holds cases.jsonl and run.json), a version name (its
    /// newest finished run under reports/), job:N (job N's run) or latest.
    #[arg(value_name = "RUN")]
    pub(crate) run_dir: PathBuf,
    /// Profile TOML whose [rules] table sets the thresholds (a path, or a profile name
    /// under <root>/profiles/). Default: <run-dir>/thresholds.json, else the defaults.
    /// Other thresholds than the run's own: the judgement is written beside the run's
    /// (judgement-<label>.json, report-<label>.html), unless --in-place.
    #[arg(long)]
    pub(crate) profile: Option<PathBuf>,
    /// Reference run directory for R4. Default: run.json's reference_run_dir. Another
    /// reference than the run's own: the judgement is written beside the run's, unless
    /// --in-place.
    #[arg(long)]
    pub(crate) reference: Option<PathBuf>,
    /// Replace the run's own judgement.json, judgement.md and report.html (and its
    /// verdict in the index) even when judging under other terms than the run's own.
    #[arg(long)]
    pub(crate) in_place: bool,
    /// Reports folder whose index.html to refresh. Default: the nearest of the run
    /// directory's three parents that is named `reports` or holds an index.html.
    #[arg(long)]
    pub(crate) reports_dir: Option<PathBuf>,
    /// The judgement as JSON on stdout (judgement.json's content and the report's path).
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn main(root: Option<PathBuf>, mut args: Args) -> anyhow::Result<ExitCode> {
    args.run_dir = crate::cmd::runs::resolve(root.as_deref(), std::slice::from_ref(&args.run_dir))?.remove(0);
    // A run still writing its directory (or resuming) holds run.lock: judging it now
    // would read half a run and overwrite what that run writes at its end.
    let run = RunDir::open(&args.run_dir)?;
    let _lock = match run.lock_if_written(None) {
        Ok(lock) => lock,
        Err(LockError::Busy { holder }) => anyhow::bail!(
            "{} is being written by {}: judge it when that run has ended",
            args.run_dir.display(),
            holder.trim()
        ),
        Err(LockError::Failed(err)) => return Err(err),
    };
    let profile = args.profile.as_deref().map(|p| resolve_profile(root.as_deref(), p));
    let reference = args.reference.as_deref().map(RunDir::open).transpose()?;
    let judged = judge::judge_dir(&run, profile.as_deref(), reference.as_ref())?;
    let own = own_judgement(&run);
    let other_terms = other_terms(&run, &judged, own.as_ref());
    let beside = match (&own, other_terms.is_empty(), args.in_place) {
        (Some(_), false, false) => Some(label(profile.as_deref(), &judged, &other_terms)),
        _ => None,
    };
    let report = match &beside {
        Some(label) => write_beside(&run, &judged, label)?,
        None => {
            report::write(&run, &judged, args.reports_dir.as_deref())?;
            run.report_path()
        }
    };
    say_where(&run, own.as_ref(), &other_terms, beside.as_deref(), &report);
    let judgement = judged.judgement;
    if args.json {
        let value = serde_json::json!({ "report": report, "in_place": beside.is_none(), "judgement": judgement });
        outln!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(ExitCode::from(judgement.verdict.exit_code()));
    }
    if let Some(why) = &judgement.cases_untrusted {
        outln!("note: {why}; judged as it is now");
    }
    outln!("verdict: {} — {}", judgement.verdict.as_str(), judgement.summary);
    if let Some(line) = judgement.decisive_line() {
        outln!("{line}");
    }
    outln!("figures: {}", judgement.figures_line());
    for r in &judgement.rules {
        outln!("{} {:<16} {:<14} {}", r.id, r.name, r.status.as_str(), r.reason);
    }
    if let Some(sha) = &judgement.cases_sha256 {
        outln!("judged cases.jsonl sha256 {sha}");
    }
    outln!("report: {}", report.display());
    Ok(ExitCode::from(judgement.verdict.exit_code()))
}

/// The run's own judgement as its `judgement.json` holds it: (verdict, when judged,
/// reference run id). None: not judged yet (or unreadable: nothing there to keep).
struct Own {
    verdict: &'static str,
    judged_at: String,
    reference_run_id: Option<String>,
}

fn own_judgement(run: &RunDir) -> Option<Own> {
    let stored = judge::StoredJudgement::read(run).ok()??;
    Some(Own {
        verdict: stored.verdict?.as_str(),
        judged_at: stored.judged_at.unwrap_or_default(),
        reference_run_id: stored.reference_run_id,
    })
}

/// How this judgement's terms differ from the run's own: its thresholds against the
/// run's `thresholds.json` (the defaults without one), its reference against the one
/// the run's judgement names. Empty: the same terms.
fn other_terms(run: &RunDir, judged: &judge::Judged, own: Option<&Own>) -> Vec<&'static str> {
    let mut other = Vec::new();
    let own_thresholds = run.read_thresholds().ok().flatten().unwrap_or_default();
    if judged.input.thresholds != own_thresholds {
        other.push("thresholds");
    }
    if own.is_some_and(|own| own.reference_run_id != judged.judgement.reference_run_id) {
        other.push("reference");
    }
    other
}

/// The name a judgement under other terms carries: the profile's file name (other
/// thresholds) and `vs-` the reference's run id (another reference), in letters,
/// digits, `.`, `_` and `-`.
fn label(profile: Option<&Path>, judged: &judge::Judged, other_terms: &[&str]) -> String {
    let mut parts = Vec::new();
    if other_terms.contains(&"thresholds")
        && let Some(stem) = profile.and_then(Path::file_stem)
    {
        parts.push(stem.to_string_lossy().into_owned());
    }
    if other_terms.contains(&"reference") {
        parts.push(format!("vs-{}", judged.judgement.reference_run_id.as_deref().unwrap_or("none")));
    }
    let label: String = parts
        .join("-")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .collect();
    util::cut(label.trim_start_matches('.'), 80).to_string()
}

/// The judgement under other terms beside the run's own: `judgement-<label>.json`,
/// `judgement-<label>.md`, `report-<label>.html`; the report's path.
fn write_beside(run: &RunDir, judged: &judge::Judged, label: &str) -> anyhow::Result<PathBuf> {
    let json = run.labelled_path(RunFile::Judgement, label)?;
    util::write_atomic(&json, serde_json::to_string_pretty(&judged.judgement)?.as_bytes())?;
    util::write_atomic(
        &run.labelled_path(RunFile::JudgementMarkdown, label)?,
        report::markdown(&judged.judgement).as_bytes(),
    )?;
    let html = run.labelled_path(RunFile::Report, label)?;
    util::write_atomic(&html, report::html(judged, Some(run)).as_bytes())?;
    Ok(html)
}

/// Where the judgement went, on stderr: beside the run's own (kept), or in place — and
/// then what it replaced.
fn say_where(run: &RunDir, own: Option<&Own>, other_terms: &[&str], beside: Option<&str>, report: &Path) {
    let dir = run.path().display();
    let terms = other_terms.join(" and ");
    match (beside, own) {
        (Some(label), Some(own)) => tracing::info!(
            "judged under other {terms} than the run's own: written beside it as judgement-{label}.json, \
             judgement-{label}.md and {}; the run's own judgement ({}, judged at {}) is kept (--in-place replaces it)",
            report.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            own.verdict,
            own.judged_at
        ),
        (_, None) => tracing::info!("judged: judgement.json, judgement.md and report.html written in {dir}"),
        (None, Some(own)) if other_terms.is_empty() => tracing::info!(
            "judged again under the run's own thresholds and reference: judgement.json, judgement.md and \
             report.html rewritten in {dir} (they said {}, judged at {})",
            own.verdict,
            own.judged_at
        ),
        (None, Some(own)) => tracing::info!(
            "judged under other {terms} than the run's own, --in-place: the run's own judgement ({}, judged at {}) \
             replaced in {dir} (judgement.json, judgement.md, report.html, and the index)",
            own.verdict,
            own.judged_at
        ),
    }
}

/// `--profile schnell` means `<root>/profiles/schnell.toml` when no such file exists here
/// (the root as every command finds it: `--root`, `PRUEFSTAND_ROOT`, or a parent of the
/// working directory).
fn resolve_profile(root: Option<&Path>, p: &Path) -> PathBuf {
    if p.exists() || p.components().count() != 1 {
        return p.to_path_buf();
    }
    match pruefstand_core::root::Root::find(root.map(Path::to_path_buf)) {
        Ok(root) => {
            let named = root.path.join("profiles").join(p).with_extension("toml");
            if named.exists() { named } else { p.to_path_buf() }
        }
        Err(_) => p.to_path_buf(),
    }
}
