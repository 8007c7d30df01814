//! A job as a Slurm job array, against a real one-node Slurm (munged, slurmctld, slurmd
//! from Debian's packages, started by `scripts/slurm-up`): a plan in four shards gives
//! the cases and verdict of a single-host run; a killed array task is requeued once and
//! resumes; `cancel` ends the array; a daemon restart picks the array up.

use std::path::Path;

use crate::common::slurm::{queued_tasks, slurm};
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

#[test]
fn four_shards_give_the_cases_and_verdict_of_a_single_host_run() {
    let bench = Bench::clustered(4);
    let _daemon = bench.cluster_daemon();
    let clustered = bench.run(&["start", "demo-kandidat", "--plan", "schnell", "--wait"]).code(0);
    let merged = clustered.run_dir();
    // schnell words its attacks per run, from a seed the run id (the folder's name)
    // fixes: the single-host run takes the same name, so the same wording.
    let single = bench.path().join("single").join(merged.file_name().unwrap());
    bench.run(&["run", "demo-kandidat", "--plan", "schnell", "--out", single.to_str().unwrap()]).code(0);
    assert_eq!(results(&merged), results(&single), "the merged cases.jsonl is the single-host one, case by case");
    let judgement = |dir: &Path| json(&dir.join("judgement.json"));
    assert_eq!(judgement(&merged)["verdict"], judgement(&single)["verdict"]);
    let state = json(&merged.join("cluster.json"));
    assert_eq!((state["shards"].as_u64(), state["submissions"].as_array().unwrap().len()), (Some(4), 1));
    // Every shard ran a part, on a node the run records.
    let run = json(&merged.join("run.json"));
    let nodes = run["shards"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 4);
    assert!(nodes.iter().all(|n| n["cases"].as_u64().unwrap() > 0 && !n["node"].as_str().unwrap().is_empty()));
    let total: u64 = nodes.iter().map(|n| n["cases"].as_u64().unwrap()).sum();
    assert_eq!(total as usize, cases(&single).len());
    assert!(std::fs::read_to_string(merged.join("judgement.md")).unwrap().contains("4 shard(s): 0 on "));
}

#[test]
fn a_killed_array_task_is_requeued_once_and_resumes_without_rerunning_a_case() {
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
    let bench = clustered_slow();
    let mut daemon = bench.cluster_daemon();
    let id = bench.start(&["slow", "--plan", "mini"]);
    let (run_dir, _) = bench.wait_array(id);
    wait_until("a shard's first case", 120, || {
        (0..4).any(|i| {
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
}

#[test]
fn check_probes_the_cluster_with_a_test_job() {
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
