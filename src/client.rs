//! What the commands share as clients of the queue and the daemon (pueue's `client/`),
//! so that no command module imports another: whether a daemon runs and how to start
//! one; a queued job followed to its end (the queue's watch, no polling), its states
//! said on the way and its end as `run` says it; how a run's figures and judgement are
//! printed. Each command's own flow, and what only it prints, stays in its file under
//! `cmd`.

use std::path::Path;

use pruefstand_core::queue::{Job, Queue, State};
use pruefstand_core::root::Root;
use pruefstand_core::telemetry::Telemetry;
use pruefstand_core::watch::{Change, Folder};
use pruefstand_judge::Judgement;
use pruefstand_store::RunDir;

// The daemon, seen from a command.

/// Whether a daemon holds the queue's daemon lock.
pub(crate) fn daemon_running(queue: &Queue) -> anyhow::Result<bool> {
    crate::daemon::state::lock_held(queue)
}

/// The state `queue` and `status` show for a job left `running` with no daemon holding
/// the lock.
pub(crate) const DAEMON_GONE: &str = "daemon gone";

/// Says so when no daemon will pick the queue up, or when the queue is paused.
pub(crate) fn note_without_daemon(root: &Root, queue: &Queue) -> anyhow::Result<()> {
    if !daemon_running(queue)? {
        let how = how_to_start(root);
        tracing::info!("note: no daemon runs for {}; start one: {how}", root.path.display());
    }
    if queue.is_paused() {
        tracing::info!("note: the queue is paused; `pruefstand resume` lets the daemon start jobs again");
    }
    Ok(())
}

/// How to start a daemon here, as `status` and `start` say it: the user unit where a
/// systemd user manager runs, else the command to run it by hand and where it logs.
pub(crate) fn how_to_start(root: &Root) -> String {
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
    std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|dir| Path::new(&dir).join("systemd/private").exists())
}

// A queued job, followed.

