//! What a newcomer and an operator tripped over, each through the real binary: a model
//! server that is not there (named by `check`, a run that stops by itself invalid and
//! resumes once the server answers), version and plan words taken as names or paths
//! with messages that say which, files too large said to be too large, and `run`'s
//! output as one labelled block per version.
//!
//! Not here: the live view's links and the progress line's ETA (`serve`, `console`), a
//! killed run's processes (`console`).

use std::path::Path;
use std::process::Stdio;

use crate::common::*;

/// A port on 127.0.0.1 where nothing listens (bound once, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn a_dead_model_server_is_named_by_check_and_ends_the_run_invalid_and_resumable() {
    let bench = Bench::new();
    bench.write("profiles/mini.toml", MINI_PLAN);
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/v1");
    bench.write(
        "versions/elsewhere.toml",
        &format!("description = \"an external server\"\n[model]\nbackend = \"external\"\nserved_name = \"m\"\nurl = \"{url}\"\n"),
    );

    let check = bench.run(&["check", "elsewhere"]).code(2);
    assert!(check.stdout.contains(&format!("model server at {url}: nothing answers there")), "{}", check.stdout);

    // The run stops by itself: no new case once three in a row could not connect.
    let out = bench.path().join("dead-run");
    let args = ["run", "elsewhere", "--plan", "mini", "--out", out.to_str().unwrap()];
    let run = bench.run(&args).code(12);
    assert!(run.stdout.contains("verdict: invalid"), "{}", run.stdout);
    let judgement = std::fs::read_to_string(out.join("judgement.md")).unwrap();
    assert!(judgement.contains(&format!("the model server at {url} stopped answering at case ")), "{judgement}");
    let records = cases(&out);
    assert!(records.len() < MINI_CASES, "cases went on starting: {} of {MINI_CASES}", records.len());
    assert!(records.iter().all(|r| r["error"].as_str().is_some_and(|e| e.contains("cannot connect"))), "{records:?}");

    // The server comes (the simulator, under the served name) and the same command
    // finishes the run: every case once, none an error.
    let mut server = bench.sim_serve("m", port);
    let check = bench.run(&["check", "elsewhere"]);
    assert!(check.stdout.contains(&format!("model server at {url} serves m")), "{}", check.stdout);
    let resumed = bench.run(&args);
    let _ = server.kill();
    let _ = server.wait();
    assert!(matches!(resumed.code, Some(0 | 10 | 11)), "{}\n{}", resumed.stdout, resumed.stderr);
    let records = cases(&out);
    let ids: std::collections::BTreeSet<&str> = records.iter().map(|r| r["case_id"].as_str().unwrap()).collect();
    assert_eq!((records.len(), ids.len()), (MINI_CASES, MINI_CASES), "every case once");
    assert!(records.iter().all(|r| r["error"].is_null()), "{records:?}");
}

#[test]
fn a_word_is_a_name_unless_it_looks_like_a_path_and_the_message_says_which() {
    let bench = Bench::new();
    // A path: read as a spec file, its errors at file:line.
    let run = bench.run(&["run", "/etc/passwd"]).code(2);
    assert!(run.stderr.contains("/etc/passwd:1:"), "{}", run.stderr);
    // A path that is not there: said to be taken as a path, from where.
    let check = bench.run(&["check", "../pruefstand"]).code(2);
    let cwd = repo();
    assert!(
        check.stdout.contains("\"../pruefstand\" was taken as a path")
            && check.stdout.contains(&format!("relative to {}", cwd.display()))
            && check
                .stdout
                .contains(&format!("a version name is looked up in {}", bench.path().join("versions").display())),
        "{}",
        check.stdout
    );
    // A name: looked up in the root only.
    let run = bench.run(&["run", "passwd"]).code(2);
    assert!(run.stderr.contains(&format!("no version \"passwd\" in {}", bench.path().join("versions").display())));
    let run = bench.run(&["run", "demo-kandidat", "--plan", "nowhere/voll.toml"]).code(2);
    assert!(
        run.stderr.contains("no plan file nowhere/voll.toml: \"nowhere/voll.toml\" was taken as a path"),
        "{}",
        run.stderr
    );
}

