//! A job as a Slurm job array, against a real Slurm cluster of three nodes in
//! containers (`scripts/slurm-up`: ctl, n1, n2, n3, one GPU each as a generic resource;
//! this machine submits as a login node): a plan's shards run on every node and merge
//! into the cases and verdict of a single-host run; a node killed mid-array loses no
//! case and runs none twice; a node whose copy of the adapter differs fails R1 naming
//! it; a killed array task is requeued once and resumes; `cancel` ends the array; a
//! daemon restart picks the array up, also when it died before recording the array.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::slurm::{NODES, docker, queued_tasks, shared_cluster, slurm, whole_cluster};
use crate::common::*;

/// The sim's results per case in file order: everything but the clocks.
fn results(run_dir: &Path) -> Vec<serde_json::Value> {
    cases(run_dir).into_iter().map(untimed).collect()
}

fn clustered_slow() -> Bench {
    let bench = Bench::clustered(4);
    bench.write("profiles/mini.toml", MINI_PLAN);
    bench.write("versions/slow.toml", &slow_version(300));
    bench
}

fn array_of(state: &serde_json::Value, submission: usize) -> u64 {
    state["submissions"][submission]["array"].as_u64().unwrap()
}

/// The node each shard's exit record names, by shard.
fn shard_nodes(run_dir: &Path, shards: usize) -> Vec<String> {
    (0..shards)
        .map(|i| json(&run_dir.join(format!("shards/{i}/exit.json")))["node"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn three_shards_run_on_three_nodes_and_merge_into_the_single_host_run() {
    let _cluster = whole_cluster();
    let bench = Bench::clustered(3);
    let _daemon = bench.cluster_daemon();
    let clustered = bench.run(&["start", "demo-kandidat", "--plan", "schnell", "--wait"]).code(0);
    let merged = clustered.run_dir();
    // schnell words its attacks per run, from a seed the run id (the folder's name)
    // fixes: the single-host run takes the same name, so the same wording.
    let single = bench.path().join("single").join(merged.file_name().unwrap());
    bench.run(&["run", "demo-kandidat", "--plan", "schnell", "--out", single.to_str().unwrap()]).code(0);
    let text = |records: Vec<serde_json::Value>| records.iter().map(|r| r.to_string() + "\n").collect::<String>();
    assert_eq!(
        text(results(&merged)),
        text(results(&single)),
        "the merged cases.jsonl is the single-host one, byte for byte but the clocks"
    );
    let judgement = |dir: &Path| json(&dir.join("judgement.json"));
    assert_eq!(judgement(&merged)["verdict"], judgement(&single)["verdict"]);
    let state = json(&merged.join("cluster.json"));
    assert_eq!((state["shards"].as_u64(), state["submissions"].as_array().unwrap().len()), (Some(3), 1));
    // One GPU per node and per task: the three shards ran on the three nodes, and each
    // shard's exit record and run.json say where.
    let nodes: BTreeSet<String> = shard_nodes(&merged, 3).into_iter().collect();
    assert_eq!(nodes, NODES.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>());
    let run = json(&merged.join("run.json"));
    let listed = run["shards"]["nodes"].as_array().unwrap();
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|n| n["cases"].as_u64().unwrap() > 0 && NODES.contains(&n["node"].as_str().unwrap())));
    let total: u64 = listed.iter().map(|n| n["cases"].as_u64().unwrap()).sum();
    assert_eq!(total as usize, cases(&single).len());
    assert!(std::fs::read_to_string(merged.join("judgement.md")).unwrap().contains("3 shard(s): 0 on n"));
}

/// Starts a node container again when the test that stopped it ends (also on a panic).
struct Revive(String);

impl Drop for Revive {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker").args(["start", &self.0]).output();
    }
}

/// The node `squeue` shows running task `index` of `array` (once it runs).
fn node_of_task(array: u64, index: usize) -> Option<String> {
    slurm("squeue", &["-h", "-r", "-t", "RUNNING", "-o", "%F|%K|%N"]).lines().find_map(|line| {
        let fields: Vec<&str> = line.trim().split('|').collect();
        (fields.len() == 3 && fields[0] == array.to_string() && fields[1] == index.to_string() && !fields[2].is_empty())
            .then(|| fields[2].to_string())
    })
}

