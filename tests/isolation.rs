//! Nothing mixed, nothing leaked, driven through the real binary: a run directory
//! belongs to one version and plan and to one run at a time; two candidates share one
//! reference run; names cannot climb out of `reports/`; a resume runs bench errors
//! again; units survive odd paths; and secrets reach only the processes that need them.

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::common::*;

fn sim(susceptibility: f64, latency_ms: u32, extra: &str) -> String {
    format!(
        "{extra}\n[model]\nbackend = \"sim\"\nserved_name = \"sim/m\"\ntool_calling = \"native\"\n[sim]\nseed = 3\n\
         [sim.latency]\nbase_ms = {latency_ms}\n[sim.models.\"sim/m\"]\nsusceptibility = {susceptibility}\nskill = 1.0\n"
    )
}

fn spawn(bench: &Bench, args: &[&str], log: &Path) -> Child {
    bench.cmd(args).stdout(Stdio::piped()).stderr(std::fs::File::create(log).unwrap()).spawn().unwrap()
}

fn finish(child: Child, log: &Path) -> Run {
    let mut run = Run::from(child.wait_with_output().unwrap());
    run.stderr = std::fs::read_to_string(log).unwrap();
    run
}

#[test]
fn out_refuses_a_run_directory_of_another_version_or_a_foreign_folder() {
    let bench = Bench::new();
    let plan = bench.write("profiles/tiny.toml", TINY_PLAN);
    bench.write("versions/gullible.toml", &sim(1.0, 0, ""));
    bench.write("versions/hardened.toml", &sim(0.0, 0, ""));
    let out = bench.path().join("runs/x");
    let out_arg = out.to_str().unwrap();
    bench.run(&["run", "gullible", "--plan", plan.to_str().unwrap(), "--out", out_arg]).code(10);
    let before = std::fs::read(out.join("cases.jsonl")).unwrap();

    let other = bench.run(&["run", "hardened", "--plan", "tiny", "--out", out_arg]).code(2);
    assert!(
        other.stderr.contains("holds another run") && other.stderr.contains("version: gullible, requested hardened"),
        "{}",
        other.stderr
    );
    assert_eq!(std::fs::read(out.join("cases.jsonl")).unwrap(), before, "nothing written");
    assert_eq!(json(&out.join("version.json"))["name"], "gullible");

    // A folder of someone else's is neither used nor changed.
    let foreign = bench.path().join("shared");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let refused = bench.run(&["run", "hardened", "--plan", "tiny", "--out", foreign.to_str().unwrap()]).code(2);
    assert!(refused.stderr.contains("is not a run directory"), "{}", refused.stderr);
    assert_eq!(std::fs::metadata(&foreign).unwrap().permissions().mode() & 0o7777, 0o1777);
    assert_eq!(std::fs::read_dir(&foreign).unwrap().count(), 1);
}

#[test]
fn a_second_run_on_a_held_directory_exits_2_naming_the_holder() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    bench.write("versions/slow.toml", &sim(0.5, 400, ""));
    let out = bench.path().join("runs/y");
    let args = ["run", "slow", "--plan", "tiny", "--out", out.to_str().unwrap()];
    let first_log = bench.path().join("first.log");
    let first = spawn(&bench, &args, &first_log);
    let holder = first.id();
    wait_until("the first run's identity", 60, || out.join("identity.json").is_file());

    let second = bench.run(&args).code(2);
    assert!(
        second.stderr.contains("is in use by another run") && second.stderr.contains(&format!("pid {holder}")),
        "{}",
        second.stderr
    );
    let first = finish(first, &first_log);
    assert!(matches!(first.code, Some(0 | 10 | 11)), "{}", first.stderr);
    let (starts, _) = case_starts(&out);
    assert_eq!(starts.len(), 4);
    assert!(starts.values().all(|n| *n == 1), "every case ran once: {starts:?}");
}

