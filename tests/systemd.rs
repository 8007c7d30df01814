//! The unattended night under a real systemd: the installed `.deb` in a Debian
//! bookworm container with systemd as PID 1 (`common::systemd`), driven as the user
//! anna through `systemctl --user`, `journalctl --user` and `pruefstand`, in one
//! container that is booted three times (each boot and job costs time; the steps build
//! on each other):
//!
//! 1. the daemon unit enabled and started: ready through `sd_notify` (Type=notify
//!    returns from `start` only then), its start line in the user journal, watchdog
//!    pings seen by systemd, and a hung (SIGSTOPped) daemon killed by the watchdog and
//!    restarted per `Restart=on-failure`;
//! 2. the packaged nightly timer, its schedule moved a few seconds ahead by a drop-in,
//!    queues the candidate; `list-timers` shows the next elapse before and after;
//! 3. a system unit and a user unit named in the busy-unit guard keep that job waiting,
//!    `status` (and systemd's StatusText) naming them; stopped, the job starts; one
//!    started mid-run makes the run invalid, R1 naming it;
//! 4. the verdict reaches a chat webhook receiver on 127.0.0.1 (`url_env` from the
//!    unit's EnvironmentFile), and so does every later job's, across restarts and boots;
//! 5. `kill -9` of the daemon mid-job: systemd restarts it, the job resumes, and its
//!    case records equal an uninterrupted run's, no case started twice;
//! 6. a reboot mid-job (a clean shutdown, the machine off past the timer's time): the
//!    user manager comes back through linger, the daemon resumes the job with its
//!    attempt given back, and the missed timer (`Persistent=true`) queues at boot;
//! 7. a power cut mid-job (`docker kill`: SIGKILL to every process): after boot the
//!    queue, the job and its records are whole and consistent;
//! 8. `apt-get remove` with all of it running stops nothing and leaves the bench root
//!    byte-identical; `systemctl --user disable --now` then stops the daemon and the
//!    timer and removes their dangling enablement.
//!
//! The drop-ins shorten `RestartSec` and `WatchdogSec` (and the timer's accuracy, which
//! defaults to a minute) so the night takes minutes; nothing else of the units changes.
//!
//! Not here: a real power loss (a container's kill leaves the kernel and its page cache
//! alive, so it shows that every write is whole at any instant, not that it reached the
//! disk — docs/architecture.md says which fsyncs make that true), the Jetson's arm64,
//! and what only the fake systemd can stage: a bus that goes away and comes back, one
//! that cannot be reached, a unit caught `activating` or `reloading` (src/guard/tests.rs,
//! tests/guards.rs, tests/daemon_guards.rs; docs/jetson.md lists them).

use std::collections::BTreeMap;

use crate::common::Run;
use crate::common::systemd::{HOME, Machine, USER, deb};
use crate::common::{MINI_CASES, MINI_PLAN, slow_version, untimed};

const ROOT: &str = "/home/anna/pruefstand";
const DAEMON: &str = "pruefstand.service";
const TIMER: &str = "pruefstand-voll@quick.timer";

/// The bench root's config: no GPU here (NVML ignored), one guard sample every half
/// second, one busy pattern per bus, and a JSON webhook whose URL is in the unit's
/// environment file.
const CONFIG: &str = r#"[paths]
reports = "reports"

[guard.gpu]
nvml = "ignore"
utilization_max = 10
samples = 1
interval_s = 0.5

[guard.units]
user = ["training@*.service"]
system = ["ollama.service"]

[[hooks]]
name = "team"
kind = "json"
url_env = "PRUEFSTAND_HOOK_URL"
"#;

/// A chat endpoint: appends each POST's body as one line.
const RECEIVER: &str = r#"import http.server, sys
port, out = int(sys.argv[1]), sys.argv[2]
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        with open(out, "ab") as f:
            f.write(body.replace(b"\n", b" ") + b"\n")
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Hook).serve_forever()
"#;

/// `pruefstand ARGS…` as anna in her bench root.
fn pruefstand(machine: &Machine, args: &[&str]) -> Run {
    let mut argv = vec!["pruefstand"];
    argv.extend_from_slice(args);
    machine.exec(USER, ROOT, &argv)
}

