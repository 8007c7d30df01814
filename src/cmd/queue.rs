//! `pruefstand queue`: the jobs of this bench root, oldest first, with when each started
//! and ended, how long it took, and the headline figures of a finished one; `--state`
//! and `--last N` (the N jobs changed last) narrow the list.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::daemon::state::human_secs;
use pruefstand_core::queue::{self, Headline, Job, Queue};
use pruefstand_core::root::Root;
use pruefstand_core::util::{self, local_time};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The jobs as JSON (job.json of each).
    #[arg(long)]
    pub(crate) json: bool,
    /// Only the jobs in this state.
    #[arg(long, value_parser = ["pending", "running", "done", "failed", "cancelled", "interrupted"])]
    pub(crate) state: Option<String>,
    /// Only the N jobs changed last (queued, started, ended, cancelled…; after
    /// `--state`), listed by id.
    #[arg(long, value_name = "N")]
    pub(crate) last: Option<usize>,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let queue = Queue::open(&root)?;
    let mut jobs = queue.list()?;
    jobs.retain(|job| args.state.as_deref().is_none_or(|state| job.state.as_str() == state));
    if let Some(last) = args.last {
        // The jobs a user just touched (a cancel, a restart, an end), not the highest ids.
        jobs.sort_by(|a, b| (last_change(a), a.id).cmp(&(last_change(b), b.id)));
        jobs.drain(..jobs.len().saturating_sub(last));
    }
    jobs.sort_by_key(|job| job.id);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&jobs)?);
        return Ok(ExitCode::SUCCESS);
    }
    if queue.is_paused() {
        outln!("the queue is paused (`pruefstand resume` lets jobs start again)");
    }
    if jobs.is_empty() {
        outln!("no jobs");
        return Ok(ExitCode::SUCCESS);
    }
    outln!("{}", header());
    let now = chrono::Utc::now();
    let daemon = crate::daemon::state::lock_held(&queue)?;
    for job in jobs {
        for line in rows(&job, now, daemon) {
            outln!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// When the job last changed: its history's last entry (RFC 3339 in UTC, which sorts
/// as text), else when it was queued.
fn last_change(job: &Job) -> &str {
    job.history.last().map_or(job.enqueued_at.as_str(), |h| h.at.as_str())
}

/// The widest a line gets: a terminal of 100 columns shows the queue unwrapped.
const WIDTH: usize = 100;
/// Where a job's second and later lines begin.
const INDENT: &str = "      ";

fn header() -> String {
    format!(
        "{:>4}  {:<11} {:>4}  {:<VERSION_W$} {:<PLAN_W$} {:>3}  {:<12}  {:>9}\n{INDENT}started · finished / figures (R2's first) / run dir or error",
        "id", "state", "prio", "version", "plan", "try", "verdict", "took"
    )
}

const VERSION_W: usize = 24;
const PLAN_W: usize = 12;

/// A job's lines: its row (id, state, priority, version and plan — long names cut with
/// `…` —, tries, verdict, time taken), then when it started and finished, its figures,
/// and its run directory or error, each within [`WIDTH`]. A job left `running` by a
/// daemon that is gone (killed, a power cut) says so: nothing runs it now.
fn rows(job: &Job, now: chrono::DateTime<chrono::Utc>, daemon: bool) -> Vec<String> {
    let stranded = job.state == queue::State::Running && !daemon;
    let state = if stranded { crate::client::DAEMON_GONE } else { job.state.as_str() };
    let mut lines = vec![format!(
        "{:>4}  {:<11} {:>4}  {:<VERSION_W$} {:<PLAN_W$} {:>3}  {:<12}  {:>9}",
        job.id,
        state,
        job.priority,
        util::cut(&job.version, VERSION_W),
        util::cut(&job.plan, PLAN_W),
        job.starts.max(job.attempt),
        job.verdict.map_or("", |v| v.as_str()),
        took(job, now),
    )];
    let (started, finished) = queue::started_finished(job);
    lines.push(match (started, finished) {
        (None, _) => format!("{INDENT}queued {}", local_time(&job.enqueued_at)),
        (Some(started), None) => format!("{INDENT}started {}", local_time(started)),
        (Some(started), Some(finished)) => {
            format!("{INDENT}started {} · finished {}", local_time(started), local_time(finished))
        }
    });
    if let Some(chain) = job.chain() {
        lines.push(format!("{INDENT}{}", util::cut(&chain, WIDTH - INDENT.len())));
    }
    if stranded {
        lines.push(format!("{INDENT}its daemon is gone: it resumes when one starts (`pruefstand daemon`)"));
    }
    if let Some(figures) = job.figures.as_ref() {
        lines.push(format!("{INDENT}{}", headline(figures)));
    }
    let detail = match (&job.error, &job.run_dir) {
        (Some(error), _) => error.lines().next().unwrap_or("").to_string(),
        (None, Some(dir)) => dir.display().to_string(),
        (None, None) => String::new(),
    };
    if !detail.is_empty() {
        lines.push(format!("{INDENT}{}", util::cut(&detail, WIDTH - INDENT.len())));
    }
    lines
}

/// Every try's running time summed (restarts and resumes included).
fn took(job: &Job, now: chrono::DateTime<chrono::Utc>) -> String {
    queue::running_secs(job, now).map(human_secs).unwrap_or_default()
}

/// The figure R2 judged first, by its name (`held-out ASR` when the plan held families
/// out, else `ASR (all attacks)`), then the utilities by theirs (`judge::words`); `–` for
/// a figure not measured. A job of an older build without the decisive figure shows the
/// ASR of all attacks.
fn headline(h: &Headline) -> String {
    use pruefstand_core::words;
    let pct = |rate: Option<f64>| rate.map_or("–".to_string(), pruefstand_core::util::pct);
    let first = match &h.decisive {
        Some(d) => format!("{} {}", d.name, pruefstand_core::util::pct(d.rate)),
        None => format!("{} {}", words::ASR_ALL, pct(h.asr)),
    };
    format!(
        "{first} · {} {} · {} {}",
        words::UTILITY_CLEAN,
        pct(h.utility),
        words::UTILITY_UNDER_ATTACK,
        pct(h.utility_under_attack)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures' widest line: "ASR (all attacks) 100.0 % · utility (clean) 100.0 % ·
    /// utility under attack 100.0 %", within [`WIDTH`] after the indent.
    const FIGURES_W: usize = 82;
    const _: () = assert!(INDENT.len() + FIGURES_W <= WIDTH);

    #[test]
    fn headline_figures_read_as_percentages_with_their_names() {
        let h = Headline { asr: Some(0.391), utility: Some(1.0), utility_under_attack: None, decisive: None };
        assert_eq!(headline(&h), "ASR (all attacks) 39.1 % · utility (clean) 100.0 % · utility under attack –");
    }

    #[test]
    fn the_figure_r2_judged_comes_first_by_its_name() {
        let judgement = pruefstand_judge::judge(&pruefstand_judge::tests::held_out(17, 0));
        let shown = headline(&Headline::from(&judgement.figures));
        assert!(shown.starts_with("held-out ASR 28.3 % · utility (clean) 100.0 % · utility under attack"), "{shown}");
        let longest = Headline { asr: Some(1.0), utility: Some(1.0), utility_under_attack: Some(1.0), decisive: None };
        assert_eq!(headline(&longest).chars().count(), FIGURES_W);
        // Nothing held out: the ASR of all attacks, by that name.
        let judgement = pruefstand_judge::judge(&pruefstand_judge::tests::schnell(3));
        assert!(headline(&Headline::from(&judgement.figures)).starts_with("ASR (all attacks) 5.0 % · "));
    }
}
