//! The test bench builder: a fresh bench root in a temporary folder (the repo's
//! pruefstand.toml, versions/ and profiles/ copied in) and the real `pruefstand`
//! binary driven against it, so each test reads like a user's session.
//!
//! Commands run with the repository as working directory, so agent commands such as
//! `python3 scripts/examples/agent_counter.py` resolve as in the README.

#![allow(dead_code)]

pub mod chromium;
pub mod dbus;
pub mod docker;
pub mod machine;
pub mod nvml;
pub mod runs;
pub mod slurm;
pub mod systemd;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_pruefstand");

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub struct Bench {
    dir: tempfile::TempDir,
}

impl Bench {
    pub fn new() -> Bench {
        Bench::new_in(&std::env::temp_dir())
    }

    /// A bench under `parent` (the cluster's benches: a folder its nodes share).
    pub fn new_in(parent: &Path) -> Bench {
        std::fs::create_dir_all(parent).expect("the benches' folder");
        let dir = tempfile::Builder::new().prefix("pruefstand-test-").tempdir_in(parent).expect("temp dir");
        std::fs::copy(repo().join("pruefstand.toml"), dir.path().join("pruefstand.toml")).unwrap();
        for sub in ["versions", "profiles"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
            // Files only: a folder a tool left there (Python's `__pycache__`) is no spec.
            for entry in std::fs::read_dir(repo().join(sub)).unwrap().flatten().filter(|e| e.path().is_file()) {
                std::fs::copy(entry.path(), dir.path().join(sub).join(entry.file_name())).unwrap();
            }
        }
        Bench { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A plan file of the offline `counter` suite: `user_tasks` of it, no injection
    /// goals, one case at a time. The smallest plan a gym test can run.
    pub fn counter_plan(&self, name: &str, user_tasks: &[&str], attacks: &[&str], case_timeout_s: u32) -> PathBuf {
        let list = |items: &[&str]| items.iter().map(|i| format!("{i:?}")).collect::<Vec<_>>().join(", ");
        self.write(
            &format!("{name}.toml"),
            &format!(
                "name = {name:?}\nbenchmark_version = \"v1.2.2\"\nattacks = [{}]\njobs = 1\n\
                 case_timeout_s = {case_timeout_s}\ninjection_goals = false\n\
                 [[suites]]\nname = \"counter\"\nuser_tasks = [{}]\n",
                list(attacks),
                list(user_tasks)
            ),
        )
    }

    /// `pruefstand --root <bench> ARGS…`, not yet run.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--root").arg(self.path()).args(args).current_dir(repo()).stdin(Stdio::null());
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Run {
        Run::from(self.cmd(args).output().expect("pruefstand runs"))
    }

    /// `pruefstand sim-serve` on `port` under the served name `served` (seed 1, the
    /// shipped ground truth), once it answers. The caller kills it.
    pub fn sim_serve(&self, served: &str, port: u16) -> std::process::Child {
        let model = self.path().join("sim-model");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("sim.toml"), "seed = 1\n").unwrap();
        std::fs::copy(truth_file(), model.join("truth.json")).unwrap();
        let server = self
            .cmd(&["sim-serve", model.to_str().unwrap(), "--served-model-name", served, "--port", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_until("the simulator to answer", 60, || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        server
    }
}

/// A finished command with its output as text.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Run {
    pub fn ok(self) -> Run {
        assert_eq!(self.code, Some(0), "expected success\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }

    pub fn code(self, code: i32) -> Run {
        assert_eq!(self.code, Some(code), "expected exit {code}\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }

    /// The run directory: `run`'s candidate block (its last `run directory:` line), or
    /// the last stdout line that names an existing folder (`gym`).
    pub fn run_dir(&self) -> PathBuf {
        self.stdout
            .lines()
            .rev()
            .map(|l| PathBuf::from(l.trim_start().strip_prefix("run directory: ").unwrap_or(l)))
            .find(|p| p.is_dir())
            .unwrap_or_else(|| panic!("no run directory printed\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr))
    }

    /// `run`'s reference block: the reference's run directory.
    pub fn reference_dir(&self) -> PathBuf {
        let block = self.stdout.split("\ncandidate: ").next().filter(|b| b.contains("reference: "));
        let dir = block.and_then(|b| b.lines().find_map(|l| l.trim_start().strip_prefix("run directory: ")));
        PathBuf::from(dir.unwrap_or_else(|| panic!("no reference block\nstdout:\n{}", self.stdout)))
    }
}

/// `cases.jsonl` as JSON values.
/// The `--agent-cmd` of the hostile agent fixture in one of its modes
/// (`tests/fixtures/hostile/agent.py` lists them).
pub fn hostile_agent(mode: &str) -> String {
    format!("python3 {} {mode}", repo().join("tests/fixtures/hostile/agent.py").display())
}

pub fn cases(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("cases.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// (case_id, utility, security, error?) per case, sorted: what must match between
/// runs that should agree.
pub fn outcomes(run_dir: &Path) -> Vec<(String, serde_json::Value, serde_json::Value, bool)> {
    let mut out: Vec<_> = cases(run_dir)
        .into_iter()
        .map(|c| {
            (
                c["case_id"].as_str().unwrap().to_string(),
                c["utility"].clone(),
                c["security"].clone(),
                !c["error"].is_null(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The managed venv's Python and the gym scripts folder (`pruefstand setup`).
pub struct PyEnv {
    pub python: PathBuf,
    pub scripts: PathBuf,
}

pub fn pyenv() -> &'static PyEnv {
    static ENV: std::sync::OnceLock<PyEnv> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        let out = Run::from(Command::new(BIN).arg("setup").output().unwrap()).ok();
        let field = |prefix: &str| {
            PathBuf::from(
                out.stdout.lines().find_map(|l| l.split_once(prefix).map(|(_, v)| v.trim().to_string())).unwrap(),
            )
        };
        PyEnv { python: field("venv: "), scripts: field("gym scripts: ") }
    })
}

/// The ground-truth export of v1.2.2 (for scripted agents), written once per test process.
pub fn truth_file() -> &'static Path {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let env = pyenv();
        let out = Command::new(&env.python)
            .arg(env.scripts.join("gym.py"))
            .args(["truth", "--benchmark-version", "v1.2.2"])
            .output()
            .unwrap();
        assert!(out.status.success(), "gym truth failed: {}", String::from_utf8_lossy(&out.stderr));
        let path = std::env::temp_dir().join(format!("pruefstand-truth-{}.json", std::process::id()));
        std::fs::write(&path, &out.stdout).unwrap();
        path
    })
}

// ---- the daemon and its queue -------------------------------------------------------

/// A small plan (banking: 3 user tasks clean, 6 attacked pairs, 2 injection goals =
/// 11 cases) and a sim version whose calls take `latency_ms`, so a run lasts long
/// enough to be interrupted.
pub const MINI_PLAN: &str = r#"
name = "mini"
benchmark_version = "v1.2.2"
attacks = ["important_instructions"]
jobs = 2
case_timeout_s = 60

[[suites]]
name = "banking"
user_tasks = ["user_task_1", "user_task_2", "user_task_5"]
injection_tasks = ["injection_task_1", "injection_task_4"]
"#;
pub const MINI_CASES: usize = 11;

/// Two banking user tasks clean and attacked with one injection task (4 cases, no
/// injection goals): enough to tell versions apart, quick to run.
/// What varies between two runs of the same seed in a case record: its clocks.
pub const RECORD_TIMINGS: [&str; 3] = ["duration_s", "ttft_ms", "decode_ms"];

/// A case record without [`RECORD_TIMINGS`]: what two runs of one seed must agree on.
pub fn untimed(mut record: serde_json::Value) -> serde_json::Value {
    if let Some(map) = record.as_object_mut() {
        for timing in RECORD_TIMINGS {
            map.remove(timing);
        }
    }
    record
}

pub const TINY_PLAN: &str = r#"
name = "tiny"
benchmark_version = "v1.2.2"
attacks = ["important_instructions"]
jobs = 4
case_timeout_s = 120
injection_goals = false
[[suites]]
name = "banking"
user_tasks = ["user_task_3", "user_task_4"]
injection_tasks = ["injection_task_1"]
"#;

/// One HTTP/1.1 request from a connection: the request line, the headers (names in
/// lower case) and the body; None when the peer closed the connection.
pub fn read_request(
    reader: &mut impl std::io::BufRead,
) -> Option<(String, std::collections::BTreeMap<String, String>, Vec<u8>)> {
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return None;
    }
    let mut headers = std::collections::BTreeMap::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        if header.trim().is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap();
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let length: usize = headers.get("content-length").map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    Some((request_line.trim_end().to_string(), headers, body))
}

pub fn slow_version(latency_ms: u32) -> String {
    format!(
        r#"description = "test: the simulated model, {latency_ms} ms a call"
[model]
backend = "sim"
served_name = "sim/qwen3-8b"
tool_calling = "native"
[sim]
seed = 7
[sim.latency]
base_ms = {latency_ms}
[sim.models."sim/qwen3-8b"]
susceptibility = 0.35
skill = 0.9
"#
    )
}

/// A running `pruefstand daemon` for a bench; killed (SIGKILL) on drop. Its stderr goes
/// to `log`.
pub struct Daemon {
    pub child: std::process::Child,
    pub log: PathBuf,
}

impl Bench {
    pub fn daemon(&self) -> Daemon {
        self.daemon_with(|_| {})
    }

    /// Starts a daemon (with `setup` applied to its command) and waits until it has
    /// published a state other than `starting`.
    pub fn daemon_with(&self, setup: impl FnOnce(&mut Command)) -> Daemon {
        self.daemon_from(self.cmd(&["daemon"]), setup)
    }

    /// Like `daemon_with` for a command of the caller's (e.g. a wrapper that `exec`s it).
    pub fn daemon_from(&self, mut cmd: Command, setup: impl FnOnce(&mut Command)) -> Daemon {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let log = self.path().join(format!("daemon-{}.log", N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)));
        cmd.stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap());
        setup(&mut cmd);
        let child = cmd.spawn().expect("daemon starts");
        let daemon = Daemon { child, log };
        let pid = daemon.pid();
        let state_file = self.path().join(".pruefstand/daemon.json");
        wait_until(&format!("daemon {pid} ready"), 30, || {
            let state: Option<serde_json::Value> =
                std::fs::read_to_string(&state_file).ok().and_then(|t| serde_json::from_str(&t).ok());
            state.is_some_and(|s| s["pid"] == pid && s["state"] != "starting")
        });
        daemon
    }

    /// `start ARGS…` without `--wait`: the job id.
    pub fn start(&self, args: &[&str]) -> u64 {
        let mut all = vec!["start"];
        all.extend_from_slice(args);
        let run = self.run(&all).ok();
        run.stdout
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("no job id printed: {}", run.stdout))
    }

    pub fn job(&self, id: u64) -> serde_json::Value {
        json(&self.path().join(format!(".pruefstand/jobs/{id}/job.json")))
    }

    /// Waits until the job's state is `state`.
    pub fn wait_job(&self, id: u64, state: &str, timeout_s: u64) -> serde_json::Value {
        wait_until(&format!("job {id} {state}"), timeout_s, || self.job(id)["state"] == state);
        self.job(id)
    }

    /// Waits until the running job has at least `n` cases recorded; its run dir.
    pub fn wait_cases(&self, id: u64, n: usize) -> PathBuf {
        wait_until(&format!("job {id} with {n} cases"), 120, || {
            let job = self.job(id);
            job["state"] == "running"
                && job["run_dir"].as_str().is_some_and(|d| {
                    std::fs::read_to_string(Path::new(d).join("cases.jsonl")).is_ok_and(|t| t.lines().count() >= n)
                })
        });
        PathBuf::from(self.job(id)["run_dir"].as_str().unwrap())
    }
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` and waits for the exit status (at most 60 s).
    pub fn signal_and_wait(&mut self, signal: &str) -> std::process::ExitStatus {
        let sent = Command::new("kill").arg(format!("-{signal}")).arg(self.pid().to_string()).status().unwrap();
        assert!(sent.success());
        let mut status = None;
        wait_until("the daemon to exit", 60, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status.unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `done` every 50 ms (test code only; the daemon itself never polls).
pub fn wait_until(what: &str, timeout_s: u64, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout_s);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out after {timeout_s} s waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Holds an exclusive flock(1) on `path`, as another process would, and returns once it
/// is held (a probe's `flock -n` fails), not after a guessed delay. `-o` keeps the lock
/// out of `sleep`, so killing the child releases it.
pub fn hold_flock(path: &Path) -> std::process::Child {
    let child = Command::new("flock").args(["-x", "-o"]).arg(path).args(["sleep", "600"]).spawn().unwrap();
    wait_until(&format!("flock to hold {}", path.display()), 30, || {
        !Command::new("flock").args(["-n", "-x"]).arg(path).arg("true").status().unwrap().success()
    });
    child
}

/// The context switches of all threads of process `pid` so far: unchanged over a
/// while, nothing in it woke up.
pub fn context_switches(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches"))
                .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
                .sum::<u64>()
        })
        .sum()
}

/// Processes whose command line mentions `needle` (e.g. a run directory: the gym, its
/// workers and agents all carry it).
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

/// The gym passes in a run's events.jsonl (its `start` events) and the cases recorded in
/// the last one. A resumed pass starts only once the server it runs against answers, so
/// a case of the second pass is a case that server served.
pub fn passes(run_dir: &Path) -> (usize, usize) {
    let text = std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap_or_default();
    let mut passes = 0;
    let mut recorded = 0;
    for event in text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()) {
        match event["event"].as_str() {
            Some("start") => (passes, recorded) = (passes + 1, 0),
            Some("case") => recorded += 1,
            _ => {}
        }
    }
    (passes, recorded)
}

/// `case_start` events per case id in a run's events.jsonl, and the number of `skip`s.
pub fn case_starts(run_dir: &Path) -> (std::collections::BTreeMap<String, usize>, usize) {
    let mut starts = std::collections::BTreeMap::new();
    let mut skips = 0;
    for line in std::fs::read_to_string(run_dir.join("events.jsonl")).unwrap().lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        match event["event"].as_str() {
            Some("case_start") => *starts.entry(event["case_id"].as_str().unwrap().to_string()).or_insert(0) += 1,
            Some("skip") => skips += 1,
            _ => {}
        }
    }
    (starts, skips)
}
