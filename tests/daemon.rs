//! The daemon and its queue, driven through the real binary: `start --wait` gives
//! `run`'s verdict, `kill -9` and SIGTERM mid-run resume without re-running a finished
//! case, cancel, bad specs, sd_notify, single instance, rest, and the systemd units.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use crate::common::*;

fn bench_with_slow(latency_ms: u32) -> Bench {
    let bench = Bench::new();
    bench.write("profiles/mini.toml", MINI_PLAN);
    bench.write("versions/slow.toml", &slow_version(latency_ms));
    bench
}

#[test]
fn start_wait_gives_the_verdict_and_exit_code_of_run() {
    let bench = Bench::new();
    let _daemon = bench.daemon();
    let queued = bench.run(&["start", "demo-kandidat", "--plan", "schnell", "--wait"]).code(0);
    assert!(queued.stdout.contains("verdict: approved"), "{}", queued.stdout);
    let direct = bench.run(&["run", "demo-kandidat", "--plan", "schnell"]).code(0);
    assert!(direct.stdout.contains("verdict: approved"));
    let (a, b) = (queued.run_dir(), direct.run_dir());
    assert_ne!(a, b);
    assert_eq!(outcomes(&a), outcomes(&b), "the daemon's run and `run` agree case by case");
    assert_eq!(json(&a.join("judgement.json"))["verdict"], json(&b.join("judgement.json"))["verdict"]);
    // The job's snapshot is what ran, and it records where it came from.
    let job = bench.job(1);
    assert_eq!(
        (job["state"].as_str(), job["verdict"].as_str(), job["attempt"].as_u64()),
        (Some("done"), Some("approved"), Some(1))
    );
    assert_eq!(json(&a.join("version.json"))["hash"], job["snapshot"]["spec_hash"]);
}

#[test]
fn kill_9_mid_run_then_restart_resumes_without_rerunning_a_case() {
    let bench = bench_with_slow(200);
    let uninterrupted = bench.run(&["run", "slow", "--plan", "mini"]).run_dir();

    let mut daemon = bench.daemon();
    let id = bench.start(&["slow", "--plan", "mini"]);
    let run_dir = bench.wait_cases(id, 3);
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
    let recorded: Vec<String> = outcomes(&run_dir).into_iter().map(|o| o.0).collect();
    assert!(recorded.len() < MINI_CASES, "killed mid-run");
    assert_eq!(bench.job(id)["state"], "running", "a killed daemon leaves its job running");
    // The orphaned gym loses its event pipe and ends; wait so it cannot race the resume.
    let needle = run_dir.to_string_lossy().into_owned();
    wait_until("the orphaned gym to end", 30, || processes_mentioning(&needle).is_empty());

    let _daemon = bench.daemon();
    let job = bench.wait_job(id, "done", 120);
    assert_eq!(job["attempt"], 2, "the crash used up one attempt");
    assert_eq!(job["run_dir"].as_str(), Some(needle.as_str()), "resumed into the same run directory");
    let (starts, skips) = case_starts(&run_dir);
    for case in &recorded {
        assert_eq!(starts.get(case), Some(&1), "{case} was finished before the kill and must not start again");
    }
    assert!(skips >= recorded.len(), "the gym skipped the recorded cases ({skips} skips)");
    assert_eq!(outcomes(&run_dir), outcomes(&uninterrupted), "the resumed run equals an uninterrupted one");
}

#[test]
fn sigterm_mid_run_puts_the_job_back_and_it_completes_after_restart() {
    let bench = bench_with_slow(200);
    let mut daemon = bench.daemon();
    let id = bench.start(&["slow", "--plan", "mini"]);
    let run_dir = bench.wait_cases(id, 2);
    let status = daemon.signal_and_wait("TERM");
    assert_eq!(status.code(), Some(0), "a SIGTERM is a clean exit\n{}", daemon.log());
    let job = bench.job(id);
    assert_eq!(job["state"], "interrupted", "{job}");
    assert_eq!(job["attempt"], 0, "a clean stop gives its attempt back");
    assert!(processes_mentioning(&run_dir.to_string_lossy()).is_empty(), "the gym and its agents were stopped");
    let queue = bench.run(&["queue"]).ok();
    assert!(queue.stdout.contains("interrupted"), "{}", queue.stdout);
    let status = bench.run(&["status"]).ok().stdout;
    assert!(status.contains(&format!("job {id} (slow on mini): interrupted")), "status lists it: {status}");
    let recorded: Vec<String> = outcomes(&run_dir).into_iter().map(|o| o.0).collect();

    let _daemon = bench.daemon();
    let job = bench.wait_job(id, "done", 120);
    assert_eq!(job["attempt"], 1);
    assert_eq!(outcomes(&run_dir).len(), MINI_CASES);
    let (starts, _) = case_starts(&run_dir);
    for case in &recorded {
        assert_eq!(starts.get(case), Some(&1), "{case} ran twice");
    }
}

