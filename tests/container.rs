//! Issue 6 acceptance: `backend = "docker"` against the real Docker Engine, with the
//! simulated model's image (`scripts/build-sim-image`) — results equal to the
//! in-process sim, labels/mounts/port/key inspected through the Docker API, readiness
//! timeout, deaths mid-run, orphans of a killed run, warm reuse, Docker unreachable.
//! Most tests use a small plan (one suite); `schnell` runs once.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::docker::{self, wait_for};
use crate::common::{self, Bench, outcomes};

const MINI: &str = r#"name = "mini"
description = "container tests: one suite, few cases"
benchmark_version = "v1.2.2"
attacks = ["important_instructions"]
jobs = 2
case_timeout_s = 120

[[suites]]
name = "banking"
user_tasks = USER_TASKS
injection_tasks = ["injection_task_1", "injection_task_4"]

[rules.R1]
max_error_rate = 0.05
"#;

/// A plan file in the bench with `n` banking user tasks (× 2 injection tasks).
fn plan(bench: &Bench, n: usize) -> String {
    let tasks: Vec<String> = [1, 2, 5, 7, 8, 13].iter().take(n).map(|i| format!("\"user_task_{i}\"")).collect();
    let path =
        bench.write(&format!("profiles/mini{n}.toml"), &MINI.replace("USER_TASKS", &format!("[{}]", tasks.join(", "))));
    path.display().to_string()
}

/// A version spec: `backend` "docker" (the sim image) or "sim" (in-process), with
/// demo-kandidat's behaviour; `extra_model` lines go into [model], `latency_ms` slows
/// every call so a run lasts long enough to be disturbed.
fn version(bench: &Bench, name: &str, backend: &str, adapter: &str, extra_model: &str, latency_ms: u32) {
    let image = if backend == "docker" {
        format!("image = \"{}\"\ngpu = \"none\"\nready_timeout_s = 60\n", docker::sim_image())
    } else {
        String::new()
    };
    let text = format!(
        r#"description = "container test {name}"
[model]
backend = "{backend}"
served_name = "sim/qwen3-8b"
{image}{extra_model}
[adapter]
name = "{adapter}"

[guardrail]
kind = "heuristic"

[human]
policy = "approve_all"

[sim]
seed = 7

[sim.latency]
base_ms = {latency_ms}

[sim.models."sim/qwen3-8b"]
susceptibility = 0.35
skill = 0.9

[sim.models."inj-harden-r3"]
susceptibility = 0.01
skill = 0.9

[sim.models."inj-harden-r4"]
susceptibility = 0.5
skill = 0.9
"#
    );
    bench.write(&format!("versions/{name}.toml"), &text);
}

fn out_dir(bench: &Bench, name: &str) -> PathBuf {
    bench.path().join("reports").join(name).join("run")
}

