//! `pruefstand show`: a run read through the binary, as the bench's Python reads it
//! (docs/reports.md, "A run as JSON"). A small simulated run with the adaptive attacker:
//! the view's verdict, counts and figures agree with what the run itself said and
//! wrote, its records and traces are the run's, showing writes nothing, and a folder
//! that is not a run is refused by name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::common::*;

/// Two banking pairs, one searched and one held out, two attempts: the smallest plan
/// that has an attacker's run of attempts.
const PLAN: &str = r#"
name = "show-mini"
benchmark_version = "v1.2.2"
wording = "per_run"
attacks = ["important_instructions"]
injection_goals = false
jobs = 8
case_timeout_s = 60
[[suites]]
name = "banking"
user_tasks = ["user_task_0", "user_task_3"]
injection_tasks = ["injection_task_0"]
[adaptive]
attempts = 2
"#;

const VERSION: &str = "[model]\nbackend = \"sim\"\nserved_name = \"sim/m\"\ntool_calling = \"native\"\n\
                       [sim]\nseed = 11\n[sim.models.\"sim/m\"]\nsusceptibility = 0.5\n";

/// `pruefstand show ARGS…`: (exit status, stdout, stderr).
fn show(bench: &Bench, args: &[&str]) -> (Option<i32>, String, String) {
    let run = bench.run(&[&["show"], args].concat());
    (run.code, run.stdout, run.stderr)
}

/// The JSON lines of `show … --cases` or `--traces`.
fn lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))).collect()
}

/// Every file under `dir` with its length and modification time: what showing must not
/// change.
fn files(dir: &Path) -> BTreeMap<PathBuf, (u64, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(folder) = todo.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                todo.push(entry.path());
            }
            out.insert(entry.path(), (meta.len(), meta.modified().unwrap()));
        }
    }
    out
}

/// (landed, of) over the records of one kind with an outcome in `field`.
fn hits(records: &[serde_json::Value], kind: &str, field: &str) -> (u64, u64) {
    let scored: Vec<_> = records.iter().filter(|r| r["kind"] == kind && !r[field].is_null()).collect();
    (scored.iter().filter(|r| r[field] == true).count() as u64, scored.len() as u64)
}