#[test]
fn cancel_a_pending_and_a_running_job() {
    let bench = bench_with_slow(400);
    let daemon = bench.daemon();
    let running = bench.start(&["slow", "--plan", "mini"]);
    let run_dir = bench.wait_cases(running, 1);
    let pending = bench.start(&["slow", "--plan", "mini", "--priority", "-1"]);
    assert_eq!(bench.job(pending)["state"], "pending");

    let out = bench.run(&["cancel", &pending.to_string()]).ok();
    assert!(out.stdout.contains("cancelled"), "{}", out.stdout);
    assert_eq!(bench.job(pending)["state"], "cancelled");

    let out = bench.run(&["cancel", &running.to_string()]).ok();
    assert!(out.stdout.contains("cancelled"), "{}\n{}", out.stdout, out.stderr);
    assert_eq!(bench.job(running)["state"], "cancelled");
    assert!(processes_mentioning(&run_dir.to_string_lossy()).is_empty(), "the run was stopped");
    wait_until("the daemon idle", 10, || bench.run(&["status", "--json"]).ok().stdout.contains("\"idle\""));
    assert!(
        bench
            .run(&["cancel", &running.to_string()])
            .stderr
            .contains("has ended (cancelled): there is nothing to cancel"),
        "a finished job stays finished"
    );
    drop(daemon);
}