#[test]
fn a_node_killed_mid_array_loses_no_case_and_runs_none_twice() {
    let _cluster = whole_cluster();
    let bench = Bench::clustered(3);
    bench.write("profiles/mini.toml", MINI_PLAN);
    bench.write("versions/slow.toml", &slow_version(600));
    let single = bench.run(&["run", "slow", "--plan", "mini"]).run_dir();
    let _daemon = bench.cluster_daemon();
    let id = bench.start(&["slow", "--plan", "mini"]);
    let (run_dir, state) = bench.wait_array(id);
    let array = array_of(&state, 0);
    let shard = run_dir.join("shards/0");
    wait_until("shard 0's first case", 120, || {
        std::fs::read_to_string(shard.join("cases.jsonl")).is_ok_and(|t| t.lines().count() >= 1)
    });
    let mut node = None;
    wait_until("shard 0's node in squeue", 30, || {
        node = node_of_task(array, 0);
        node.is_some()
    });
    let node = node.unwrap();
    let _revive = Revive(node.clone());
    docker(&["kill", &node]);
    let recorded: Vec<String> = outcomes(&shard).into_iter().map(|o| o.0).collect();
    wait_until("Slurm to mark the node down", 60, || {
        slurm("sinfo", &["-h", "-N", "-n", &node, "-o", "%t"]).trim().starts_with("down")
    });

    let job = bench.wait_job(id, "done", 400);
    let exit = json(&shard.join("exit.json"));
    assert_ne!(exit["node"], node.as_str(), "shard 0 ran again on another node than the lost {node}");
    let (starts, skips) = case_starts(&shard);
    for case in &recorded {
        assert_eq!(starts.get(case), Some(&1), "{case} was recorded before the kill and must not start again");
    }
    assert!(skips >= recorded.len(), "the shard resumed past its recorded cases ({skips} skips)");
    assert_eq!(cases(&run_dir).len(), MINI_CASES, "no case lost");
    assert_eq!(results(&run_dir), results(&single), "the resumed shards merge into the single-host run");
    assert_eq!(job["verdict"], json(&single.join("judgement.json"))["verdict"], "{job}");
}

#[test]
fn a_node_whose_copy_of_the_adapter_differs_fails_r1_naming_the_node_and_the_file() {
    let _cluster = whole_cluster();
    let bench = Bench::clustered(3);
    bench.write("profiles/mini.toml", MINI_PLAN);
    // The adapter's folder is each node's own (not on the shared storage): n2's copy
    // of one file differs.
    let folder = "/srv/pruefstand-node/adapter";
    for node in NODES {
        let config = if node == "n2" { "{\"r\": 16}" } else { "{\"r\": 8}" };
        let script = format!("mkdir -p {folder} && printf '%s' '{config}' > {folder}/adapter_config.json");
        docker(&["exec", node, "sh", "-c", &script]);
    }
    let spec = slow_version(50).replace("[sim]", &format!("[adapter]\nname = \"lora\"\npath = \"{folder}\"\n[sim]"));
    bench.write("versions/copied.toml", &spec);
    let _daemon = bench.cluster_daemon();
    let id = bench.start(&["copied", "--plan", "mini"]);
    let job = bench.wait_job(id, "done", 300);
    assert_eq!(job["verdict"], "invalid", "{job}");
    let run_dir = std::path::PathBuf::from(job["run_dir"].as_str().unwrap());
    assert!(shard_nodes(&run_dir, 3).contains(&"n2".to_string()), "a shard ran on n2");
    let judgement = json(&run_dir.join("judgement.json"));
    let r1 = judgement["rules"].as_array().unwrap().iter().find(|r| r["id"] == "R1").unwrap().clone();
    let reason = r1["reason"].as_str().unwrap();
    assert!(reason.contains("adapter files") && reason.contains("on n2"), "{r1}");
    assert!(reason.contains(&format!("in {folder}: adapter_config.json")), "{r1}");
}