#[test]
fn the_view_of_a_run_agrees_with_its_judgement_records_and_search_and_writes_nothing() {
    let bench = Bench::new();
    bench.write("versions/show-sim.toml", VERSION);
    let plan = bench.write("show-mini.toml", PLAN);
    let run = bench.run(&["run", "show-sim", "--plan", plan.to_str().unwrap()]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "run failed\n{}\n{}", run.stdout, run.stderr);
    let dir = run.run_dir();
    let before = files(&dir);
    let word = dir.to_str().unwrap();

    let (code, stdout, stderr) = show(&bench, &[word]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 1, "one object on one line: {stdout}");
    let view: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let judgement = json(&dir.join("judgement.json"));
    assert_eq!(view["view"], 1);
    assert_eq!(view["run_dir"], word);
    // The verdict the run printed and wrote.
    let verdict = view["judgement"]["verdict"].as_str().unwrap();
    assert!(run.stdout.contains(&format!("verdict: {verdict}")), "{verdict}\n{}", run.stdout);
    assert_eq!(view["judgement"]["verdict"], judgement["verdict"]);
    assert_eq!(view["judgement"]["summary"], judgement["summary"]);
    assert!(view["judgement"]["early_stop"].is_null(), "ran in full");
    let meta = json(&dir.join("run.json"));
    for field in ["run_id", "version", "plan", "plan_hash", "started_at"] {
        assert_eq!(view["run"][field], meta[field], "{field}");
    }
    assert_eq!(view["run"]["version"], "show-sim");
    assert_eq!(view["run"]["concurrency"], meta["concurrency"]);
    assert!(view["run"]["concurrency"]["peak_in_flight"].as_u64().unwrap() >= 1);
    assert_eq!(view["plan"]["hash"], json(&dir.join("plan.json"))["hash"]);

    // The counts are the records', and the records are the run's.
    let stored = cases(&dir);
    let planned = json(&dir.join("plan.json"))["cases"].as_array().unwrap().len();
    assert_eq!(view["cases"]["planned"], planned);
    assert_eq!(view["cases"]["recorded"], stored.len());
    assert_eq!(view["cases"]["errors"], stored.iter().filter(|r| !r["error"].is_null()).count());
    assert_eq!(view["cases"]["damaged"], 0);
    let (code, stdout, stderr) = show(&bench, &[word, "--cases"]);
    assert_eq!(code, Some(0), "{stderr}");
    let records = lines(&stdout);
    let by_id = |records: &[serde_json::Value]| -> BTreeMap<String, serde_json::Value> {
        records.iter().map(|r| (r["case_id"].as_str().unwrap().to_string(), r.clone())).collect()
    };
    assert_eq!(by_id(&records), by_id(&stored), "the run's records, field for field");
    // The figures the judge made from them, recomputed from the view's records.
    let figure = |name: &str| (judgement["figures"][name]["x"].as_u64(), judgement["figures"][name]["n"].as_u64());
    let (asr, utility) = (hits(&records, "attacked", "security"), hits(&records, "clean", "utility"));
    assert_eq!((Some(asr.0), Some(asr.1)), figure("asr"));
    assert_eq!((Some(utility.0), Some(utility.1)), figure("utility_clean"));
    assert!(asr.1 > 0 && utility.1 > 0, "the plan has attacked and clean cases");

    // Each case's conversation is its trace file's.
    let (code, stdout, stderr) = show(&bench, &[word, "--traces"]);
    assert_eq!(code, Some(0), "{stderr}");
    let traces = lines(&stdout);
    assert_eq!(traces.len(), stored.len());
    for trace in &traces {
        let record = &by_id(&stored)[trace["case_id"].as_str().unwrap()];
        let file = json(&dir.join(record["trace"].as_str().unwrap()));
        assert_eq!(trace["trace"], file, "{}", trace["case_id"]);
        assert!(!file["messages"].as_array().unwrap().is_empty());
    }

    // The attacker's search: every attempt of adaptive.json, and its run of attempts.
    let log = json(&dir.join("adaptive.json"));
    let adaptive = &view["adaptive"];
    assert_eq!(adaptive["budget"], log["attempts"]);
    assert_eq!(adaptive["proposer"], "grammar");
    for half in ["pairs", "held_out"] {
        let attempts = |pairs: &serde_json::Value| -> Vec<(serde_json::Value, serde_json::Value)> {
            let pairs = pairs.as_array().unwrap().iter();
            pairs
                .flat_map(|p| {
                    p["attempts"].as_array().unwrap().iter().map(|a| (a["case_id"].clone(), a["landed"].clone()))
                })
                .collect()
        };
        assert_eq!(attempts(&adaptive[half]), attempts(&log[half]), "{half}");
        assert!(!attempts(&adaptive[half]).is_empty(), "{half}");
    }
    let (code, stdout, stderr) = show(&bench, &[word, "--adaptive", "--cases"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(by_id(&lines(&stdout)), by_id(&cases(&dir.join("adaptive"))));
    // A version name is its newest finished run.
    let (code, stdout, stderr) = show(&bench, &["show-sim"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&stdout).unwrap()["run"]["run_id"], meta["run_id"]);

    assert_eq!(files(&dir), before, "showing wrote nothing in the run directory");
}

#[test]
fn show_refuses_a_folder_that_is_not_a_run_and_names_it() {
    let bench = Bench::new();
    let not_a_run = bench.write("notes/readme.txt", "no run here").parent().unwrap().to_path_buf();
    let (code, stdout, stderr) = show(&bench, &[not_a_run.to_str().unwrap()]);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains(&format!("{} is not a run directory", not_a_run.display())) && stderr.contains("cases.jsonl"),
        "{stderr}"
    );
    let missing = bench.path().join("gone");
    let (code, _, stderr) = show(&bench, &[missing.to_str().unwrap()]);
    assert_eq!(code, Some(3));
    assert!(stderr.contains(&format!("{}: no such folder", missing.display())), "{stderr}");

    // A run cut short: its one readable record shown, the damaged line named and left
    // out, no facts or judgement yet, and no attacker's run.
    let record = serde_json::json!({
        "case_id": "counter/user_task_0/none/none", "kind": "clean", "suite": "counter",
        "user_task": "user_task_0", "injection_task": null, "attack": null, "utility": true, "security": null,
        "error": null, "duration_s": 1.5, "llm_calls": 2, "prompt_tokens": null, "completion_tokens": null,
        "guardrail_flags": null, "human_asks": null, "human_denials": null
    });
    let cut = bench
        .write("cut/cases.jsonl", &format!("{record}\n{{\"case_id\": \"half a li\n"))
        .parent()
        .unwrap()
        .to_path_buf();
    let word = cut.to_str().unwrap();
    let (code, stdout, stderr) = show(&bench, &[word]);
    assert_eq!(code, Some(0), "{stderr}");
    let view: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(view["cases"], serde_json::json!({"planned": null, "recorded": 1, "errors": 0, "damaged": 1}));
    assert!(view["run"].is_null() && view["judgement"].is_null() && view["adaptive"].is_null(), "{view}");
    let (code, stdout, stderr) = show(&bench, &[word, "--cases"]);
    assert_eq!(code, Some(0), "{stderr}");
    let records = lines(&stdout);
    assert_eq!(records.len(), 1);
    assert_eq!((&records[0]["case_id"], &records[0]["duration_s"]), (&record["case_id"], &record["duration_s"]));
    assert!(stderr.contains(&format!("{}:2", cut.join("cases.jsonl").display())), "the damaged line named: {stderr}");
    let (code, stdout, stderr) = show(&bench, &[word, "--traces"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        lines(&stdout),
        [serde_json::json!({"case_id": record["case_id"], "trace": null, "trace_error": "no trace recorded"})]
    );
    let (code, _, stderr) = show(&bench, &[word, "--adaptive"]);
    assert_eq!(code, Some(3));
    assert!(stderr.contains(&format!("{word}: the run has no adaptive attacker's run")), "{stderr}");
}