/// Blocks until the job is done, failed or cancelled, calling `on_change` on every
/// state it passes through. Wakes on the queue's changes (`jobs/`, whose `.changed`
/// every transition bumps) and on the job's `job.json` in its folder: a file changed in
/// place, by anything but the queue, bumps nothing else. The job's other files (its
/// log grows with every line) do not wake it.
pub(crate) fn wait_final(queue: &Queue, id: u64, mut on_change: impl FnMut(&Job)) -> anyhow::Result<Job> {
    let wakeups = queue.wakeups(&[Folder::Jobs, Folder::Job(id)], move |change| {
        matches!(change, Change::Jobs | Change::Unknown) || *change == Change::Job(id)
    })?;
    let job_file = queue.job_dir(id).join("job.json");
    let mut last = None;
    let mut unreadable = None;
    loop {
        let job = match queue.load(id) {
            Ok(job) => job,
            // A file changed in place is seen half-written at times, and a damaged one
            // the daemon replaces: wait for its next change. One that is gone ends it.
            Err(err) if job_file.exists() => {
                let said = format!("{err:#}");
                if unreadable.as_ref() != Some(&said) {
                    tracing::warn!("job {id}: its file does not load now ({said}); waiting for it to change");
                    unreadable = Some(said);
                }
                wakeups.wait(None)?;
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
        wakeups.wait(None)?;
    }
}

/// A state a waited-for job passes through, on stderr; its end is [`print_end`]'s to
/// say, once (a failed job's error said here too would be said twice).
pub(crate) fn say_progress(job: &Job) {
    if !job.state.is_final() {
        tracing::info!("job {}: {}", job.id, describe(job));
    }
}

/// A job's state in a few words.
pub(crate) fn describe(job: &Job) -> String {
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

/// What `run` prints at its end (run folder, summary, rules, report, verdict), from
/// the run's judgement.json, for an ended job; its exit code is `run`'s.
pub(crate) fn print_end(job: &Job) -> std::process::ExitCode {
    if let Some(run_dir) = &job.run_dir {
        outln!("{}", run_dir.display());
    }
    let judgement = job.run_dir.as_ref().filter(|_| job.verdict.is_some()).and_then(|dir| {
        let run = RunDir::open(dir).ok()?;
        Some((pruefstand_judge::StoredJudgement::read(&run).ok()??.current?, run.report_path()))
    });
    match (&judgement, &job.verdict) {
        (Some((judgement, report)), _) => {
            outln!("{}", judgement.summary);
            print_judgement(judgement, report);
        }
        (None, Some(verdict)) => outln!("verdict: {}", verdict.as_str()),
        (None, None) => outln!("{}: {}", job.state.as_str(), job.error.as_deref().unwrap_or("")),
    }
    std::process::ExitCode::from(job.exit_code())
}

// A run's result, as the terminal shows it.

/// The headline figures of a run, each with its hits and denominator, and its errors.
pub(crate) fn headline(telemetry: &Telemetry) -> String {
    let d = &telemetry.denominators;
    let show = |name: &str| {
        let rate = &d[name];
        match rate.value {
            Some(v) => format!("{:.1} % ({}/{})", v * 100.0, rate.hits, rate.n),
            None => "–".into(),
        }
    };
    use pruefstand_core::words;
    let overflows = telemetry.format_health.asr_overflows;
    let asr = match overflows {
        0 => show("asr"),
        1 => format!("{} [1 of them a context overflow]", show("asr")),
        n => format!("{} [{n} of them context overflows]", show("asr")),
    };
    format!(
        "{} {}  {} {}  {} {}  {} {}  errors {}",
        words::UTILITY_CLEAN,
        show("utility"),
        words::UTILITY_UNDER_ATTACK,
        show("utility_under_attack"),
        words::ASR_ALL,
        asr,
        words::INJECTION_GOAL_UTILITY,
        show("injection_task_utility"),
        telemetry.counts.errors
    )
}

/// The figure R2 judged by its name, the rules, the report's path and the verdict, as
/// `run` ends (and `start --wait`). On a terminal (NO_COLOR unset) the verdict is bold
/// in its colour — the hues the reports give verdicts —, plain otherwise; every line
/// wraps at the terminal's width (100 columns without one), a rule's reason continuing
/// under where it began.
pub(crate) fn print_judgement(judgement: &Judgement, report: &Path) {
    use std::io::IsTerminal;
    let terminal = std::io::stdout().is_terminal();
    let width = if terminal { console::Term::stdout().size_checked().map(|(_, cols)| usize::from(cols)) } else { None };
    let width = width.unwrap_or(PLAIN_WIDTH);
    if let Some(line) = judgement.decisive_line() {
        outln!("{}", hanging(&line, "", width));
    }
    for rule in &judgement.rules {
        let head = format!("  {} {:<16} {:<14} ", rule.id, rule.name, rule.status.as_str());
        outln!("{}", hanging(&rule.reason, &head, width));
    }
    outln!("report: {}", report.display());
    let colour = terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    outln!("verdict: {}", verdict_word(judgement.verdict, colour));
}

/// Where lines wrap when stdout is not a terminal.
const PLAIN_WIDTH: usize = 100;

/// A verdict as the terminal shows it: bold in its colour (green, red, yellow, magenta:
/// the hues of `pruefstand_report::colours`) when `colour`, else the word alone.
fn verdict_word(verdict: pruefstand_core::record::Verdict, colour: bool) -> String {
    use pruefstand_core::record::Verdict;
    let word = verdict.as_str();
    if !colour {
        return word.to_string();
    }
    let ansi = match verdict {
        Verdict::Approved => "32",
        Verdict::Rejected => "31",
        Verdict::Inconclusive => "33",
        Verdict::Invalid => "35",
    };
    format!("\x1b[1;{ansi}m{word}\x1b[0m")
}

/// `text` after `head`, wrapped at `width` columns between words; continuation lines
/// are indented to where the text began (to 4 columns when that would leave under 40),
/// and a word longer than a line (a path) is cut.
fn hanging(text: &str, head: &str, width: usize) -> String {
    let start = head.chars().count();
    let indent = if width.saturating_sub(start) >= 40 { start } else { 4 };
    let room = |first: bool| width.saturating_sub(if first { start } else { indent }).max(20);
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    let mut used = 0;
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        loop {
            let room_now = room(lines.is_empty());
            let need = if used == 0 { word.len() } else { used + 1 + word.len() };
            if need <= room_now {
                if used > 0 {
                    line.push(' ');
                }
                line.extend(word.iter());
                used = need;
                break;
            }
            if used > 0 {
                lines.push(std::mem::take(&mut line));
                used = 0;
                continue;
            }
            // Alone and still too long: as much as fits, the rest on the next line.
            let rest = word.split_off(room_now);
            lines.push(word.iter().collect());
            word = rest;
        }
    }
    if used > 0 || lines.is_empty() {
        lines.push(line);
    }
    let pad = " ".repeat(indent);
    let mut out = String::from(head);
    for (i, l) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
            out.push_str(&pad);
        }
        out.push_str(l);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_lines_wrap_under_their_reason_and_the_verdict_is_coloured_only_when_asked() {
        let reason = "held-out ASR 28.1 % (18/64), 95 % lower bound 18.1 % > limit 10 %; ".repeat(6);
        let head = "  R2 security         fail           ";
        let text = hanging(&reason, head, 100);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() > 3 && lines[0].starts_with(head), "{text}");
        for line in &lines {
            assert!(line.chars().count() <= 100, "{} columns: {line:?}", line.chars().count());
        }
        for line in &lines[1..] {
            assert!(line.starts_with(&" ".repeat(head.len())) && !line[head.len()..].starts_with(' '), "{line:?}");
        }
        assert_eq!(text.split_whitespace().collect::<Vec<_>>()[3..], reason.split_whitespace().collect::<Vec<_>>()[..]);
        // A narrow terminal: a 4-column indent; a path longer than a line is cut, not lost.
        let path = format!("/{}", "x".repeat(90));
        let narrow = hanging(&format!("see {path} now"), head, 60);
        assert!(narrow.lines().skip(1).all(|l| l.starts_with("    ") && l.chars().count() <= 60), "{narrow}");
        assert_eq!(narrow.replace(['\n', ' '], ""), format!("{}see{path}now", head.replace(' ', "")));
        use pruefstand_core::record::Verdict;
        assert_eq!(verdict_word(Verdict::Rejected, false), "rejected");
        assert_eq!(verdict_word(Verdict::Rejected, true), "\x1b[1;31mrejected\x1b[0m");
        assert_eq!(verdict_word(Verdict::Approved, true), "\x1b[1;32mapproved\x1b[0m");
    }
}