#[test]
fn a_bad_spec_is_refused_at_start_and_nothing_is_queued_and_the_idle_daemon_sleeps() {
    let bench = Bench::new();
    let daemon = bench.daemon();
    bench.write("versions/broken.toml", "description = \"x\"\n[model]\nbackend = \"sim\"\nserved_name = 3\n");
    let out = bench.run(&["start", "broken"]).code(2);
    let file = bench.path().join("versions/broken.toml");
    assert!(out.stderr.contains(&format!("{}:4:", file.display())), "file:line:col expected: {}", out.stderr);
    assert!(bench.run(&["queue"]).ok().stdout.contains("no jobs"));
    let jobs: Vec<_> = std::fs::read_dir(bench.path().join(".pruefstand/jobs"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    assert!(jobs.is_empty(), "no half-queued job");
    assert!(bench.run(&["start", "demo-kandidat", "--plan", "nonexistent"]).code(2).stderr.contains("nonexistent"));

    // At rest: no thread of the daemon is woken (inotify and signals only, no timer).
    let switches = || context_switches(daemon.pid());
    std::thread::sleep(Duration::from_millis(500));
    let before = switches();
    std::thread::sleep(Duration::from_secs(3));
    let after = switches();
    assert_eq!(after, before, "the idle daemon woke up {} times in 3 s", after - before);
}

#[test]
fn sd_notify_ready_status_and_watchdog_and_a_single_instance() {
    let bench = Bench::new();
    let socket_path = bench.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // systemd names the watched process in WATCHDOG_PID: a shell that execs the daemon
    // knows its pid beforehand.
    let mut wrapper = std::process::Command::new("/bin/sh");
    wrapper
        .args(["-c", "WATCHDOG_PID=$$ exec \"$0\" \"$@\"", BIN, "--root"])
        .arg(bench.path())
        .arg("daemon")
        .current_dir(repo())
        .stdin(std::process::Stdio::null());
    let daemon = bench.daemon_from(wrapper, |cmd| {
        cmd.env("NOTIFY_SOCKET", &socket_path).env("WATCHDOG_USEC", "200000");
    });
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !(seen.iter().any(|m: &String| m.contains("READY=1"))
        && seen.iter().filter(|m| m.contains("WATCHDOG=1")).count() >= 3)
    {
        let n = socket.recv(&mut buf).expect("a notification within 20 s");
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(seen.iter().any(|m| m.starts_with("STATUS=")), "{seen:?}");

    let second = bench.run(&["daemon"]).code(2);
    assert!(
        second.stderr.contains(&format!(
            "already runs for {} (pid {})",
            bench.path().canonicalize().unwrap().display(),
            daemon.pid()
        )),
        "{}",
        second.stderr
    );
}

#[test]
fn units_verify_with_the_real_binary_and_root() {
    let bench = Bench::new();
    let dir = bench.path().join("units");
    let out = bench.run(&["install-units", "--dir", dir.to_str().unwrap()]).ok();
    let mut paths: Vec<_> = out.stdout.lines().map(std::path::PathBuf::from).collect();
    assert_eq!(paths.len(), 7);
    // Templates are verified as an instance too.
    for (template, instance) in [
        ("pruefstand-voll@.service", "pruefstand-voll@kandidat.service"),
        ("pruefstand-voll@.timer", "pruefstand-voll@kandidat.timer"),
        ("pruefstand-nacht@.service", "pruefstand-nacht@kandidat.service"),
        ("pruefstand-nacht@.timer", "pruefstand-nacht@kandidat.timer"),
        ("pruefstand-lernnacht@.service", "pruefstand-lernnacht@kandidat.service"),
        ("pruefstand-lernnacht@.timer", "pruefstand-lernnacht@kandidat.timer"),
    ] {
        std::fs::copy(dir.join(template), dir.join(instance)).unwrap();
        paths.push(dir.join(instance));
    }
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(!text.contains("@PRUEFSTAND_"), "{} has an unfilled placeholder", path.display());
        let verify = std::process::Command::new("/usr/bin/systemd-analyze")
            .arg("verify")
            .arg(path)
            .output()
            .expect("systemd-analyze runs");
        let stderr = String::from_utf8_lossy(&verify.stderr);
        assert!(verify.status.success() && stderr.trim().is_empty(), "{}: {stderr}", path.display());
    }
    let service = std::fs::read_to_string(dir.join("pruefstand.service")).unwrap();
    assert!(service.contains(&format!(
        "ExecStart=\"{}\" --root \"{}\" daemon",
        std::path::Path::new(BIN).canonicalize().unwrap().display(),
        bench.path().canonicalize().unwrap().display()
    )));
    assert!(
        service.contains("Type=notify") && service.contains("WatchdogSec=") && service.contains("Restart=on-failure")
    );
}

#[test]
fn status_watch_follows_a_running_job_case_by_case() {
    use std::io::{BufRead, BufReader};
    let bench = bench_with_slow(150);
    let _daemon = bench.daemon();
    let id = bench.start(&["slow", "--plan", "mini"]);
    let mut watch = bench.cmd(&["status", "--watch"]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut seen = Vec::new();
    for line in BufReader::new(watch.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        // The ETA comes once the first wave of cases in flight has been followed by a
        // case of the second (before that the rate would be one wave finishing at once).
        let progressed = line.contains(&format!("running job {id}"))
            && line.contains(&format!("/{MINI_CASES} cases"))
            && line.contains("ETA");
        seen.push(line);
        if progressed {
            break;
        }
        assert!(seen.len() < 200, "no progress line: {seen:?}");
    }
    watch.kill().unwrap();
    watch.wait().unwrap();
    // Before the gym has counted the plan's cases the job is starting, not at 0 of 0.
    assert!(!seen.iter().any(|l| l.contains(" 0/0 ")), "{seen:?}");
    bench.wait_job(id, "done", 120);

    // At rest it sleeps: its own reads of the state file are no news to it. (It looks
    // on its own every 5 s, for a daemon that died; a watch woken by its reads spins
    // thousands of times a second.)
    let mut idle = bench.cmd(&["status", "--watch"]).stdout(std::process::Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let before = context_switches(idle.id());
    std::thread::sleep(Duration::from_secs(3));
    let woke = context_switches(idle.id()) - before;
    idle.kill().unwrap();
    idle.wait().unwrap();
    assert!(woke < 50, "an idle status --watch woke {woke} times in 3 s");
}

/// The daemon keeps the config it started with; an edit of pruefstand.toml under it is
/// logged once per new content with the word that a restart applies it.
#[test]
fn an_edited_config_is_noticed_and_a_restart_named() {
    let bench = Bench::new();
    let daemon = bench.daemon();
    let file = bench.path().join("pruefstand.toml");
    let config = std::fs::read_to_string(&file).unwrap();
    let noticed = |n: usize| {
        wait_until(&format!("{n} notice(s) of the edit"), 30, || {
            daemon.log().matches("pruefstand.toml changed").count() >= n
        })
    };
    let edited = format!("{config}# an edit\n");
    std::fs::write(&file, &edited).unwrap();
    noticed(1);
    // The same content again, saved in place many times in a row: nothing new, though
    // each save truncates the file while the last one's events are still being handled.
    for _ in 0..50 {
        std::fs::write(&file, &edited).unwrap();
    }
    std::fs::write(&file, format!("{edited}# another\n")).unwrap();
    noticed(2);
    let log = daemon.log();
    let line = log.lines().find(|l| l.contains("pruefstand.toml changed")).unwrap();
    assert!(line.contains(&format!("{} changed: restart the daemon to apply it", file.display())), "{line}");
    assert_eq!(log.matches("pruefstand.toml changed").count(), 2, "{log}");
}

#[test]
fn a_job_file_damaged_mid_run_fails_that_job_keeps_its_verdict_and_the_queue_goes_on() {
    let bench = bench_with_slow(100);
    // A damaged job folder from before: warned about once per change, not at every look.
    let stray = bench.write(".pruefstand/jobs/90/job.json", "{ not json");
    let daemon = bench.daemon();
    let first = bench.start(&["slow", "--plan", "mini"]);
    let second = bench.start(&["slow", "--plan", "mini"]);
    bench.wait_cases(first, 1);
    let file = bench.path().join(format!(".pruefstand/jobs/{first}/job.json"));
    std::fs::write(&file, "garbage, not a job").unwrap();

    let job2 = bench.wait_job(second, "done", 180);
    assert!(job2["verdict"].is_string(), "{job2}");
    let job1 = bench.job(first);
    assert_eq!(job1["state"], "failed", "{job1}");
    let error = job1["error"].as_str().unwrap();
    assert!(error.contains(&format!("jobs/{first}/job.json: not a job")), "the file and the reason: {error}");
    assert!(job1["verdict"].is_string(), "the verdict it reached is kept: {job1}");
    let kept = std::fs::read_to_string(file.with_file_name("job.json.damaged")).unwrap();
    assert_eq!(kept, "garbage, not a job");
    assert!(daemon.log().contains(&format!("job {first} failed: ")), "{}", daemon.log());

    let skipped = |log: &str| log.matches("skipping job 90: ").count();
    assert_eq!(skipped(&daemon.log()), 1, "{}", daemon.log());
    // Changed by a rename: a rescan that met an in-place write between its truncation
    // and its bytes would see a third state (an empty file) and rightly warn for it.
    let changed = bench.path().join("stray.json");
    std::fs::write(&changed, "{ still not json, changed").unwrap();
    std::fs::rename(&changed, &stray).unwrap();
    let third = bench.start(&["slow", "--plan", "mini"]);
    bench.wait_job(third, "done", 180);
    assert_eq!(skipped(&daemon.log()), 2, "once more for the changed file\n{}", daemon.log());
}

/// An edit that leaves pruefstand.toml unloadable is logged with its error and the word
/// that a restart would fail — never "restart the daemon to apply it".
#[test]
fn an_invalid_config_under_a_running_daemon_is_named_not_a_restart_advised() {
    let bench = Bench::new();
    let daemon = bench.daemon();
    let file = bench.path().join("pruefstand.toml");
    let config = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("{config}\n[run\nbroken = \n")).unwrap();
    wait_until("the edit noticed", 30, || daemon.log().contains("pruefstand.toml changed"));
    let log = daemon.log();
    let line = log.lines().find(|l| l.contains("pruefstand.toml changed")).unwrap();
    assert!(line.contains("does not load") && line.contains("a restart would fail"), "{line}");
    assert!(!line.contains("restart the daemon to apply it"), "{line}");
    // A fix is noticed again, now with the advice to restart.
    std::fs::write(&file, format!("{config}# fixed\n")).unwrap();
    wait_until("the fix noticed", 30, || daemon.log().contains("restart the daemon to apply it"));
}

/// SIGHUP is a reload: the daemon says so and exits non-zero, so that systemd's
/// `Restart=on-failure` starts it again with the config read anew (a clean exit would
/// stay down).
#[test]
fn sighup_logs_and_exits_for_systemd_to_restart() {
    let bench = Bench::new();
    let mut daemon = bench.daemon();
    let status = daemon.signal_and_wait("HUP");
    assert_eq!(status.code(), Some(75), "{status:?}\n{}", daemon.log());
    assert!(daemon.log().contains("SIGHUP: daemon exits"), "{}", daemon.log());
    assert!(daemon.log().contains("so that systemd starts the daemon again"), "{}", daemon.log());
}

/// The reference is part of a job's snapshot: taken at `start` (a path resolved against
/// `start`'s working directory), so an edit of it after `start` changes nothing, and
/// its removal fails nothing.
#[test]
fn a_queued_job_runs_the_reference_as_it_was_at_start() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    let kandidat = std::fs::read_to_string(bench.path().join("versions/demo-kandidat.toml")).unwrap();
    let baseline = std::fs::read_to_string(bench.path().join("versions/demo-baseline.toml")).unwrap();
    bench.write("refs/ref-a.toml", &baseline);
    bench.write(
        "versions/cand-a.toml",
        &kandidat.replace("reference = \"demo-baseline\"", "reference = \"refs/ref-a.toml\""),
    );
    bench.write("versions/ref-b.toml", &baseline);
    bench.write("versions/cand-b.toml", &kandidat.replace("reference = \"demo-baseline\"", "reference = \"ref-b\""));
    bench.run(&["pause"]).ok();
    let start = |version: &str| {
        let run =
            Run::from(bench.cmd(&["start", version, "--plan", "tiny"]).current_dir(bench.path()).output().unwrap());
        run.ok().stdout.lines().next().and_then(|l| l.trim().parse::<u64>().ok()).unwrap()
    };
    // A relative path, resolved in the bench root where `start` ran (the daemon runs
    // elsewhere); removed after `start`.
    let a = start("cand-a");
    std::fs::remove_file(bench.path().join("refs/ref-a.toml")).unwrap();
    // A name, edited after `start`.
    let b = start("cand-b");
    let edited = baseline.replace("Simulated 8B base model", "edited after start");
    assert_ne!(edited, baseline);
    bench.write("versions/ref-b.toml", &edited);

    let _daemon = bench.daemon();
    bench.run(&["resume"]).ok();
    let job_a = bench.wait_job(a, "done", 300);
    let job_b = bench.wait_job(b, "done", 300);
    for job in [&job_a, &job_b] {
        let dir = std::path::PathBuf::from(job["run_dir"].as_str().unwrap());
        let reference =
            json(&dir.join("run.json"))["reference_run_dir"].as_str().map(std::path::PathBuf::from).unwrap();
        let reference = if reference.is_absolute() { reference } else { dir.join(reference) };
        let spec = &json(&reference.join("version.json"))["spec"];
        assert!(!spec["description"].as_str().unwrap().contains("edited after start"), "{job}: {spec}");
    }
    let snapshot = bench.path().join(format!(".pruefstand/jobs/{b}/snapshot/reference/ref-b.toml"));
    assert_eq!(std::fs::read_to_string(snapshot).unwrap(), baseline);
}

/// A version whose adapter names its exports relative to its spec's folder, as
/// docs/training.md shows it, runs through the daemon as through `run`: `start` resolves
/// the path where the spec lies and pins the export and its manifest (the job's copy of
/// the spec lies elsewhere), `restart` works, and an export changed after `start` fails
/// the queued job naming it — said once by `wait` — and `restart` refuses it.
#[test]
fn a_job_finds_the_exports_its_spec_names_beside_it_and_pins_them() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    let export = crate::queue::trained_version(&bench, "trainiert", &["important_instructions"]);
    let daemon = bench.daemon();
    let queued = bench.run(&["start", "trainiert", "--plan", "tiny", "--wait"]);
    assert!(matches!(queued.code, Some(0 | 10 | 11)), "exit {:?}\n{}\n{}", queued.code, queued.stdout, queued.stderr);
    let dir = queued.run_dir();
    let recorded = &json(&dir.join("run.json"))["attack_families"]["trained_on_exports"][0];
    let sha = crate::common::runs::sha256_hex(&std::fs::read(&export).unwrap());
    assert_eq!(recorded["sha256"], sha.as_str(), "{recorded}");
    assert!(recorded["path"].as_str().unwrap().ends_with("exports/dpo.jsonl"), "{recorded}");
    let pinned = bench.job(1)["snapshot"]["pinned"].clone();
    let pinned: Vec<&str> = pinned.as_array().unwrap().iter().map(|p| p["path"].as_str().unwrap()).collect();
    assert!(
        pinned.len() == 2 && pinned[0].ends_with("exports/dpo.jsonl") && pinned[1].ends_with(".manifest.json"),
        "{pinned:?}"
    );
    // Restarted, it runs again from its snapshot.
    bench.run(&["restart", "1"]).ok();
    let again = bench.run(&["wait", "1"]);
    assert_eq!(again.code, queued.code, "{}\n{}", again.stdout, again.stderr);

    // The export retrained after `start` (its manifest written with it, so `run` would
    // take it): the queued job fails naming the file, and `restart` refuses.
    bench.run(&["pause"]).ok();
    let id = bench.start(&["trainiert", "--plan", "tiny"]);
    crate::queue::write_export(&bench, "{\"row\": 2}\n", &["important_instructions"]);
    let changed = "adapter.trained_on_exports of version trainiert changed since the job was queued";
    let refused = bench.run(&["restart", "1"]).code(2);
    assert!(refused.stderr.contains(changed) && refused.stderr.contains("exports/dpo.jsonl"), "{}", refused.stderr);
    bench.run(&["resume"]).ok();
    let failed = bench.run(&["wait", &id.to_string()]).code(2);
    let said = format!("{}{}", failed.stdout, failed.stderr);
    assert_eq!(said.matches(changed).count(), 1, "the error, once:\n{said}");
    assert!(daemon.log().contains(changed), "{}", daemon.log());
}

/// A plan's `[[found]]` families are read when the job is queued — a relative file
/// against the plan's own folder, as `run` reads it; an absolute one too — and copied
/// into the job's snapshot: removed or changed after `start`, the job runs them as they
/// were. One whose sha256 is not the pinned one is refused by `start`, at the plan's
/// line, and nothing is queued.
#[test]
fn a_jobs_found_families_are_read_at_start_relative_to_the_plan_and_copied_into_its_snapshot() {
    use crate::queue::{tiny_plan_with, write_found_family};
    let bench = Bench::new();
    bench.write("versions/slow.toml", &slow_version(0));
    let found = |file: &str, sha: &str| format!("[[found]]\nfile = {file:?}\nsha256 = \"{sha}\"\nheld_out = true\n");
    let sha = write_found_family(&bench, "profiles/found/h1.json", "h1");
    bench.write("profiles/relativ.toml", &tiny_plan_with("relativ", "", &found("found/h1.json", &sha)));
    let elsewhere = bench.path().join("elsewhere/h2.json");
    let sha2 = write_found_family(&bench, "elsewhere/h2.json", "h2");
    let absolut =
        bench.write("plans/absolut.toml", &tiny_plan_with("absolut", "", &found(elsewhere.to_str().unwrap(), &sha2)));
    let wrong = bench.write(
        "plans/falsch.toml",
        &tiny_plan_with("falsch", "", &found("../profiles/found/h1.json", &"0".repeat(64))),
    );

    bench.run(&["pause"]).ok();
    let a = bench.start(&["slow", "--plan", "relativ"]);
    let b = bench.start(&["slow", "--plan", absolut.to_str().unwrap()]);
    let refused = bench.run(&["start", "slow", "--plan", wrong.to_str().unwrap()]).code(2);
    assert!(
        refused.stderr.contains("falsch.toml:") && refused.stderr.contains("the plan pins 0000"),
        "{}",
        refused.stderr
    );
    assert!(!bench.path().join(".pruefstand/jobs/3").exists(), "nothing queued");
    // After `start`: one family file removed, the other overwritten.
    std::fs::remove_file(bench.path().join("profiles/found/h1.json")).unwrap();
    write_found_family(&bench, "elsewhere/h2.json", "h2-edited");

    let _daemon = bench.daemon();
    bench.run(&["resume"]).ok();
    for (id, attack) in [(a, "found_h1"), (b, "found_h2")] {
        let waited = bench.run(&["wait", &id.to_string()]);
        assert!(
            matches!(waited.code, Some(0 | 10 | 11)),
            "job {id}: {:?}\n{}\n{}",
            waited.code,
            waited.stdout,
            waited.stderr
        );
        let job = bench.job(id);
        let dir = std::path::PathBuf::from(job["run_dir"].as_str().unwrap());
        let under: Vec<_> = cases(&dir).into_iter().filter(|r| r["attack"] == attack).collect();
        assert_eq!(under.len(), 2, "job {id}: every pair under {attack}");
        let copy = &job["snapshot"]["found"][0];
        let copied = bench.path().join(format!(".pruefstand/jobs/{id}/{}", copy["copy"].as_str().unwrap()));
        assert_eq!(crate::common::runs::sha256_hex(&std::fs::read(copied).unwrap()), copy["sha256"].as_str().unwrap());
    }
}