#[test]
fn two_candidates_share_one_run_of_their_reference() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    bench.write("versions/base.toml", &sim(0.5, 300, ""));
    bench.write("versions/cand-a.toml", &sim(0.0, 0, "reference = \"base\""));
    bench.write("versions/cand-b.toml", &sim(0.1, 0, "reference = \"base\""));
    let logs = [bench.path().join("a.log"), bench.path().join("b.log")];
    let a = spawn(&bench, &["run", "cand-a", "--plan", "tiny"], &logs[0]);
    let b = spawn(&bench, &["run", "cand-b", "--plan", "tiny"], &logs[1]);
    let (a, b) = (finish(a, &logs[0]), finish(b, &logs[1]));
    for run in [&a, &b] {
        assert!(matches!(run.code, Some(0 | 10 | 11)), "{}\n{}", run.stdout, run.stderr);
    }
    let reference_runs: Vec<PathBuf> = std::fs::read_dir(bench.path().join("reports/base/tiny"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(reference_runs.len(), 1, "one reference run: {reference_runs:?}");
    let (starts, _) = case_starts(&reference_runs[0]);
    assert!(starts.len() == 4 && starts.values().all(|n| *n == 1), "{starts:?}");
    let waited = [&a, &b].iter().filter(|r| r.stderr.contains("reference: waiting for the run of base")).count();
    let reused = [&a, &b].iter().filter(|r| r.stdout.contains("(reused)")).count();
    assert_eq!((waited, reused), (1, 1), "a:\n{}\nb:\n{}", a.stderr, b.stderr);
}

#[test]
fn names_cannot_climb_out_of_the_reports_folder() {
    let bench = Bench::new();
    std::fs::copy(bench.path().join("versions/demo-baseline.toml"), bench.path().join("versions/...toml")).unwrap();
    let run = bench.run(&["run", "..", "--plan", "schnell"]).code(2);
    assert!(
        run.stderr.contains("not a usable version name") && run.stderr.contains("starts with '.'"),
        "{}",
        run.stderr
    );

    // Unique names: the folder above the bench is shared with other tests.
    let escaped = format!("escaped-{}", std::process::id());
    let escaping = TINY_PLAN.replace("name = \"tiny\"", &format!("name = \"../../../{escaped}\""));
    let plan = bench.write("profiles/escape.toml", &escaping);
    let run = bench.run(&["run", "demo-baseline", "--plan", plan.to_str().unwrap()]).code(2);
    assert!(
        run.stderr.contains(&format!("escape.toml:2:8: name: \"../../../{escaped}\" starts with '.'")),
        "{}",
        run.stderr
    );

    let climbed = format!("x-{}", std::process::id());
    let run =
        bench.run(&["gym", "--plan", "tiny", "--agent-cmd", "true", "--name", &format!("../../{climbed}")]).code(2);
    assert!(run.stderr.contains("--name") && run.stderr.contains("starts with '.'"), "{}", run.stderr);
    let run = bench.run(&["run", "demo-baseline", "--jobs", "0"]).code(2);
    assert!(run.stderr.contains("--jobs"), "{}", run.stderr);
    let outside = bench.path().parent().unwrap();
    assert!(!outside.join(&escaped).exists() && !outside.join(&climbed).exists());
    assert!(!bench.path().join("reports").exists(), "nothing was created");
}

#[test]
fn a_resume_runs_the_cases_that_ended_in_a_bench_error_again() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    // An agent that dies until a marker exists, then answers every query with a final
    // message: the first pass is all bench errors, the resume scores every case.
    let marker = bench.path().join("healthy");
    let agent = bench.write(
        "agent.py",
        &format!(
            "import json, os, sys\nif not os.path.exists({:?}):\n    sys.exit(3)\nfor line in sys.stdin:\n    \
             if json.loads(line).get(\"type\") == \"query\":\n        \
             print(json.dumps({{\"final_answer\": \"done\"}}), flush=True)\n",
            marker.to_str().unwrap()
        ),
    );
    let out = bench.path().join("runs/g");
    let agent_cmd = format!("python3 {}", agent.display());
    let args = ["gym", "--plan", "tiny", "--agent-cmd", &agent_cmd, "--out", out.to_str().unwrap()];
    bench.run(&args).ok();
    assert!(cases(&out).iter().all(|c| c["outcome"] == "error"), "{:?}", cases(&out));

    std::fs::write(&marker, "").unwrap();
    let resumed = bench.run(&args).ok();
    assert!(
        resumed.stderr.contains("4 recorded cases ended in a bench error (server, timeout, agent): they run again"),
        "{}",
        resumed.stderr
    );
    let records = cases(&out);
    assert_eq!(records.len(), 4);
    assert!(records.iter().all(|c| c["outcome"] == "scored" && c["error"].is_null()), "{records:?}");
}