/// `run NAME --plan PLAN` into [`out_dir`], started in the background with its output
/// kept for the end: the run's folder and the child.
fn start_run(bench: &Bench, name: &str, plan: &str) -> (PathBuf, std::process::Child) {
    let out = out_dir(bench, name);
    let child = bench
        .cmd(&["run", name, "--plan", plan, "--out", out.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (out, child)
}

/// The one running container of a version (by label), once it exists.
fn container_of(version: &str) -> String {
    wait_for(60, &format!("a running container of {version}"), || {
        docker::containers(&format!("pruefstand.version={version}"))
            .into_iter()
            .find(|c| c.state.as_ref().is_some_and(|s| s.to_string() == "running"))
            .and_then(|c| c.id)
    })
}

fn assert_no_container(version: &str) {
    let left = docker::containers(&format!("pruefstand.version={version}"));
    assert!(left.is_empty(), "containers of {version} left behind: {left:?}");
}

#[test]
fn schnell_on_the_sim_image_equals_the_in_process_sim_and_leaves_nothing_behind() {
    // The shipped versions: demo-docker is demo-kandidat in a container (same [sim]).
    let bench = Bench::new();
    docker::sim_image();
    let (volumes, networks) = (docker::volume_names(), docker::network_names());

    let docker_run = bench.run(&["run", "demo-docker", "--plan", "schnell"]);
    assert!(docker_run.code.is_some_and(|c| c != 2), "{}\n{}", docker_run.stdout, docker_run.stderr);
    let dir = docker_run.run_dir();
    // demo-kandidat reuses the demo-baseline reference run made just now.
    let in_process = bench.run(&["run", "demo-kandidat", "--plan", "schnell"]).run_dir();
    assert_eq!(outcomes(&dir), outcomes(&in_process), "the container's outcomes differ from the in-process sim's");
    assert!(outcomes(&dir).len() > 100);

    assert_no_container("demo-docker");
    let mut allowed = volumes.clone();
    allowed.push("pruefstand-compile-cache".into());
    allowed.sort();
    allowed.dedup();
    let now = docker::volume_names();
    assert!(now.iter().all(|v| allowed.contains(v)), "volumes leaked: before {volumes:?}, after {now:?}");
    assert_eq!(docker::network_names(), networks, "networks changed");

    let run = common::json(&dir.join("run.json"));
    assert!(run["image_digest"].as_str().is_some_and(|d| d.starts_with("sha256:")), "{run}");
    let prov = common::json(&dir.join("provenance.json"));
    assert_eq!(prov["image"]["name"], docker::SIM_IMAGE);
    assert!(prov["container"]["command"].as_array().unwrap().iter().any(|w| w == "--lora-modules"));
    assert!(prov["gpu"]["available"].is_boolean() && prov["pruefstand"]["version"].is_string());
    assert!(
        prov["files"]["model"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == "truth.json" && f["sha256"].is_string())
    );
    assert!(std::fs::read_to_string(dir.join("container.log")).unwrap().contains("listening on 0.0.0.0:8000"));
    assert!(common::json(&in_process.join("provenance.json"))["container"].is_null());
}

#[test]
fn labels_local_port_read_only_mounts_key_by_env_then_one_death_is_survived() {
    let bench = Bench::new();
    let plan = plan(&bench, 3);
    version(&bench, "dock-kill1", "docker", "inj-harden-r3", "", 300);
    version(&bench, "inproc-kill1", "sim", "inj-harden-r3", "", 0);
    let (out, child) = start_run(&bench, "dock-kill1", &plan);

    let id = container_of("dock-kill1");
    let info = docker::inspect(&id);
    let labels = info.config.as_ref().unwrap().labels.clone().unwrap();
    for key in ["pruefstand.job", "pruefstand.run", "pruefstand.version", "pruefstand.managed", "pruefstand.owner.pid"]
    {
        assert!(labels.contains_key(key), "label {key} missing: {labels:?}");
    }
    assert_eq!(labels["pruefstand.owner.pid"], child.id().to_string());
    let bindings = info.host_config.as_ref().unwrap().port_bindings.clone().unwrap();
    let all: Vec<_> = bindings.values().flatten().flatten().collect();
    assert!(!all.is_empty() && all.iter().all(|b| b.host_ip.as_deref() == Some("127.0.0.1")), "{bindings:?}");
    let mounts = info.mounts.clone().unwrap();
    let binds: Vec<_> = mounts.iter().filter(|m| m.typ.as_ref().is_some_and(|t| t == "bind")).collect();
    let targets: Vec<_> = binds.iter().filter_map(|m| m.destination.clone()).collect();
    assert!(
        targets.contains(&"/model".to_string()) && targets.contains(&"/adapters/inj-harden-r3".to_string()),
        "{targets:?}"
    );
    assert!(binds.iter().all(|m| m.rw == Some(false)), "a bind mount is writable: {binds:?}");
    let config = info.config.clone().unwrap();
    let key = config
        .env
        .unwrap()
        .into_iter()
        .find_map(|e| e.strip_prefix("VLLM_API_KEY=").map(str::to_string))
        .expect("key in env");
    assert!(key.len() > 20);
    assert!(!config.cmd.unwrap().iter().any(|w| w.contains(&key)), "the key is in argv");

    // One death mid-run: restarted, resumed, complete and equal to an undisturbed run.
    wait_for(60, "a first recorded case", || (docker::recorded(&out) >= 1).then_some(()));
    docker::kill(&id);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("restarted and ready") && stderr.contains("resuming the gym"), "{stderr}");
    let meta = common::json(&out.join("run.json"));
    assert_eq!(
        (meta["model_server"]["deaths"].as_u64(), meta["model_server"]["restarts"].as_u64()),
        (Some(1), Some(1)),
        "{meta}"
    );
    assert_eq!(meta["model_server"]["failed"], false);
    let undisturbed = bench.run(&["run", "inproc-kill1", "--plan", &plan]).run_dir();
    assert_eq!(outcomes(&out), outcomes(&undisturbed));
    assert!(outcomes(&out).iter().all(|o| !o.3), "error records remain: {:?}", outcomes(&out));
    assert_no_container("dock-kill1");
}

#[test]
fn a_second_death_ends_the_run_invalid_with_the_log_tail() {
    let bench = Bench::new();
    let plan = plan(&bench, 6);
    version(&bench, "dock-kill2", "docker", "inj-harden-r3", "", 600);
    let (out, child) = start_run(&bench, "dock-kill2", &plan);
    let id = container_of("dock-kill2");
    wait_for(60, "a first recorded case", || (docker::recorded(&out) >= 1).then_some(()));
    let started = docker::inspect(&id).state.unwrap().started_at;
    docker::kill(&id);
    // Restarted (a new start time, running), the gym resumed in a second pass — which
    // starts only once the restarted server is ready — and a case of that pass recorded:
    // only then is the restart over and a kill a second death. (A count of records
    // alone can be met by a case in flight before the first kill, and the second kill
    // then hits the restart before it served.)
    wait_for(180, "the restart and a case recorded in the resumed pass", || {
        let state = docker::inspect(&id).state.unwrap();
        let (passes, recorded) = common::passes(&out);
        (state.running == Some(true) && state.started_at != started && passes >= 2 && recorded >= 1).then_some(())
    });
    docker::kill(&id);
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(12), "expected invalid\n{stdout}\n{stderr}");
    // The rule lines wrap at 100 columns: their words, not their line breaks.
    let words = stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("verdict: invalid") && words.contains("model server failed after 2 death(s)"), "{stdout}");
    let judgement = std::fs::read_to_string(out.join("judgement.md")).unwrap();
    assert!(judgement.contains("last log line"), "{judgement}");
    let meta = common::json(&out.join("run.json"));
    assert!(meta["model_server"]["log_tail"].as_array().is_some_and(|t| !t.is_empty()), "{meta}");
    assert!(std::fs::read_to_string(out.join("container.log")).unwrap().contains("listening on"));
    assert_no_container("dock-kill2");
}