fn job(machine: &Machine, id: u64) -> serde_json::Value {
    let text = machine.read(&format!("{ROOT}/.pruefstand/jobs/{id}/job.json"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("job {id}'s job.json is not whole JSON ({e}):\n{text}"))
}

fn has_job(machine: &Machine, id: u64) -> bool {
    machine.user(&["test", "-s", &format!("{ROOT}/.pruefstand/jobs/{id}/job.json")]).code == Some(0)
}

fn wait_job(machine: &Machine, id: u64, state: &str, timeout_s: u64) -> serde_json::Value {
    machine.wait_for(&format!("job {id} {state}"), timeout_s, || {
        has_job(machine, id) && job(machine, id)["state"] == state
    });
    job(machine, id)
}

/// `start VERSION --plan PLAN` as anna: the job id.
fn start(machine: &Machine, version: &str, plan: &str) -> u64 {
    let out = pruefstand(machine, &["start", version, "--plan", plan]).ok();
    out.stdout.lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or_else(|| panic!("no job id: {}", out.stdout))
}

/// The case records of a run directory, each parsed whole.
fn records(machine: &Machine, run_dir: &str) -> Vec<serde_json::Value> {
    let text = machine.read(&format!("{run_dir}/cases.jsonl"));
    text.lines()
        .enumerate()
        .map(|(n, l)| serde_json::from_str(l).unwrap_or_else(|e| panic!("{run_dir}/cases.jsonl:{}: {e}: {l}", n + 1)))
        .collect()
}

/// Waits until job `id` runs and has at least `n` (and fewer than all) cases recorded;
/// its run directory.
fn wait_mid_run(machine: &Machine, id: u64, n: usize) -> String {
    machine.wait_for(&format!("job {id} running with {n} cases"), 120, || {
        let job = has_job(machine, id).then(|| job(machine, id));
        job.is_some_and(|j| {
            j["state"] == "running"
                && j["run_dir"].as_str().is_some_and(|d| {
                    let count = machine.sh(&format!("cat {d}/cases.jsonl 2>/dev/null | wc -l")).stdout;
                    count.trim().parse::<usize>().is_ok_and(|c| c >= n)
                })
        })
    });
    let run_dir = job(machine, id)["run_dir"].as_str().unwrap().to_string();
    assert!(records(machine, &run_dir).len() < MINI_CASES, "job {id} finished before it could be interrupted");
    run_dir
}

/// `case_start` events per case in a run's events.jsonl.
fn case_starts(machine: &Machine, run_dir: &str) -> BTreeMap<String, usize> {
    let mut starts = BTreeMap::new();
    for line in machine.read(&format!("{run_dir}/events.jsonl")).lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if event["event"] == "case_start" {
            *starts.entry(event["case_id"].as_str().unwrap().to_string()).or_insert(0) += 1;
        }
    }
    starts
}

/// The job ended `done` in its recorded run directory, with the case records of an
/// uninterrupted run, and no case recorded before the interruption started again.
fn assert_resumed_whole(
    machine: &Machine,
    id: u64,
    run_dir: &str,
    recorded_before: &[String],
    uninterrupted: &[serde_json::Value],
) {
    let done = job(machine, id);
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["run_dir"].as_str(), Some(run_dir), "job {id} resumed into another run directory");
    let starts = case_starts(machine, run_dir);
    for case in recorded_before {
        assert_eq!(starts.get(case), Some(&1), "job {id}: {case} was recorded before the interruption and ran again");
    }
    let resumed: Vec<_> = records(machine, run_dir).into_iter().map(untimed).collect();
    assert_eq!(resumed.len(), MINI_CASES, "job {id}");
    assert_eq!(resumed, uninterrupted, "job {id}'s records differ from an uninterrupted run's");
}

fn case_ids(machine: &Machine, run_dir: &str) -> Vec<String> {
    records(machine, run_dir).iter().map(|r| r["case_id"].as_str().unwrap().to_string()).collect()
}