#[test]
fn units_name_a_binary_and_root_with_spaces_and_percent_signs() {
    let bench = Bench::new();
    let odd = bench.path().join("my bench %h $HOME");
    std::fs::create_dir_all(&odd).unwrap();
    std::fs::copy(bench.path().join("pruefstand.toml"), odd.join("pruefstand.toml")).unwrap();
    let bin = odd.join("bin dir %i").join("pruefstand");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(BIN, &bin).unwrap();
    let units = bench.path().join("units");
    let out = Command::new(&bin)
        .args(["--root", odd.to_str().unwrap(), "install-units", "--dir", units.to_str().unwrap()])
        .output()
        .unwrap();
    let out = Run::from(out).ok();
    assert_eq!(out.stdout.lines().count(), 7, "the daemon and the voll, nacht and lernnacht timers and services");
    let service = std::fs::read_to_string(units.join("pruefstand.service")).unwrap();
    let quoted_root = format!("\"{}\"", odd.display().to_string().replace('%', "%%").replace('$', "$$"));
    assert!(service.contains(&format!("--root {quoted_root} daemon")), "{service}");
    // systemd itself resolves the quoted, escaped binary path (an unquoted one would be
    // split at the space, `%i` expanded): verify fails when the executable is not found.
    let verify = Command::new("/usr/bin/systemd-analyze").arg("verify").arg(units.join("pruefstand.service")).output();
    let verify = verify.unwrap();
    let stderr = String::from_utf8_lossy(&verify.stderr);
    assert!(verify.status.success() && stderr.trim().is_empty(), "{stderr}\n{service}");
}

/// A local HTTP server that answers 200 to everything; the requests' paths.
fn webhook_sink() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let Some((request_line, _, _)) = read_request(&mut reader) else { continue };
            record.lock().unwrap().push(request_line.split_whitespace().nth(1).unwrap_or("").to_string());
            let _ = write!(stream, "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    (port, seen)
}

/// `NAME=value` pairs of a process's environment (empty once it is gone).
fn environ(pid: u32) -> BTreeMap<String, String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter_map(|kv| String::from_utf8_lossy(kv).split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

fn cmdline(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()).replace('\0', " ")
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes())) {
                found.push(path);
            }
        }
    }
    found
}