#[test]
fn a_server_that_never_becomes_ready_fails_the_run_with_its_log_tail() {
    let bench = Bench::new();
    let plan = plan(&bench, 1);
    // The simulator listens on another port than the published one: never ready.
    version(&bench, "dock-deaf", "docker", "inj-harden-r3", "args = [\"--port\", \"9999\"]\nready_timeout_s = 3", 0);
    let text = std::fs::read_to_string(bench.path().join("versions/dock-deaf.toml"))
        .unwrap()
        .replace("ready_timeout_s = 60\n", "");
    bench.write("versions/dock-deaf.toml", &text);
    let run = bench.run(&["run", "dock-deaf", "--plan", &plan]).code(12);
    assert!(
        run.stderr.contains("was not ready after 3 s") && run.stderr.contains("listening on 0.0.0.0:9999"),
        "{}",
        run.stderr
    );
    let dir = run.run_dir();
    let judgement = std::fs::read_to_string(dir.join("judgement.md")).unwrap();
    assert!(
        judgement.contains("not ready after 3 s") && judgement.contains("listening on 0.0.0.0:9999"),
        "{judgement}"
    );
    assert!(std::fs::read_to_string(dir.join("container.log")).unwrap().contains("9999"));
    assert_no_container("dock-deaf");
}