#[test]
fn files_over_the_limit_are_too_large_not_missing() {
    let bench = Bench::new();
    // A spec over the limit: hostile::a_huge_spec_is_refused_unread… (the same words).
    let filler = format!("\n#{}\n", "x".repeat(2 << 20));
    let plan = std::fs::read_to_string(repo().join("profiles/schnell.toml")).unwrap();
    bench.write("profiles/big.toml", &format!("{plan}{filler}"));
    let run = bench.run(&["run", "demo-kandidat", "--plan", "big"]).code(2);
    assert!(run.stderr.contains("too large: ") && run.stderr.contains("the limit is 1024 KiB"), "{}", run.stderr);
    let config = std::fs::read_to_string(repo().join("pruefstand.toml")).unwrap();
    bench.write("pruefstand.toml", &format!("{config}{filler}"));
    let queue = bench.run(&["queue"]).code(2);
    assert!(
        queue.stderr.contains("pruefstand.toml")
            && queue.stderr.contains("too large: ")
            && queue.stderr.contains("the limit is 1024 KiB"),
        "{}",
        queue.stderr
    );
}

#[test]
fn run_prints_one_labelled_block_per_version_reference_first_each_path_once() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    let run = bench.run(&["run", "demo-kandidat", "--plan", "tiny"]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "{}\n{}", run.stdout, run.stderr);
    let (reference, candidate) = (run.reference_dir(), run.run_dir());
    let at = |needle: &str| run.stdout.find(needle).unwrap_or_else(|| panic!("{needle:?} missing:\n{}", run.stdout));
    assert!(at("reference: demo-baseline (run now)\n") < at("  demo-baseline: utility (clean) "));
    assert!(at("  demo-baseline: utility (clean) ") < at("candidate: demo-kandidat\n"));
    assert!(at("candidate: demo-kandidat\n") < at("  demo-kandidat: utility (clean) "));
    assert!(at("  demo-kandidat: utility (clean) ") < at("verdict: "));
    for dir in [&reference, &candidate] {
        // Printed once as itself (the report line names a file in it).
        assert_eq!(
            run.stdout.matches(&format!("{}\n", dir.display())).count(),
            1,
            "{} printed once:\n{}",
            dir.display(),
            run.stdout
        );
    }

    // Again, as JSON: the same blocks, the reference now reused.
    let again = bench.run(&["run", "demo-kandidat", "--plan", "tiny", "--json"]);
    let value: serde_json::Value =
        serde_json::from_str(&again.stdout).unwrap_or_else(|e| panic!("{e}: {}", again.stdout));
    assert_eq!(value["reference"]["version"], "demo-baseline");
    assert_eq!(value["reference"]["made_now"], false);
    assert_eq!(value["reference"]["run_dir"].as_str(), reference.to_str());
    assert_eq!(value["candidate"]["version"], "demo-kandidat");
    assert!(value["candidate"]["telemetry"]["denominators"]["utility"]["n"].as_u64() > Some(0), "{value}");
    assert!(value["judgement"]["verdict"].is_string(), "{value}");
}

