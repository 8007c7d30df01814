//! A night's chain as the daemon keeps it (`pruefstand start-night`, docs/training.md):
//! the morning report written when the night's last job has ended — what it judged,
//! what it trained and what the gate said of that, or where the chain stopped and why
//! — as `reports/nights/<night>/morning.md` for people and `morning.json` for tools.
//!
//! Not here: which job runs when (`Queue::next_pending` holds a chained job back until
//! the job it waits for is done; `Queue::stopped_chains` names the ones whose chain
//! stopped, and the daemon fails them with its hooks), the training (`train`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::daemon::state::human_secs;
use crate::train::Order;
use crate::train::output::TrainingManifest;
use pruefstand_core::queue::{Job, Queue, State};
use pruefstand_core::root::Root;
use pruefstand_core::util;

/// The morning report's JSON: each job of the night in queue order, and the training's
/// manifest where one finished.
#[derive(Serialize)]
struct Morning<'a> {
    night: &'a str,
    /// True when every job ended done; false when the chain stopped at a job.
    complete: bool,
    /// The jobs' running time added up, and the trainer's share of it (its container's
    /// wall time, resumed attempts' last): what the night spent on training.
    running_s: f64,
    training_s: f64,
    training_share: Option<f64>,
    jobs: Vec<JobLine<'a>>,
}

#[derive(Serialize)]
struct JobLine<'a> {
    id: u64,
    version: &'a str,
    plan: &'a str,
    state: &'a str,
    verdict: Option<&'a str>,
    summary: Option<&'a str>,
    error: Option<&'a str>,
    run_dir: Option<&'a Path>,
    /// Its tries' running time added up (a training job's: the training and the
    /// judgement of what it made).
    running_s: Option<f64>,
    /// A training job's version and its manifest (`training.json`), once it trained.
    trained: Option<String>,
    training: Option<TrainingManifest>,
}

/// Writes the night's morning report if every job of `night` has ended; returns its
/// path then.
pub(super) fn morning_if_over(root: &Root, queue: &Queue, night: &str) -> anyhow::Result<Option<PathBuf>> {
    let jobs: Vec<Job> = queue.list()?.into_iter().filter(|j| j.night.as_deref() == Some(night)).collect();
    if jobs.is_empty() || !jobs.iter().all(|j| j.state.is_final()) {
        return Ok(None);
    }
    let lines: Vec<JobLine> = jobs.iter().map(line).collect();
    let running_s: f64 = lines.iter().filter_map(|l| l.running_s).sum();
    let training_s: f64 = lines.iter().filter_map(|l| l.training.as_ref()).map(|t| t.wall_s).sum();
    let morning = Morning {
        night,
        complete: jobs.iter().all(|j| j.state == State::Done),
        running_s,
        training_s,
        training_share: (running_s > 0.0).then(|| training_s / running_s),
        jobs: lines,
    };
    let dir = root.reports().join("nights").join(night);
    std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    util::write_json_atomic(&dir.join("morning.json"), &morning)?;
    let path = dir.join("morning.md");
    util::write_atomic(&path, markdown(&morning).as_bytes())?;
    Ok(Some(path))
}

fn line(job: &Job) -> JobLine<'_> {
    let trained =
        job.training.as_ref().and_then(|o| serde_json::from_value::<Order>(o.clone()).ok()).and_then(|o| o.name);
    let training = job.training_dir.as_deref().and_then(manifest_in);
    JobLine {
        id: job.id,
        version: &job.version,
        plan: &job.plan,
        state: job.state.as_str(),
        verdict: job.verdict.map(|v| v.as_str()),
        summary: job.summary.as_deref(),
        error: job.error.as_deref(),
        run_dir: job.run_dir.as_deref(),
        running_s: pruefstand_core::queue::running_secs(job, chrono::Utc::now()),
        trained,
        training,
    }
}

/// The training manifest in a job's training folder, once the training finished.
fn manifest_in(training_dir: &Path) -> Option<TrainingManifest> {
    let text = std::fs::read_to_string(training_dir.join(crate::train::request::MANIFEST)).ok()?;
    serde_json::from_str(&text).ok()
}

fn markdown(morning: &Morning) -> String {
    let mut md = format!("# Night {}\n\n", morning.night);
    let last = morning.jobs.last();
    let _ = match (morning.complete, last) {
        (true, Some(last)) => writeln!(
            md,
            "The night trained **{}** and the gate said **{}**: {}\n",
            last.trained.as_deref().unwrap_or(last.version),
            last.verdict.unwrap_or("no verdict"),
            last.summary.unwrap_or("")
        ),
        _ => {
            let stopped = morning.jobs.iter().find(|j| j.state != "done");
            writeln!(
                md,
                "The chain **stopped** at job {}: {}\n",
                stopped.map_or(0, |j| j.id),
                stopped.map_or("no job ended", |j| j.error.unwrap_or(j.state))
            )
        }
    };
    if let Some(share) = morning.training_share {
        let _ = writeln!(
            md,
            "The jobs ran {}; the trainer {} of it ({}).\n",
            human_secs(morning.running_s),
            human_secs(morning.training_s),
            pruefstand_core::util::pct(share)
        );
    }
    for job in &morning.jobs {
        let what = match &job.trained {
            Some(name) => format!("train {name} from {}, judge it on {}", job.version, job.plan),
            None => format!("judge {} on {}", job.version, job.plan),
        };
        let _ = writeln!(md, "## Job {}: {what}\n", job.id);
        let verdict = job.verdict.map(|v| format!(", verdict **{v}**")).unwrap_or_default();
        let took = job.running_s.map(|s| format!(", ran {}", human_secs(s))).unwrap_or_default();
        let _ = writeln!(md, "- state: {}{verdict}{took}", job.state);
        if let Some(summary) = job.summary {
            let _ = writeln!(md, "- {summary}");
        }
        if let Some(error) = job.error {
            let _ = writeln!(md, "- error: {error}");
        }
        if let Some(t) = &job.training {
            let first = t.losses.first().copied().flatten();
            let last = t.losses.last().copied().flatten();
            let loss = |l: Option<f64>| l.map_or_else(|| "not finite".to_string(), |l| format!("{l:.4}"));
            let families: Vec<String> =
                t.exports.iter().flat_map(|e| e.families.iter().map(|(f, n)| format!("{f} ({n})"))).collect();
            let _ = writeln!(
                md,
                "- trained: {} {} step(s) on {} of {} row(s), loss {} → {}, {:.0} s; families trained on: {}",
                t.kind.as_str(),
                t.steps,
                t.rows_used,
                t.rows,
                loss(first),
                loss(last),
                t.step_seconds.iter().sum::<f64>(),
                if families.is_empty() { "none (clean conversations)".to_string() } else { families.join(", ") }
            );
            let _ = writeln!(md, "- adapter: {}", t.adapter.path.display());
        }
        if let Some(dir) = job.run_dir {
            let _ = writeln!(md, "- report: {}", pruefstand_store::RunDir::new(dir).report_path().display());
        }
        md.push('\n');
    }
    md
}