#[test]
fn secrets_reach_only_the_processes_that_need_them() {
    let bench = Bench::new();
    bench.write("profiles/tiny.toml", TINY_PLAN);
    bench.write("versions/slow.toml", &sim(0.5, 300, ""));
    let (port, seen) = webhook_sink();
    let hook_url = format!("http://127.0.0.1:{port}/HOOK-SECRET-path");
    let env_dump = bench.path().join("exec-hook-env.txt");
    let mut config = std::fs::read_to_string(bench.path().join("pruefstand.toml")).unwrap();
    config += &format!(
        "\n[[hooks]]\nname = \"chat\"\nkind = \"json\"\nurl_env = \"PF_TEST_HOOK_URL\"\n\n[[hooks]]\nname = \"dump\"\n\
         kind = \"exec\"\nargv = [\"/bin/sh\", \"-c\", \"env > \\\"$0\\\"\", \"{}\"]\n",
        env_dump.display()
    );
    bench.write("pruefstand.toml", &config);
    let daemon = bench.daemon_with(|cmd| {
        cmd.env("PF_TEST_HOOK_URL", &hook_url).env("PF_TEST_OTHER_SECRET", "OTHER-SECRET-value");
    });
    let job = bench.start(&["slow", "--plan", "tiny"]);
    let run_dir = bench.wait_cases(job, 1);

    // While it runs: the gym and its workers hold no secret; each agent holds the model's
    // key and nothing of the hooks'. Looked at until both a gym and an agent were seen:
    // between two cases no agent may be running.
    let mut api_key = None;
    let (mut gyms, mut agents) = (0, 0);
    wait_until("a gym and an agent of the running job", 60, || {
        for pid in processes_mentioning(run_dir.to_str().unwrap()) {
            let env = environ(pid);
            let line = cmdline(pid);
            if env.is_empty() {
                continue;
            }
            let leaked: Vec<&String> = env.values().filter(|v| v.contains("SECRET")).collect();
            assert!(leaked.is_empty(), "{line}: {leaked:?}");
            if line.contains(" agent --config ") {
                agents += 1;
                api_key = env.get("PRUEFSTAND_API_KEY").cloned();
                assert!(api_key.is_some(), "the agent needs the model's key: {line}");
            } else if line.contains("gym.py") {
                gyms += 1;
                assert!(!env.contains_key("PRUEFSTAND_API_KEY"), "the gym holds the model's key: {line}");
            }
        }
        gyms >= 1 && agents >= 1
    });
    let api_key = api_key.unwrap();

    bench.wait_job(job, "done", 120);
    wait_until("both hooks fired", 30, || env_dump.is_file() && !seen.lock().unwrap().is_empty());
    wait_until("the exec hook's dump", 10, || {
        std::fs::read_to_string(&env_dump).is_ok_and(|t| t.contains("PRUEFSTAND_JOB="))
    });
    let dump = std::fs::read_to_string(&env_dump).unwrap();
    assert!(!dump.contains("SECRET") && !dump.contains(&api_key), "the exec hook got another's secret:\n{dump}");
    assert!(seen.lock().unwrap().iter().any(|p| p == "/HOOK-SECRET-path"), "the webhook still got its URL");

    // Nothing written anywhere holds a secret: run directory, queue, reports, daemon log.
    drop(daemon);
    for needle in [api_key.as_str(), "HOOK-SECRET", "OTHER-SECRET"] {
        let found: Vec<PathBuf> =
            files_containing(bench.path(), needle).into_iter().filter(|p| p != &env_dump).collect();
        assert!(found.is_empty(), "{needle} found in {found:?}");
    }
    assert!(run_dir.join("cases.jsonl").is_file());
}

/// A tmpfs mounted for the test, lazily unmounted at the end.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The live page's first `status` event from `serve` on `root`: its line.
fn live_line(root: &Path) -> String {
    use std::io::{BufRead, Read};
    let mut serve = Command::new(BIN)
        .arg("--root")
        .arg(root)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut address = String::new();
    BufReader::new(serve.stdout.take().unwrap()).read_line(&mut address).unwrap();
    let address = address.trim().trim_start_matches("http://").trim_end_matches('/').to_string();
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(stream, "GET /events HTTP/1.1\r\nHost: {address}\r\nAccept: text/event-stream\r\n\r\n").unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !seen.contains("\"line\":") || !seen[seen.find("\"line\":").unwrap()..].contains('\n') {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended: {seen}");
        seen += &String::from_utf8_lossy(&buf[..n]);
    }
    let _ = serve.kill();
    let _ = serve.wait();
    let data = seen.lines().find(|l| l.starts_with("data: ") && l.contains("\"line\":")).unwrap();
    let status: serde_json::Value = serde_json::from_str(&data["data: ".len()..]).unwrap();
    status["line"].as_str().unwrap().to_string()
}