#[test]
fn a_run_killed_after_thirty_cases_resumes_to_the_uninterrupted_records() {
    let bench = Bench::new();
    bench.write("versions/slow.toml", &slow_version(100));
    let uninterrupted = bench.run(&["run", "slow", "--plan", "schnell"]).run_dir();

    let out = bench.path().join("killed");
    let args = ["run", "slow", "--plan", "schnell", "--out", out.to_str().unwrap()];
    let mut child = bench.cmd(&args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_until("30 recorded cases", 300, || {
        std::fs::read_to_string(out.join("cases.jsonl")).is_ok_and(|t| t.lines().count() >= 30)
    });
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let needle = out.to_string_lossy().into_owned();
    wait_until("every process of the killed run to end", 10, || processes_mentioning(&needle).is_empty());
    let recorded: Vec<String> = outcomes(&out).into_iter().map(|o| o.0).collect();
    let planned = cases(&uninterrupted).len();
    assert!(recorded.len() >= 30 && recorded.len() < planned, "killed mid-run: {} of {planned}", recorded.len());

    let resumed = bench.run(&args);
    assert!(matches!(resumed.code, Some(0 | 10 | 11)), "{}\n{}", resumed.stdout, resumed.stderr);
    assert!(resumed.stderr.contains(&format!("{} already recorded", recorded.len())), "{}", resumed.stderr);
    let (starts, _) = case_starts(&out);
    for case in &recorded {
        assert_eq!(starts.get(case), Some(&1), "{case} was recorded before the kill and started again");
    }
    assert_eq!(outcomes(&out), outcomes(&uninterrupted), "nothing lost, nothing twice");
}

#[test]
fn the_eta_says_estimating_until_half_the_first_wave_has_finished() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    bench.write("versions/slow.toml", &slow_version(50));
    let run = bench.run(&["run", "slow", "--plan", "tiny"]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "{}\n{}", run.stdout, run.stderr);
    let progress: Vec<&str> = run.stderr.lines().filter(|l| l.contains("progress: ")).collect();
    // Four cases, four at once: no rate is honest before half of them finished (a
    // first wave of 128 would otherwise say "estimating" until 130 of 141).
    assert!(progress.len() >= 3, "{}", run.stderr);
    let done = |l: &str| l.split("progress: ").nth(1).and_then(|r| r.split('/').next()?.parse::<usize>().ok()).unwrap();
    for line in &progress {
        let estimating = line.ends_with("ETA estimating");
        assert_eq!(estimating, done(line) <= 2, "{progress:#?}");
    }
    assert!(progress.last().unwrap().ends_with("ETA 0 s"), "{progress:#?}");
}