#[test]
fn a_killed_array_task_is_requeued_once_and_resumes_without_rerunning_a_case() {
    let _cluster = shared_cluster();
    let bench = clustered_slow();
    let single = bench.run(&["run", "slow", "--plan", "mini"]).run_dir();
    let _daemon = bench.cluster_daemon();
    let id = bench.start(&["slow", "--plan", "mini"]);
    let (run_dir, state) = bench.wait_array(id);
    let shard = run_dir.join("shards/0");
    wait_until("shard 0's first case", 120, || {
        std::fs::read_to_string(shard.join("cases.jsonl")).is_ok_and(|t| t.lines().count() >= 1)
    });
    let array = array_of(&state, 0);
    slurm("scancel", &[&format!("{array}_0")]);
    let recorded: Vec<String> = outcomes(&shard).into_iter().map(|o| o.0).collect();

    let job = bench.wait_job(id, "done", 300);
    let state = json(&run_dir.join("cluster.json"));
    let submissions = state["submissions"].as_array().unwrap();
    assert_eq!(submissions.len(), 2, "shard 0 was submitted again, once: {state}");
    assert_eq!(submissions[1]["indices"], serde_json::json!([0]));
    let (starts, skips) = case_starts(&shard);
    for case in &recorded {
        assert_eq!(starts.get(case), Some(&1), "{case} was recorded before the kill and must not start again");
    }
    assert!(skips >= recorded.len(), "the requeued shard skipped its recorded cases ({skips} skips)");
    assert_eq!(results(&run_dir), results(&single), "the resumed shards merge into the single-host run");
    assert_eq!(job["verdict"], json(&single.join("judgement.json"))["verdict"]);
}

#[test]
fn cancel_ends_the_array() {
    let _cluster = shared_cluster();
    let bench = clustered_slow();
    let _daemon = bench.cluster_daemon();
    let id = bench.start(&["slow", "--plan", "mini"]);
    let (_, state) = bench.wait_array(id);
    let array = array_of(&state, 0);
    wait_until("the array in squeue", 30, || !queued_tasks(array).is_empty());
    // `status` shows the shards as the daemon's last look saw them.
    wait_until("status to show a shard running", 60, || {
        let status = bench.run(&["status"]).stdout;
        status.contains("shards: ") && !status.contains("0 done, 0 running")
    });
    bench.run_on_cluster(&["cancel", &id.to_string()]).ok();
    assert_eq!(bench.job(id)["state"], "cancelled");
    wait_until("the array to leave squeue", 30, || queued_tasks(array).is_empty());
}

#[test]
fn a_daemon_restart_mid_array_picks_the_array_up_instead_of_submitting_again() {
    let _cluster = whole_cluster();
    let bench = Bench::clustered(3);
    bench.write("profiles/mini.toml", MINI_PLAN);
    bench.write("versions/slow.toml", &slow_version(300));
    let mut daemon = bench.cluster_daemon();
    let id = bench.start(&["slow", "--plan", "mini"]);
    let (run_dir, _) = bench.wait_array(id);
    wait_until("a shard's first case", 120, || {
        (0..3).any(|i| {
            std::fs::read_to_string(run_dir.join(format!("shards/{i}/cases.jsonl"))).is_ok_and(|t| !t.is_empty())
        })
    });
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();

    let restarted = bench.cluster_daemon();
    let job = bench.wait_job(id, "done", 300);
    assert_eq!(job["attempt"], 2, "the killed daemon's attempt counts");
    let state = json(&run_dir.join("cluster.json"));
    assert_eq!(state["submissions"].as_array().unwrap().len(), 1, "no second submission: {state}");
    assert!(restarted.log().contains("picking up array"), "{}", restarted.log());
    assert_eq!(cases(&run_dir).len(), MINI_CASES);
    let nodes: BTreeSet<String> = shard_nodes(&run_dir, 3).into_iter().collect();
    assert_eq!(nodes.len(), 3, "the array ran on every node: {nodes:?}");
}

#[test]
fn a_daemon_that_died_before_recording_the_array_id_finds_the_array_by_its_comment() {
    let _cluster = shared_cluster();
    let bench = clustered_slow();
    let mut daemon = bench.cluster_daemon();
    let id = bench.start(&["slow", "--plan", "mini"]);
    let (run_dir, state) = bench.wait_array(id);
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
    let array = array_of(&state, 0);
    let comment = state["comment"].as_str().unwrap().to_string();
    assert!(comment.starts_with(&format!("pruefstand-{id}-")), "{state}");
    // What a daemon killed between sbatch returning and the id's write leaves: the
    // comment chosen before submitting, no submission.
    let mut window = state.clone();
    window["submissions"] = serde_json::json!([]);
    std::fs::write(run_dir.join("cluster.json"), window.to_string()).unwrap();

    let restarted = bench.cluster_daemon();
    bench.wait_job(id, "done", 300);
    let state = json(&run_dir.join("cluster.json"));
    let submissions = state["submissions"].as_array().unwrap();
    assert_eq!(submissions.len(), 1, "no second array: {state}");
    assert_eq!(array_of(&state, 0), array, "the array submitted before the crash: {state}");
    assert!(restarted.log().contains(&format!("picking up array {array}: an earlier start submitted it")));
    assert_eq!(cases(&run_dir).len(), MINI_CASES);
}