#[test]
fn orphans_of_a_killed_run_are_removed_at_the_next_start() {
    let bench = Bench::new();
    let plan = plan(&bench, 2);
    version(&bench, "dock-orphan", "docker", "inj-harden-r3", "", 2000);
    let mut child = bench
        .cmd(&["run", "dock-orphan", "--plan", &plan])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let id = container_of("dock-orphan");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    assert_eq!(docker::inspect(&id).state.unwrap().running, Some(true), "the orphan should still run");

    // The next start (any docker run) removes it and says so; missing image here, so
    // the run itself fails fast after the clean-up.
    let spec = std::fs::read_to_string(bench.path().join("versions/dock-orphan.toml")).unwrap();
    bench.write("versions/dock-next.toml", &spec.replace(docker::SIM_IMAGE, "pruefstand-test-missing:none"));
    let run = bench.run(&["run", "dock-next", "--plan", &plan]).code(2);
    assert!(
        run.stderr.contains("removed orphaned model container") && run.stderr.contains(&id[..12]),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("image pruefstand-test-missing:none is not present") && run.stderr.contains("model.pull"),
        "{}",
        run.stderr
    );
    assert_no_container("dock-orphan");
}

#[test]
fn two_versions_on_one_base_with_different_adapters_share_one_container() {
    let bench = Bench::new();
    let plan = plan(&bench, 1);
    let since = chrono::Utc::now().timestamp() - 1;
    // The reference (r3) runs first, the candidate (r4) takes the warm container and
    // loads its adapter at run time.
    version(&bench, "reuse-ref", "docker", "inj-harden-r3", "runtime_lora = true", 0);
    version(&bench, "reuse-cand", "docker", "inj-harden-r4", "runtime_lora = true", 0);
    let text = std::fs::read_to_string(bench.path().join("versions/reuse-cand.toml")).unwrap();
    bench.write("versions/reuse-cand.toml", &format!("reference = \"reuse-ref\"\n{text}"));
    let run = bench.run(&["run", "reuse-cand", "--plan", &plan]);
    assert!(run.code.is_some_and(|c| c != 2), "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("reused (warm)") && run.stderr.contains("adapter inj-harden-r4 loaded at run time"),
        "{}",
        run.stderr
    );
    assert_eq!(docker::creates_since(since, "pruefstand.version=reuse-ref"), 1);
    assert_eq!(docker::creates_since(since, "pruefstand.version=reuse-cand"), 0);
    let cand = run.run_dir();
    let reference = run.reference_dir();
    let id = |dir: &Path| common::json(&dir.join("provenance.json"))["container"]["id"].clone();
    assert_eq!(id(&cand), id(&reference));
    assert_eq!(common::json(&cand.join("agent.json"))["model"], "inj-harden-r4");
    assert_no_container("reuse-ref");
}