/// The demo's own config watches no units and ignores a missing NVML: `check` says so
/// in OK lines and ends without a warning, whatever buses and driver this machine has.
#[test]
fn check_of_the_demo_warns_about_nothing_it_was_not_asked_to_watch() {
    let bench = Bench::new();
    let config = std::fs::read_to_string(bench.path().join("pruefstand.toml")).unwrap();
    let config = config.replace("nvml = \"ignore\"", "nvml = \"ignore\"\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"");
    bench.write("pruefstand.toml", &config);
    let nowhere = format!("unix:path={}", bench.path().join("no-bus").display());
    let mut cmd = bench.cmd(&["check", "demo-kandidat"]);
    cmd.env("DBUS_SESSION_BUS_ADDRESS", &nowhere).env("DBUS_SYSTEM_BUS_ADDRESS", &nowhere);
    let check = Run::from(cmd.output().unwrap()).ok();
    for want in [
        "OK    NVML: cannot load NVML from /nonexistent/libnvidia-ml.so.1",
        "OK    D-Bus user bus: no busy units configured (not asked)",
        "OK    D-Bus system bus: no busy units configured (not asked)",
    ] {
        assert!(check.stdout.lines().any(|l| l.starts_with(want)), "{want}\n{}", check.stdout);
    }
    assert_eq!(check.stdout.lines().last(), Some("0 FAIL, 0 WARN"), "{}", check.stdout);
}

/// SIGHUP while a job runs: the daemon stops the job (back in the queue), and every
/// line and the job's own record name the signal it got — not SIGTERM.
#[test]
fn a_sighup_during_a_job_is_named_sighup_in_the_log_and_the_job() {
    let bench = Bench::new();
    bench.write("profiles/mini.toml", MINI_PLAN);
    bench.write("versions/slow.toml", &slow_version(300));
    let mut daemon = bench.daemon();
    let id = bench.start(&["slow", "--plan", "mini"]);
    bench.wait_cases(id, 1);
    let status = daemon.signal_and_wait("HUP");
    let log = daemon.log();
    assert_eq!(status.code(), Some(75), "a reload: {log}");
    assert!(log.contains(&format!("SIGHUP: stopping job {id}")), "{log}");
    assert!(log.contains("SIGHUP: daemon exits"), "{log}");
    assert!(!log.contains("SIGTERM"), "no SIGTERM was sent:\n{log}");
    let job = bench.job(id);
    assert_eq!(job["state"], "interrupted", "{job}");
    assert!(job.to_string().contains("stopped by SIGHUP"), "{job}");
}

/// `compare` and `export` take what a newcomer has at hand: version names (their newest
/// finished run), `latest`, `job:N` — each said with the folder it became — besides
/// paths; a word that names no run is an error naming it and what a run may be. An
/// export of one run has no DPO pair: it says why and what to pass, and exits 1.
#[test]
fn compare_and_export_take_version_names_latest_and_jobs_and_say_what_is_missing() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    let run = bench.run(&["run", "demo-kandidat", "--plan", "tiny"]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "{}\n{}", run.stdout, run.stderr);
    let (baseline, kandidat) = (run.reference_dir(), run.run_dir());

    let compared = bench.run(&["compare", "demo-baseline", "demo-kandidat"]).ok();
    assert_eq!(compared.stdout.trim(), kandidat.canonicalize().unwrap().join("compare.html").to_str().unwrap());
    for (name, dir) in [("demo-baseline", &baseline), ("demo-kandidat", &kandidat)] {
        let said = format!("{name}: {} (the newest finished run of {name})", dir.display());
        assert!(compared.stderr.contains(&said), "{said:?} not in:\n{}", compared.stderr);
    }
    // `latest`: the candidate, which started after its reference.
    let latest = bench.run(&["compare", "demo-baseline", "latest"]).ok();
    assert!(latest.stderr.contains(&format!("latest: {} (the newest finished run)", kandidat.display())));

    let nobody = bench.run(&["compare", "demo-baseline", "nobody"]).code(2);
    assert!(
        nobody.stderr.contains("\"nobody\": no such run") && nobody.stderr.contains("job:N (job N's run) or latest"),
        "{}",
        nobody.stderr
    );
    bench.run(&["pause"]).ok();
    let id = bench.start(&["demo-kandidat", "--plan", "tiny"]);
    let pending = bench.run(&["compare", "demo-baseline", &format!("job:{id}")]).code(2);
    assert!(pending.stderr.contains(&format!("job {id} has no run directory yet (pending)")), "{}", pending.stderr);
    let missing = bench.run(&["export", "--format", "sft", "job:99", "--out", "/nonexistent/x.jsonl"]).code(2);
    assert!(missing.stderr.contains("\"job:99\": not a job") && missing.stderr.contains("no job 99"));

    let out = bench.path().join("exports/one.jsonl");
    let one = bench.run(&["export", "--format", "dpo", "demo-kandidat", "--out", out.to_str().unwrap()]).code(1);
    assert!(one.stdout.contains("0 dpo row(s)"), "{}", one.stdout);
    assert!(
        one.stderr.contains(
            "no DPO pair: a pair is one attacked case from two runs, one that resisted it and one that followed it"
        ) && one.stderr.contains("pass two or more runs of the same plan"),
        "{}",
        one.stderr
    );
    let out = bench.path().join("exports/sft.jsonl");
    let sft = bench.run(&["export", "--format", "sft", "demo-kandidat", "--out", out.to_str().unwrap()]);
    assert!(sft.code == Some(0) && !sft.stderr.contains("no SFT row"), "{}\n{}", sft.stdout, sft.stderr);
}

