//! `pruefstand judge <run-dir>`: re-judges a stored run from its files, without running
//! a case or touching a GPU. Reads `cases.jsonl`, `run.json` ([`RunMeta`]),
//! `environment_check.json` and the thresholds; rewrites `judgement.json`,
//! `judgement.md`, `report.html` (never `cases.jsonl`) and the reports index. Says so
//! when `cases.jsonl` is not the file the run wrote (`cases.sha256`). Judges with
//! `judge::judge_dir` and writes with `report::write`, as `run` does.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pruefstand_judge as judge;
use pruefstand_report as report;
use pruefstand_store::{LockError, RunDir};

#[derive(clap::Args)]
pub struct Args {
    /// The run directory (holds cases.jsonl and run.json).
    pub run_dir: PathBuf,
    /// Profile TOML whose [rules] table sets the thresholds (a path, or a profile name
    /// under <root>/profiles/). Default: <run-dir>/thresholds.json, else the defaults.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Reference run directory for R4. Default: run.json's reference_run_dir.
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Reports folder whose index.html to refresh. Default: the nearest of the run
    /// directory's three parents that is named `reports` or holds an index.html.
    #[arg(long)]
    pub reports_dir: Option<PathBuf>,
    /// The judgement as JSON on stdout (judgement.json's content and the report's path).
    #[arg(long)]
    pub json: bool,
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    // A run still writing its directory (or resuming) holds run.lock: judging it now
    // would read half a run and overwrite what that run writes at its end.
    let _lock = match RunDir::new(&args.run_dir).lock_if_written(None) {
        Ok(lock) => lock,
        Err(LockError::Busy { holder }) => anyhow::bail!(
            "{} is being written by {}: judge it when that run has ended",
            args.run_dir.display(),
            holder.trim()
        ),
        Err(LockError::Failed(err)) => return Err(err),
    };
    let profile = args.profile.as_deref().map(|p| resolve_profile(root.as_deref(), p));
    let judged = judge::judge_dir(&args.run_dir, profile.as_deref(), args.reference.as_deref())?;
    report::write(&args.run_dir, &judged, args.reports_dir.as_deref())?;
    let judgement = judged.judgement;
    let report = RunDir::new(&args.run_dir).report_path();
    if args.json {
        let value = serde_json::json!({ "report": report, "judgement": judgement });
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

/// `--profile schnell` means `<root>/profiles/schnell.toml` when no such file exists here.
fn resolve_profile(root: Option<&Path>, p: &Path) -> PathBuf {
    match root {
        Some(root) if !p.exists() && p.components().count() == 1 => {
            let named = root.join("profiles").join(p).with_extension("toml");
            if named.exists() { named } else { p.to_path_buf() }
        }
        _ => p.to_path_buf(),
    }
}