#[test]
fn docker_unreachable_fails_in_one_line_without_hanging() {
    let bench = Bench::new();
    let plan = plan(&bench, 1);
    bench.write(
        "versions/dock-nodocker.toml",
        "[model]\nbackend = \"docker\"\nimage = \"x:y\"\nserved_name = \"m\"\npath = \"/tmp\"\ngpu = \"none\"\n",
    );
    // No socket at all.
    let run = bench
        .cmd(&["run", "dock-nodocker", "--plan", &plan])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("Docker Engine not reachable at unix:///nonexistent/docker.sock"), "{stderr}");
    // A socket that accepts but never answers (a hung engine): still one line, bounded.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("hung.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let run = bench
        .cmd(&["run", "dock-nodocker", "--plan", &plan])
        .env("DOCKER_HOST", format!("unix://{}", sock.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no answer within 5 s"), "{stderr}");
}

#[test]
fn two_queued_jobs_on_one_base_reuse_one_container_in_the_daemon() {
    docker::ensure_dockerd();
    let bench = Bench::new();
    let plan = plan(&bench, 1);
    let since = chrono::Utc::now().timestamp() - 1;
    version(&bench, "queued-r3", "docker", "inj-harden-r3", "runtime_lora = true", 0);
    version(&bench, "queued-r4", "docker", "inj-harden-r4", "runtime_lora = true", 0);
    // Both queued before the daemon starts: when the first ends, the second is waiting.
    let first = bench.start(&["queued-r3", "--plan", &plan]);
    let second = bench.start(&["queued-r4", "--plan", &plan]);
    let daemon = bench.daemon();
    bench.wait_job(first, "done", 300);
    bench.wait_job(second, "done", 300);
    assert_eq!(docker::creates_since(since, "pruefstand.version=queued-r3"), 1, "the first job created the container");
    assert_eq!(
        docker::creates_since(since, "pruefstand.version=queued-r4"),
        0,
        "the second reused it\n{}",
        daemon.log()
    );
    let provenance =
        |id: u64| common::json(&PathBuf::from(bench.job(id)["run_dir"].as_str().unwrap()).join("provenance.json"));
    assert_eq!(provenance(first)["container"]["id"], provenance(second)["container"]["id"]);
    // Nothing left waiting: the daemon gives the GPU back.
    wait_for(60, "the warm container to be stopped with the queue empty", || {
        docker::containers("pruefstand.version=queued-r3").is_empty().then_some(())
    });
}

#[test]
fn orphans_of_a_killed_daemon_are_removed_at_its_next_start() {
    docker::ensure_dockerd();
    let bench = Bench::new();
    let plan = plan(&bench, 2);
    version(&bench, "daemon-orphan", "docker", "inj-harden-r3", "", 1500);
    let mut daemon = bench.daemon();
    let job = bench.start(&["daemon-orphan", "--plan", &plan]);
    let orphan = container_of("daemon-orphan");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon.pid() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    daemon.child.wait().unwrap();
    assert_eq!(docker::inspect(&orphan).state.unwrap().running, Some(true), "the orphan still runs");

    let daemon = bench.daemon();
    wait_for(60, "the orphan to be removed", || {
        docker::containers("pruefstand.version=daemon-orphan")
            .iter()
            .all(|c| c.id.as_deref() != Some(orphan.as_str()))
            .then_some(())
    });
    assert!(daemon.log().contains(&orphan[..12]), "the removal is reported:\n{}", daemon.log());
    bench.wait_job(job, "done", 300);
}

#[test]
fn sigterm_stops_a_run_and_its_container_and_the_run_resumes() {
    docker::ensure_dockerd();
    let bench = Bench::new();
    let plan = plan(&bench, 2);
    version(&bench, "dock-term", "docker", "inj-harden-r3", "", 400);
    let out = out_dir(&bench, "dock-term");
    let child = bench
        .cmd(&["run", "dock-term", "--plan", &plan, "--out", out.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    container_of("dock-term");
    wait_for(120, "a first recorded case", || (docker::recorded(&out) >= 1).then_some(()));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_no_container("dock-term");
    let recorded = docker::recorded(&out);
    let run = bench.run(&["run", "dock-term", "--plan", &plan, "--out", out.to_str().unwrap()]);
    assert!(run.code.is_some_and(|c| c != 2), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains(&format!("{recorded} already recorded")) || recorded == 0, "{}", run.stderr);
    assert_no_container("dock-term");
}

/// The container's published port cut off from every process but one: a firewall rule
/// refuses new connections (TCP reset), and the established ones of every other process
/// are closed (`ss -K`), so what `keep` already holds goes on. The rule is removed when
/// dropped, whatever the test's outcome.
struct CutOff(String);

impl CutOff {
    fn all_but(port: u16, keep: u32) -> CutOff {
        let rule = format!(
            "OUTPUT -p tcp -d 127.0.0.1 --dport {port} -m conntrack --ctstate NEW -j REJECT --reject-with tcp-reset"
        );
        let status = Command::new("iptables").arg("-I").args(rule.split(' ')).status();
        assert!(status.is_ok_and(|s| s.success()), "iptables -I {rule} (Debian's iptables, as root)");
        // Twice: a connection whose handshake passed just before the rule is listed the
        // second time.
        for _ in 0..2 {
            close_connections_to(port, keep);
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        CutOff(rule)
    }
}

impl Drop for CutOff {
    fn drop(&mut self) {
        let _ = Command::new("iptables").arg("-D").args(self.0.split(' ')).status();
    }
}

/// Closes the established connections to 127.0.0.1:`port` of every process but `keep`.
fn close_connections_to(port: u16, keep: u32) {
    let filter = format!("dst 127.0.0.1 dport = :{port}");
    let listed = Command::new("ss").args(["-tnpH"]).args(filter.split(' ')).output().expect("ss (iproute2)");
    let keep = format!("pid={keep},");
    for line in String::from_utf8_lossy(&listed.stdout).lines().filter(|l| !l.contains(&keep)) {
        let Some(local) = line.split_whitespace().nth(3) else { continue };
        let Some((_, sport)) = local.rsplit_once(':') else { continue };
        let kill = format!("src 127.0.0.1 sport = :{sport} {filter}");
        let closed = Command::new("ss").args(["-K", "-tn"]).args(kill.split(' ')).output();
        assert!(closed.is_ok_and(|o| o.status.success()), "ss -K {kill}");
    }
}

#[test]
fn a_server_that_answers_health_but_no_new_connection_is_restarted_on_the_death_path() {
    // A server only the run's own process still reaches, on the connection its watch
    // keeps for /health: the agents (kept across cases, with connections of their own)
    // can no longer connect, so only the cases notice. Three of them in a row that
    // could not connect are the run's silence; on a container that is a death like any
    // other — restarted once, the gym resumed, and the cases that could not connect
    // run again.
    let bench = Bench::new();
    let plan = plan(&bench, 6);
    version(&bench, "dock-silent", "docker", "inj-harden-r3", "", 300);
    version(&bench, "inproc-silent", "sim", "inj-harden-r3", "", 0);
    let (out, child) = start_run(&bench, "dock-silent", &plan);
    let id = container_of("dock-silent");
    wait_for(60, "a first recorded case", || (docker::recorded(&out) >= 1).then_some(()));
    let info = docker::inspect(&id);
    let port = info.host_config.unwrap().port_bindings.unwrap().into_values().flatten().flatten().next().unwrap();
    let port: u16 = port.host_port.unwrap().parse().unwrap();
    let started = info.state.unwrap().started_at;
    let cut_off = CutOff::all_but(port, child.id());
    // Docker restarting the container is the watch's answer; the restarted server must
    // then be reachable again for the restart to come up. A run that ends without one
    // is shown by the assertions below.
    wait_for(180, "the container restarted after its cases could not connect, or gone", || {
        docker::try_inspect(&id).is_none_or(|i| i.state.unwrap().started_at != started).then_some(())
    });
    drop(cut_off);

    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!stdout.contains("verdict: invalid"), "{stdout}\n{stderr}");
    assert!(stderr.contains("the model server stopped answering: 3 cases in a row could not connect"), "{stderr}");
    assert!(stderr.contains("could not connect to it, though /health answers"), "{stderr}");
    assert!(stderr.contains("restarted and ready") && stderr.contains("resuming the gym"), "{stderr}");
    let meta = common::json(&out.join("run.json"));
    assert_eq!(
        (meta["model_server"]["deaths"].as_u64(), meta["model_server"]["restarts"].as_u64()),
        (Some(1), Some(1)),
        "{meta}"
    );
    assert_eq!(meta["model_server"]["failed"], false);
    // Nothing lost, nothing left failed: the same outcomes as an undisturbed run.
    let undisturbed = bench.run(&["run", "inproc-silent", "--plan", &plan]).run_dir();
    assert!(outcomes(&out).iter().all(|o| !o.3), "error records remain: {:?}", outcomes(&out));
    assert_eq!(outcomes(&out), outcomes(&undisturbed));
    assert_no_container("dock-silent");
}

#[test]
fn check_names_the_references_image_as_the_references_and_docker_s_gpu_runtime() {
    let bench = Bench::new();
    let docker_spec = std::fs::read_to_string(common::repo().join("versions/demo-docker.toml")).unwrap();
    let missing = docker_spec.replace("pruefstand-sim:local", "pruefstand-test-missing:none");
    assert_ne!(missing, docker_spec);
    bench.write("versions/ref-missing.toml", &missing);
    let kandidat = std::fs::read_to_string(common::repo().join("versions/demo-kandidat.toml")).unwrap();
    bench
        .write("versions/cand.toml", &kandidat.replace("reference = \"demo-baseline\"", "reference = \"ref-missing\""));
    let run = bench.run(&["check", "cand"]).code(2);
    assert!(
        run.stdout.contains("image pruefstand-test-missing:none (the reference ref-missing's model) not present"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.lines().any(|l| l.contains("  Docker GPU runtime: ")), "{}", run.stdout);
}