/// `judge RUN --profile P` with other thresholds keeps the run's own judgement (what
/// the index and the hooks showed) and writes its own beside it, named after the
/// profile, saying so; `--in-place` replaces the run's own and says what it was.
#[test]
fn judge_under_another_profile_writes_beside_the_runs_own_judgement() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    bench.write("profiles/strict.toml", &format!("{TINY_PLAN}\n[rules.R3]\nutility_min = 0.999\n"));
    let run = bench.run(&["run", "demo-kandidat", "--plan", "tiny"]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "{}\n{}", run.stdout, run.stderr);
    let dir = run.run_dir();
    let own: Vec<Vec<u8>> =
        ["judgement.json", "judgement.md", "report.html"].iter().map(|f| std::fs::read(dir.join(f)).unwrap()).collect();
    let verdict = json(&dir.join("judgement.json"))["verdict"].as_str().unwrap().to_string();

    // A profile's name is looked up in the bench root the command finds by itself too
    // (here: its working directory), not only under --root.
    let strict = Run::from(
        std::process::Command::new(BIN)
            .args(["judge", dir.to_str().unwrap(), "--profile", "strict"])
            .current_dir(bench.path())
            .env_remove("PRUEFSTAND_ROOT")
            .output()
            .unwrap(),
    );
    assert!(
        strict.stdout.contains(&format!("report: {}", dir.join("report-strict.html").display())),
        "{}",
        strict.stdout
    );
    assert!(
        strict
            .stderr
            .contains("judged under other thresholds than the run's own: written beside it as judgement-strict.json")
            && strict.stderr.contains(&format!("the run's own judgement ({verdict}, judged at "))
            && strict.stderr.contains("is kept (--in-place replaces it)"),
        "{}",
        strict.stderr
    );
    for (file, before) in ["judgement.json", "judgement.md", "report.html"].iter().zip(&own) {
        assert_eq!(&std::fs::read(dir.join(file)).unwrap(), before, "{file} is the run's own, untouched");
    }
    let beside = json(&dir.join("judgement-strict.json"));
    assert_eq!(beside["thresholds"]["R3"]["utility_min"], 0.999, "{beside}");
    assert!(dir.join("judgement-strict.md").is_file() && dir.join("report-strict.html").is_file());

    let replaced = bench.run(&["judge", dir.to_str().unwrap(), "--profile", "strict", "--in-place"]);
    assert!(
        replaced.stderr.contains(&format!("the run's own judgement ({verdict}, judged at ")),
        "{}",
        replaced.stderr
    );
    assert!(replaced.stderr.contains("replaced in "), "{}", replaced.stderr);
    assert_eq!(json(&dir.join("judgement.json"))["thresholds"]["R3"]["utility_min"], 0.999);
}

/// Hints name a command the user can run: `pruefstand` when that is this binary on
/// `PATH`; in the checkout it was built in, `cargo run --` (the README's way in); else
/// the binary's path. `status` without a daemon and without a systemd user session
/// says what `start` says there, not `systemctl --user start`; the log it names is one
/// git ignores in a checkout, and so is the docs' `exports/`.
#[test]
fn hints_name_the_command_that_runs_here_and_status_says_what_start_says() {
    let bench = Bench::new();
    let status = |cwd: &Path, path: Option<&std::ffi::OsStr>| {
        let mut cmd = bench.cmd(&["status"]);
        cmd.current_dir(cwd).env_remove("XDG_RUNTIME_DIR");
        if let Some(path) = path {
            cmd.env("PATH", path);
        }
        Run::from(cmd.output().unwrap()).ok().stdout
    };
    let root = bench.path().canonicalize().unwrap();
    // From the checkout, the binary not on PATH: the README's `cargo run`.
    let said = status(&repo(), None);
    assert!(said.contains("daemon: not running; start one: there is no systemd user session here"), "{said}");
    assert!(!said.contains("systemctl --user start"), "a command that cannot work here: {said}");
    assert!(said.contains(&format!("`nohup cargo run -- --root {} daemon >> daemon.log 2>&1 &`", root.display())));
    assert!(said.contains("each job's also to `cargo run -- log <id>`"), "{said}");
    // Elsewhere: the binary's own path.
    let bin = Path::new(BIN).canonicalize().unwrap();
    let said = status(bench.path(), None);
    assert!(said.contains(&format!("`nohup {} --root ", bin.display())), "{said}");
    // On PATH: its name.
    let mut path = std::ffi::OsString::from(bin.parent().unwrap());
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    let said = status(&repo(), Some(&path));
    assert!(said.contains(&format!("`nohup pruefstand --root {} daemon", root.display())), "{said}");

    // What the docs' commands leave in a checkout used as the bench root is ignored.
    let log = said.split(" >> ").nth(1).and_then(|rest| rest.split(' ').next()).unwrap();
    for left in [log, "exports/dpo.jsonl"] {
        let ignored =
            std::process::Command::new("git").arg("-C").arg(repo()).args(["check-ignore", "-q", left]).status();
        assert!(ignored.unwrap().success(), "{left} would be left untracked in a checkout");
    }
}

