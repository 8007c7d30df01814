//! The one console, driven through the real binary: a closed stdout ends a command
//! quietly, the daemon's journal lines carry their priority and their job, and a
//! `kill -9`'d run leaves no child of its own behind.

use std::os::fd::OwnedFd;
use std::process::Stdio;

use crate::common::*;

/// A stdout whose reader is already gone: every write gets EPIPE.
fn closed_pipe() -> OwnedFd {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    write
}

#[test]
fn a_closed_stdout_ends_every_printing_command_quietly() {
    let bench = Bench::new();
    for version in ["demo-baseline", "demo-kandidat", "demo-vorsichtig"] {
        bench.start(&[version, "--plan", "schnell"]);
    }
    for args in [
        &["queue"][..],
        &["status"],
        &["status", "--json"],
        &["check"],
        &["install-units", "--dir", bench.path().join("units").to_str().unwrap()],
        &["judge", "--help"],
    ] {
        let output = bench.cmd(args).stdout(Stdio::from(closed_pipe())).stderr(Stdio::piped()).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        assert_eq!(output.status.code(), Some(0), "{args:?} ends quietly with 0: {stderr}");
    }
}

#[test]
fn the_daemon_logs_with_journald_priorities_and_the_job_id() {
    let bench = Bench::new();
    bench.write("profiles/mini.toml", MINI_PLAN);
    bench.write("versions/quick.toml", &slow_version(0));
    // Under systemd, JOURNAL_STREAM says stderr is the journal.
    let daemon = bench.daemon_with(|cmd| {
        cmd.env("JOURNAL_STREAM", "8:12345");
    });
    let id = bench.start(&["quick", "--plan", "mini"]);
    bench.wait_job(id, "done", 180);
    let log = daemon.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for line in &lines {
        let priority = line.strip_prefix('<').and_then(|rest| rest.split_once('>')).map(|(p, _)| p);
        assert!(matches!(priority, Some("3" | "4" | "6" | "7")), "no syslog priority: {line:?}");
    }
    let job = format!("[job={id}] ");
    assert!(
        lines.iter().any(|l| l.contains(&job) && l.contains("cases to run")),
        "the gym's lines name the job:\n{log}"
    );
    assert!(lines.iter().any(|l| l.starts_with("<6>") && l.contains("daemon ready")), "{log}");
    // Outside systemd the same lines are timestamped with a level instead.
    let plain = Bench::new();
    let daemon = plain.daemon();
    let first = daemon.log().lines().next().unwrap_or_default().to_string();
    assert!(first.starts_with("20") && (first.contains(" INFO ") || first.contains(" WARN ")), "{first:?}");
}

#[test]
fn a_killed_run_leaves_none_of_its_processes_behind_and_resumes() {
    let bench = Bench::new();
    bench.write("profiles/mini.toml", MINI_PLAN);
    bench.write("versions/slow.toml", &slow_version(300));
    let out = bench.path().join("killed");
    let mut child = bench
        .cmd(&["run", "slow", "--plan", "mini", "--out", out.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("two recorded cases", 120, || {
        std::fs::read_to_string(out.join("cases.jsonl")).is_ok_and(|t| t.lines().count() >= 2)
    });
    // The gym, its workers and their agents all name the run directory on their
    // command line (the gym's request, the agents' config).
    let needle = out.to_string_lossy().into_owned();
    assert!(!processes_mentioning(&needle).is_empty(), "the run has children while it runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    wait_until("every child of the killed run to end", 10, || processes_mentioning(&needle).is_empty());
    // The gym's workers go at once and quietly: no slot thread reports the agents' end.
    let log = std::fs::read_to_string(out.join("gym.log")).unwrap();
    assert!(!log.contains("Traceback") && !log.contains("Errno 9"), "a killed run left a traceback:\n{log}");

    let recorded = cases(&out).len();
    let run = bench.run(&["run", "slow", "--plan", "mini", "--out", out.to_str().unwrap()]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains(&format!("{recorded} already recorded")), "{}", run.stderr);
    assert_eq!(cases(&out).len(), MINI_CASES);
}

/// The plain progress line counts what is in flight: with one case at a time, the
/// next case is in flight when the line is said, until none is left to start.
#[test]
fn the_progress_line_counts_the_case_in_flight_until_none_is_left() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    let run = bench.run(&["run", "demo-baseline", "--plan", "tiny", "--jobs", "1"]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "{}\n{}", run.stdout, run.stderr);
    let lines: Vec<&str> = run.stderr.lines().filter(|l| l.contains("progress: ")).collect();
    assert_eq!(lines.len(), 4, "a line per case of 4: {}", run.stderr);
    for (n, line) in lines.iter().enumerate() {
        let in_flight = if n + 1 < 4 { 1 } else { 0 };
        assert!(line.contains(&format!("progress: {}/4 cases, {in_flight} in flight, ", n + 1)), "{line}");
    }
}

/// A plan with an attacker campaign of three attempts on four banking pairs, against a
/// version that never follows (every round runs).
const CAMPAIGN: &str = r#"
name = "campaign"
benchmark_version = "v1.2.2"
wording = "per_run"
attacks = ["important_instructions"]
injection_goals = false
jobs = 4
case_timeout_s = 60
[[suites]]
name = "banking"
user_tasks = ["user_task_0", "user_task_3"]
injection_tasks = ["injection_task_0", "injection_task_1"]
[adaptive]
attempts = 3
families = ["important_instructions", "roleplay"]
"#;

/// An attacker campaign's rounds are passes of the gym over one run: what a run says
/// once (where it starts its cases in flight, its folder, a resume) is said once, not
/// again for every round as if the run had crashed and come back.
#[test]
fn a_campaign_says_a_runs_lines_once_not_once_a_round() {
    let bench = Bench::new();
    bench.write("profiles/campaign.toml", CAMPAIGN);
    bench.write(
        "versions/steady.toml",
        "[model]\nbackend = \"sim\"\nserved_name = \"sim/m\"\ntool_calling = \"native\"\n[sim]\nseed = 11\n\
         [sim.models.\"sim/m\"]\nsusceptibility = 0.0\n",
    );
    let run = |name: &str| {
        let out = bench.path().join("reports/steady/campaign").join(name);
        let run = bench.run(&["run", "steady", "--plan", "campaign", "--out", out.to_str().unwrap()]);
        assert!(matches!(run.code, Some(0 | 10 | 11)), "{}\n{}", run.stdout, run.stderr);
        run
    };
    // The first run leaves where the server settled; the second starts there and says so.
    run("first");
    let second = run("second");
    let stderr = &second.stderr;
    let count = |text: &str| stderr.lines().filter(|l| l.contains(text)).count();
    assert_eq!(count("adaptive attacker: attempt "), 3, "every round ran:\n{stderr}");
    assert_eq!(count("starting at "), 1, "said once:\n{stderr}");
    for once in ["resumed: ", "run directory: ", " cases to run, "] {
        assert!(count(once) <= 1, "{once:?} more than once:\n{stderr}");
    }
}