/// The daemon is active, under a main pid other than `old` when given (after a boot
/// the pids start over, and the same one is likely); its main pid.
fn wait_daemon_back(machine: &Machine, old: Option<&str>) -> String {
    // Two reads are not one state: between `is-active` and `MainPID` the old daemon can
    // be going (MainPID 0, which differs from the old pid too). So a new, non-zero pid,
    // active, and still the same pid after.
    let mut pid = String::new();
    machine.wait_for("the daemon active again", 120, || {
        pid = machine.user_prop(DAEMON, "MainPID");
        pid != "0"
            && old.is_none_or(|old| pid != old)
            && machine.user_ctl(&["is-active", DAEMON]).stdout.trim() == "active"
            && machine.user_prop(DAEMON, "MainPID") == pid
    });
    pid
}

fn journal(machine: &Machine) -> String {
    machine.user(&["journalctl", "--user", "-u", DAEMON, "--no-pager", "-o", "cat"]).ok().stdout
}

/// `HH:MM:SS` UTC `seconds` from now. The machine's clock is the host's (one kernel) and
/// its time zone UTC; this works while it is off, too.
fn clock_in(seconds: i64) -> String {
    let out = std::process::Command::new("date").args(["-u", "-d", &format!("{seconds:+} sec"), "+%T"]).output();
    String::from_utf8(out.unwrap().stdout).unwrap().trim().to_string()
}

/// The timer's drop-in: the nightly schedule replaced by one time today, exactly.
fn timer_dropin(at: &str) -> String {
    format!("[Timer]\nOnCalendar=\nOnCalendar=*-*-* {at}\nRandomizedDelaySec=0\nAccuracySec=1s\n")
}