/// `run --help` lists the plans the bench root has — the shipped `nacht` and the
/// user's own — not a list written into the source.
#[test]
fn run_help_lists_the_plans_of_the_bench_root() {
    let bench = Bench::new();
    bench.write("profiles/meine.toml", TINY_PLAN);
    for command in ["run", "start"] {
        let help = bench.run(&[command, "--help"]).ok().stdout;
        let plan = help.split("--plan <PLAN>").nth(1).unwrap_or_default();
        for name in ["lernnacht", "nacht", "schnell", "voll", "meine"] {
            assert!(plan.split("--").next().unwrap().contains(name), "{command}: {name} missing:\n{help}");
        }
    }
}

/// `queue --last N`: the jobs changed last (a cancel, an end), not the highest ids.
#[test]
fn queue_last_shows_the_job_changed_last() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    bench.run(&["pause"]).ok();
    let ids: Vec<u64> = (0..3).map(|_| bench.start(&["demo-kandidat", "--plan", "tiny"])).collect();
    bench.run(&["cancel", &ids[0].to_string()]).ok();
    let jobs: serde_json::Value =
        serde_json::from_str(&bench.run(&["queue", "--json", "--last", "1"]).ok().stdout).unwrap();
    let listed: Vec<u64> = jobs.as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect();
    assert_eq!(listed, vec![ids[0]], "the cancelled job changed last");
    let text = bench.run(&["queue", "--last", "1"]).ok().stdout;
    assert!(text.contains("cancelled") && !text.contains(&format!("{:>4}  pending", ids[2])), "{text}");
}

/// `setup` of a new venv shows pip's progress between "installing agentdojo" and
/// "venv ready" (a minute or more): packages collected, the install — never a long
/// silence that reads as a hang.
#[test]
fn setup_shows_pips_progress_while_it_installs() {
    let dir = tempfile::tempdir().unwrap();
    let run = Run::from(
        std::process::Command::new(BIN).arg("setup").env("PRUEFSTAND_VENV", dir.path().join("venv")).output().unwrap(),
    )
    .ok();
    let lines: Vec<&str> = run.stderr.lines().collect();
    let from = lines.iter().position(|l| l.starts_with("installing agentdojo==")).expect(&run.stderr);
    let to = lines.iter().position(|l| l.starts_with("venv ready (")).expect(&run.stderr);
    let between = &lines[from + 1..to];
    assert!(between.iter().any(|l| l.starts_with("pip: 1 of ") && l.contains(" packages collected (")), "{between:#?}");
    assert!(between.iter().any(|l| l.starts_with("pip: every package collected; installing ")), "{between:#?}");
    assert!(between.iter().any(|l| l.starts_with("pip: installed, ")), "{between:#?}");
}