#[test]
fn check_probes_the_cluster_with_a_test_job() {
    let _cluster = shared_cluster();
    let bench = Bench::clustered(2);
    let out = bench.run_on_cluster(&["check"]).stdout;
    for line in [
        "OK    sbatch: slurm-wlm",
        "OK    Slurm controller: ",
        "is UP",
        "OK    partition main: ",
        "OK    a test job on ",
    ] {
        assert!(out.contains(line), "{line:?} not in\n{out}");
    }
    // Without the cluster's configuration the controller cannot be found: a FAIL with the fix.
    let lost = Run::from(bench.cmd(&["check"]).env("SLURM_CONF", "/nonexistent/slurm.conf").output().unwrap());
    assert!(lost.stdout.contains("FAIL"), "{}", lost.stdout);
}

#[test]
fn a_shard_that_dies_twice_makes_the_run_invalid_naming_it() {
    let _cluster = shared_cluster();
    let bench = clustered_slow();
    let _daemon = bench.cluster_daemon();
    let id = bench.start(&["slow", "--plan", "mini"]);
    let (run_dir, state) = bench.wait_array(id);
    let first = array_of(&state, 0);
    wait_until("task 0 in squeue", 60, || queued_tasks(first).contains(&format!("{first}_0")));
    slurm("scancel", &[&format!("{first}_0")]);
    let mut again = 0;
    wait_until("shard 0's requeue", 120, || {
        let state = json(&run_dir.join("cluster.json"));
        again = state["submissions"].get(1).and_then(|s| s["array"].as_u64()).unwrap_or(0);
        again != 0
    });
    wait_until("the requeued task in squeue", 60, || queued_tasks(again).contains(&format!("{again}_0")));
    slurm("scancel", &[&format!("{again}_0")]);

    let job = bench.wait_job(id, "done", 300);
    assert_eq!(job["verdict"], "invalid", "{job}");
    let judgement = json(&run_dir.join("judgement.json"));
    let r1 = judgement["rules"].as_array().unwrap().iter().find(|r| r["id"] == "R1").unwrap().clone();
    assert!(r1["reason"].as_str().unwrap().contains("shard 0 failed twice"), "{r1}");
    // The rest of the array is of no use to an invalid run: cancelled.
    wait_until("the arrays to leave squeue", 30, || queued_tasks(first).is_empty() && queued_tasks(again).is_empty());
}

#[test]
fn the_reference_run_r4_needs_runs_on_the_cluster_too() {
    let _cluster = shared_cluster();
    let bench = Bench::clustered(3);
    bench.write("profiles/mini.toml", MINI_PLAN);
    bench.write("versions/base.toml", &slow_version(50));
    bench.write("versions/cand.toml", &format!("reference = \"base\"\n{}", slow_version(50)));
    let daemon = bench.cluster_daemon();
    let id = bench.start(&["cand", "--plan", "mini"]);
    let job = bench.wait_job(id, "done", 300);
    let run_dir = std::path::PathBuf::from(job["run_dir"].as_str().unwrap());
    let run = json(&run_dir.join("run.json"));
    let reference = std::path::PathBuf::from(run["reference_run_dir"].as_str().expect("R4's reference run"));
    assert!(reference.starts_with(bench.path().join("reports/base/mini")), "{}", reference.display());
    // The reference ran as an array of its own, on the cluster's nodes, and was merged
    // and judged as the candidate's run was.
    let state = json(&reference.join("cluster.json"));
    assert_eq!(state["shards"], 3, "{state}");
    assert_ne!(array_of(&state, 0), array_of(&json(&run_dir.join("cluster.json")), 0));
    for node in shard_nodes(&reference, 3) {
        assert!(NODES.contains(&node.as_str()), "{node}");
    }
    assert_eq!(cases(&reference).len(), MINI_CASES);
    assert!(reference.join("judgement.json").is_file());
    let judgement = json(&run_dir.join("judgement.json"));
    let r4 = judgement["rules"].as_array().unwrap().iter().find(|r| r["id"] == "R4").unwrap().clone();
    assert_ne!(r4["status"], "not_applicable", "{r4}");
    assert!(daemon.log().contains("reference: no current run of base"), "{}", daemon.log());
}