#[test]
fn an_unattended_night_under_a_real_systemd() {
    let deb = deb();
    let machine = Machine::boot();
    let file = deb.file_name().unwrap().to_str().unwrap().to_string();
    // Not /tmp: `docker cp` writes beneath the tmpfs mounted there.
    let local = format!("/var/tmp/{file}");
    machine.copy_in(&deb, &local);
    machine.root(&["apt-get", "install", "-y", "-q", "--no-install-recommends", &local]).ok();

    // As anna: a bench root, the venv (from PyPI, through the shared pip cache), the
    // config, two simulated versions — `slow` takes a second a call, so a job of it can
    // be caught mid-run, `quick` none — and `voll` shrunk to the mini plan, so the
    // packaged timer queues something quick.
    machine.user(&["pruefstand", "init"]).ok();
    machine.user(&["pruefstand", "setup"]).ok();
    machine.write(&format!("{ROOT}/pruefstand.toml"), CONFIG);
    machine.write(&format!("{ROOT}/versions/slow.toml"), &slow_version(1000));
    machine.write(&format!("{ROOT}/versions/quick.toml"), &slow_version(0));
    machine.write(&format!("{ROOT}/profiles/mini.toml"), MINI_PLAN);
    machine.write(&format!("{ROOT}/profiles/voll.toml"), &MINI_PLAN.replace("name = \"mini\"", "name = \"voll\""));

    // The chat endpoint: a user unit of its own, on a port free now, in the daemon's
    // environment file.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let bodies = format!("{HOME}/chat.jsonl");
    machine.write(&format!("{HOME}/receiver.py"), RECEIVER);
    machine.write(
        &format!("{HOME}/.config/systemd/user/chat-receiver.service"),
        &format!(
            "[Service]\nExecStart=/usr/bin/python3 %h/receiver.py {port} {bodies}\n[Install]\nWantedBy=default.target\n"
        ),
    );
    machine.write(
        &format!("{HOME}/.config/pruefstand/env"),
        &format!("PRUEFSTAND_HOOK_URL=http://127.0.0.1:{port}/hook\n"),
    );
    machine.user(&["chmod", "600", &format!("{HOME}/.config/pruefstand/env")]).ok();

    // 1. The daemon unit, as docs/jetson.md says, with a short watchdog and restart delay.
    machine.write(
        &format!("{HOME}/.config/systemd/user/{DAEMON}.d/test.conf"),
        "[Service]\nWatchdogSec=3\nRestartSec=1\n",
    );
    machine.user_ctl(&["daemon-reload"]).ok();
    machine.user_ctl(&["enable", "--now", "chat-receiver.service"]).ok();
    machine.user_ctl(&["enable", "--now", DAEMON]).ok();
    // Type=notify: `start` returned only once the daemon sent READY=1.
    assert_eq!(machine.user_ctl(&["is-active", DAEMON]).stdout.trim(), "active");
    for (property, value) in [("Type", "notify"), ("NotifyAccess", "main"), ("WatchdogUSec", "3s"), ("NRestarts", "0")]
    {
        assert_eq!(machine.user_prop(DAEMON, property), value, "{property}");
    }
    let pid = machine.user_prop(DAEMON, "MainPID");
    let locked = machine.read(&format!("{ROOT}/.pruefstand/daemon.lock"));
    assert_eq!(locked.trim(), pid, "systemd's main pid is the daemon holding the root");
    assert_eq!(machine.user_prop(DAEMON, "StatusText"), "idle: the queue is empty", "STATUS= reaches systemd");
    machine.wait_for("the start line in the user journal", 30, || {
        journal(&machine).contains(&format!("daemon ready for {ROOT} (pid {pid})"))
    });
    // The watchdog: systemd records each ping; the idle daemon wakes for them alone.
    let pinged = machine.user_prop(DAEMON, "WatchdogTimestampMonotonic");
    machine
        .wait_for("a second watchdog ping", 10, || machine.user_prop(DAEMON, "WatchdogTimestampMonotonic") != pinged);
    // A hung daemon: stopped, it pings no more; the watchdog aborts it, and it restarts.
    machine.user(&["kill", "-STOP", &pid]).ok();
    let pid = wait_daemon_back(&machine, Some(&pid));
    assert_eq!(machine.user_prop(DAEMON, "NRestarts"), "1");
    assert!(journal(&machine).contains("Watchdog timeout"), "{}", journal(&machine));

    // 3. Busy units, one of the system's and one of anna's, both active.
    machine
        .root(&[
            "sh",
            "-c",
            "printf '[Service]\\nExecStart=/bin/sleep infinity\\n' > /etc/systemd/system/ollama.service",
        ])
        .ok();
    machine.root(&["systemctl", "daemon-reload"]).ok();
    machine.root(&["systemctl", "start", "ollama.service"]).ok();
    machine
        .write(&format!("{HOME}/.config/systemd/user/training@.service"), "[Service]\nExecStart=/bin/sleep infinity\n");
    machine.user_ctl(&["daemon-reload"]).ok();
    machine.user_ctl(&["start", "training@night.service"]).ok();

    // 2. The packaged timer, due in a few seconds (time enough to start it on a loaded
    // machine: a time passed before the timer starts would wait for tomorrow).
    let at = clock_in(12);
    machine.write(&format!("{HOME}/.config/systemd/user/pruefstand-voll@.timer.d/soon.conf"), &timer_dropin(&at));
    machine.user_ctl(&["daemon-reload"]).ok();
    machine.user_ctl(&["enable", "--now", TIMER]).ok();
    let timers = machine.user_ctl(&["list-timers", "pruefstand-*"]).ok().stdout;
    assert!(timers.contains(&at) && timers.contains(TIMER), "the next elapse is {at}:\n{timers}");
    machine.wait_for("the timer to queue job 1", 60, || has_job(&machine, 1));
    let queued = job(&machine, 1);
    assert_eq!((queued["version"].as_str(), queued["plan"].as_str()), (Some("quick"), Some("voll")), "{queued}");
    let tomorrow = machine.user(&["date", "-d", "tomorrow", "+%F"]).ok().stdout.trim().to_string();
    let timers = machine.user_ctl(&["list-timers", "pruefstand-*"]).ok().stdout;
    assert!(timers.contains(&format!("{tomorrow} {at}")), "next elapse tomorrow:\n{timers}");

    // The busy units hold job 1, and `status` names both.
    let status = |machine: &Machine| pruefstand(machine, &["status"]).ok().stdout;
    machine.wait_for("status naming both busy units", 30, || {
        let s = status(&machine);
        s.contains("busy unit ollama.service active (system bus)")
            && s.contains("busy unit training@night.service active (user bus)")
    });
    assert!(machine.user_prop(DAEMON, "StatusText").contains("training@night.service"));
    assert_eq!(job(&machine, 1)["state"], "pending");
    machine.root(&["systemctl", "stop", "ollama.service"]).ok();
    machine.wait_for("status naming the user unit alone", 30, || {
        let s = status(&machine);
        s.contains("training@night.service") && !s.contains("ollama.service")
    });
    assert_eq!(job(&machine, 1)["state"], "pending", "one busy unit left still holds the job");
    machine.user_ctl(&["stop", "training@night.service"]).ok();
    machine.wait_for("job 1 to start once both units stopped", 30, || job(&machine, 1)["state"] != "pending");

    // 4. Its verdict in the chat.
    let done = wait_job(&machine, 1, "done", 300);
    machine.wait_for("the verdict at the webhook", 30, || machine.user(&["test", "-s", &bodies]).code == Some(0));
    let posted: serde_json::Value = serde_json::from_str(machine.read(&bodies).lines().next().unwrap()).unwrap();
    assert_eq!(
        (posted["job"].as_u64(), posted["version"].as_str(), posted["plan"].as_str()),
        (Some(1), Some("quick"), Some("voll")),
        "{posted}"
    );
    assert_eq!(posted["verdict"], done["verdict"], "{posted}");

    // A busy unit that starts while a job runs: the job runs on (it cannot be undone)
    // but its judgement is invalid, R1 naming the unit.
    let id = start(&machine, "slow", "mini");
    wait_mid_run(&machine, id, 1);
    machine.user_ctl(&["start", "training@night.service"]).ok();
    let disturbed = wait_job(&machine, id, "done", 300);
    machine.user_ctl(&["stop", "training@night.service"]).ok();
    assert_eq!(disturbed["verdict"], "invalid", "{disturbed}");
    let run_dir = disturbed["run_dir"].as_str().unwrap();
    let judgement: serde_json::Value =
        serde_json::from_str(&machine.read(&format!("{run_dir}/judgement.json"))).unwrap();
    let r1 = judgement["rules"].as_array().unwrap().iter().find(|r| r["id"] == "R1").unwrap();
    assert_eq!(r1["status"], "fail", "{r1}");
    assert!(r1.to_string().contains("busy unit training@night.service active (user bus)"), "{r1}");

    // What every interrupted job below must end with: an uninterrupted run's records
    // (the simulated model is seeded; only the clocks differ).
    let single = format!("{HOME}/single");
    // (No reference version: inconclusive, exit 11, as every job below.)
    let run = pruefstand(&machine, &["run", "slow", "--plan", "mini", "--out", &single]);
    assert!(run.stdout.contains("verdict: "), "{}\n{}", run.stdout, run.stderr);
    let uninterrupted: Vec<_> = records(&machine, &single).into_iter().map(untimed).collect();

    // 5. kill -9 mid-job: Restart=on-failure brings the daemon back, the job resumes.
    let id = start(&machine, "slow", "mini");
    let run_dir = wait_mid_run(&machine, id, 2);
    let before = case_ids(&machine, &run_dir);
    machine.user(&["kill", "-KILL", &pid]).ok();
    wait_daemon_back(&machine, Some(&pid));
    assert_eq!(machine.user_prop(DAEMON, "NRestarts"), "2");
    let resumed = wait_job(&machine, id, "done", 300);
    assert_eq!(resumed["attempt"], 2, "the crash used up one attempt: {resumed}");
    assert_resumed_whole(&machine, id, &run_dir, &before, &uninterrupted);

    // 6. A reboot mid-job, the machine off past the timer's next time today.
    let id = start(&machine, "slow", "mini");
    let run_dir = wait_mid_run(&machine, id, 2);
    let before = case_ids(&machine, &run_dir);
    machine.docker(&["stop", "-t", "120"]);
    // While it is off: a time between the timer's last run and the boot.
    let dropin = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(dropin.path(), timer_dropin(&clock_in(0))).unwrap();
    // `docker cp` keeps the mode: the user manager must be able to read it.
    std::fs::set_permissions(dropin.path(), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    machine.copy_in(dropin.path(), &format!("{HOME}/.config/systemd/user/pruefstand-voll@.timer.d/soon.conf"));
    std::thread::sleep(std::time::Duration::from_secs(2));
    machine.docker(&["start"]);
    machine.wait_running();
    wait_daemon_back(&machine, None);
    let interrupted = wait_job(&machine, id, "done", 300);
    assert_eq!(interrupted["attempt"], 1, "a shutdown stops the job cleanly, giving its attempt back: {interrupted}");
    assert_resumed_whole(&machine, id, &run_dir, &before, &uninterrupted);
    let missed_job = id + 1;
    if !machine.wait_until(60, || has_job(&machine, missed_job)) {
        let timers = machine.user_ctl(&["list-timers", "--all"]).stdout;
        panic!("the missed timer queued nothing at boot:\n{timers}\n{}", machine.user_ctl(&["cat", TIMER]).stdout);
    }
    assert_eq!(job(&machine, missed_job)["plan"], "voll");
    wait_job(&machine, missed_job, "done", 300);

    // 7. A power cut mid-job.
    let id = start(&machine, "slow", "mini");
    let run_dir = wait_mid_run(&machine, id, 2);
    let before = case_ids(&machine, &run_dir);
    machine.docker(&["kill"]);
    machine.docker(&["start"]);
    machine.wait_running();
    wait_daemon_back(&machine, None);
    let resumed = wait_job(&machine, id, "done", 300);
    assert_eq!(resumed["attempt"], 2, "a power cut counts as a crash: {resumed}");
    assert_resumed_whole(&machine, id, &run_dir, &before, &uninterrupted);
    for earlier in 1..=id {
        assert_eq!(job(&machine, earlier)["state"], "done", "job {earlier}");
    }
    let queue = pruefstand(&machine, &["queue"]).ok().stdout;
    assert_eq!(queue.matches(" done").count() as u64, id, "{queue}");
    // Every verdict reached the chat once, across the restarts and boots.
    let chatted = || -> Vec<u64> {
        let mut jobs: Vec<u64> = machine
            .read(&bodies)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["job"].as_u64().unwrap())
            .collect();
        jobs.sort();
        jobs
    };
    machine.wait_for("every verdict in the chat", 30, || chatted().len() as u64 >= id);
    assert_eq!(chatted(), (1..=id).collect::<Vec<_>>());

    // 8. Removal with the daemon and the busy units running.
    machine.root(&["systemctl", "start", "ollama.service"]).ok();
    machine.user_ctl(&["start", "training@night.service"]).ok();
    machine.wait_for("the daemon idle", 30, || machine.user_prop(DAEMON, "StatusText") == "idle: the queue is empty");
    let bench = machine.snapshot(ROOT);
    machine.root(&["apt-get", "remove", "-y", "-q", "pruefstand"]).ok();
    machine.root(&["test", "!", "-e", "/usr/bin/pruefstand"]).ok();
    assert_eq!(machine.root(&["systemctl", "is-active", "ollama.service"]).stdout.trim(), "active");
    for unit in ["training@night.service", "chat-receiver.service", DAEMON] {
        assert_eq!(machine.user_ctl(&["is-active", unit]).stdout.trim(), "active", "{unit} after apt-get remove");
    }
    assert_eq!(machine.snapshot(ROOT), bench, "apt-get remove changed the bench root");
    // The units keep running from the removed files until anna stops them, as
    // docs/jetson.md tells her to; the dangling enablement goes with `disable`.
    machine.user_ctl(&["disable", "--now", DAEMON, TIMER]).ok();
    assert_ne!(machine.user_ctl(&["is-active", DAEMON]).stdout.trim(), "active");
    assert_eq!(machine.user_ctl(&["is-active", "training@night.service"]).stdout.trim(), "active");
    machine.user(&["test", "!", "-e", &format!("{HOME}/.config/systemd/user/default.target.wants/{DAEMON}")]).ok();
}