#[test]
fn a_full_disk_pauses_a_daemon_job_without_using_up_its_attempts() {
    let bench = Bench::new();
    let root = bench.path().join("small-disk");
    std::fs::create_dir(&root).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=32m", "tmpfs"]).arg(&root).status();
    assert!(mounted.is_ok_and(|s| s.success()), "mounting a tmpfs needs root (CI runs as root)");
    let _mount = Tmpfs(root.clone());
    for sub in ["versions", "profiles"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::copy(bench.path().join("pruefstand.toml"), root.join("pruefstand.toml")).unwrap();
    std::fs::write(root.join("profiles/tiny.toml"), TINY_PLAN).unwrap();
    std::fs::write(root.join("versions/slow.toml"), sim(0.5, 500, "")).unwrap();
    let pf = |args: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.arg("--root").arg(&root).args(args).current_dir(repo()).stdin(Stdio::null());
        cmd
    };
    // The daemon's log lives off the small disk, so it can tell what happened.
    let log = bench.path().join("daemon.log");
    // Killed on drop, also when an assertion fails.
    let child = pf(&["daemon"]).stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
    let mut daemon = Daemon { child, log: log.clone() };
    let job_file = root.join(".pruefstand/jobs/1/job.json");
    let started = Run::from(pf(&["start", "slow", "--plan", "tiny"]).output().unwrap()).ok();
    assert_eq!(started.stdout.lines().next(), Some("1"));
    wait_until("the job's first case", 120, || {
        std::fs::read_to_string(&job_file)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|job| {
                job["run_dir"].as_str().is_some_and(|d| {
                    std::fs::read_to_string(Path::new(d).join("cases.jsonl")).is_ok_and(|t| !t.is_empty())
                })
            })
    });

    let filler = root.join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    while file.write_all(&[0u8; 1 << 20]).is_ok() {}
    drop(file);
    wait_until("the daemon to notice the full disk", 60, || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("the disk is full"))
    });
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(
        daemon.child.try_wait().unwrap().is_none(),
        "the daemon is still there:\n{}",
        std::fs::read_to_string(&log).unwrap()
    );
    // `status` and the live page say the job waits for space, where, and how much is
    // free — not a running job with a stale ETA.
    let waiting = format!("waiting for disk space: {}/.pruefstand has ", root.display());
    wait_until("status to say the job waits for space", 30, || {
        Run::from(pf(&["status"]).output().unwrap()).stdout.contains(&waiting)
    });
    let status = Run::from(pf(&["status"]).output().unwrap()).ok().stdout;
    assert!(status.contains(" free; job 1 resumes then") && !status.contains("ETA"), "{status}");
    let state: serde_json::Value =
        serde_json::from_str(&Run::from(pf(&["status", "--json"]).output().unwrap()).ok().stdout).unwrap();
    assert_eq!(state["state"]["state"], "waiting_for_space", "{state}");
    assert!(state["state"]["free_bytes"].is_u64(), "{state}");
    let line = live_line(&root);
    assert!(line.starts_with(&waiting), "{line}");
    // A gym error never ends with an empty quote of its log.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.lines().any(|l| l.trim_end().ends_with("gym.log:")), "an empty log quote:\n{text}");

    std::fs::remove_file(&filler).unwrap();
    wait_until("the job done", 180, || {
        std::fs::read_to_string(&job_file).is_ok_and(|t| t.contains("\"state\": \"done\""))
    });
    let job = json(&job_file);
    assert_eq!(job["attempt"], 1, "no attempt used up: {job}");
    let run_dir = PathBuf::from(job["run_dir"].as_str().unwrap());
    let ids: std::collections::BTreeSet<String> =
        cases(&run_dir).iter().map(|c| c["case_id"].as_str().unwrap().to_string()).collect();
    assert_eq!((ids.len(), cases(&run_dir).len()), (4, 4), "every case once");
    drop(daemon);

    // A daemon started on a full disk, in a fresh root: its error names the file.
    let fresh = root.join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    std::fs::copy(root.join("pruefstand.toml"), fresh.join("pruefstand.toml")).unwrap();
    let mut file = std::fs::File::create(&filler).unwrap();
    while file.write_all(&[0u8; 1 << 12]).is_ok() {}
    drop(file);
    let mut cmd = Command::new(BIN);
    cmd.arg("--root").arg(&fresh).arg("daemon").current_dir(repo()).stdin(Stdio::null());
    let started = Run::from(cmd.output().unwrap()).code(2);
    let lock = fresh.join(".pruefstand/daemon.lock");
    assert!(started.stderr.contains(&format!("{}: No space left on device", lock.display())), "{}", started.stderr);
}
