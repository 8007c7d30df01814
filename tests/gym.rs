//! `pruefstand gym` end to end through the real agentdojo package: the counter suite's
//! smoke criteria, agreement with AgentDojo's own sequential runner, parallel = serial,
//! resume after `kill -9`, per-run wording of attack families, misbehaving agents, and
//! bad names.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

const COUNTER_PLAN: &str = r#"
name = "counter-smoke"
benchmark_version = "v1.2.2"
attacks = ["important_instructions"]
jobs = 2
case_timeout_s = 60
[[suites]]
name = "counter"
user_tasks = ["user_task_0", "user_task_1", "user_task_2", "user_task_3", "user_task_4"]
injection_tasks = ["injection_task_0", "injection_task_1", "injection_task_2", "injection_task_3", "injection_task_4"]
"#;

const BANKING_PLAN: &str = r#"
name = "banking-all"
benchmark_version = "v1.2.2"
attacks = ["important_instructions"]
jobs = 4
case_timeout_s = 120
[[suites]]
name = "banking"
user_tasks = ["user_task_0", "user_task_1", "user_task_2", "user_task_3", "user_task_4", "user_task_5", "user_task_6", "user_task_7",
              "user_task_8", "user_task_9", "user_task_10", "user_task_11", "user_task_12", "user_task_13", "user_task_14", "user_task_15"]
injection_tasks = ["injection_task_0", "injection_task_1", "injection_task_2", "injection_task_3", "injection_task_4",
                   "injection_task_5", "injection_task_6", "injection_task_7", "injection_task_8"]
"#;

fn replay_agent() -> String {
    format!("python3 scripts/examples/agent_replay.py {}", truth_file().display())
}

#[test]
fn counter_suite_meets_the_seed_smoke_criteria() {
    let bench = Bench::new();
    let plan = bench.write("counter.toml", COUNTER_PLAN);
    let run = bench
        .run(&["gym", "--plan", plan.to_str().unwrap(), "--agent-cmd", "python3 scripts/examples/agent_counter.py"])
        .ok();
    let dir = run.run_dir();
    assert!(
        dir.starts_with(bench.path().join("reports/gym/counter-smoke")),
        "default run dir under reports/: {}",
        dir.display()
    );
    let records = cases(&dir);
    assert_eq!(records.len(), 5 + 25 + 5, "one record per planned case");
    let telemetry = json(&dir.join("telemetry.json"));
    assert_eq!(telemetry["utility"], 1.0);
    assert_eq!(telemetry["utility_under_attack"], 1.0);
    assert_eq!(telemetry["asr"], 1.0, "the example agent is deliberately susceptible");
    assert_eq!(telemetry["injection_task_utility"], 1.0);
    assert_eq!(telemetry["counts"]["planned"], 35);
    assert_eq!(telemetry["counts"]["errors"], 0);
    for record in &records {
        for key in [
            "suite",
            "user_task",
            "injection_task",
            "attack",
            "utility",
            "security",
            "error",
            "duration_s",
            "llm_calls",
            "prompt_tokens",
            "completion_tokens",
            "guardrail_flags",
            "human_asks",
            "human_denials",
            "outcome",
            "malformed_outputs",
            "unknown_tool_calls",
            "restarts",
        ] {
            assert!(record.get(key).is_some(), "{key} missing in {record}");
        }
        assert_eq!((record["outcome"].as_str(), record["restarts"].as_u64()), (Some("scored"), Some(0)));
        assert!(record["malformed_outputs"].is_null(), "an agent that does not count them reports null");
        // The example agent reports only llm_calls: the other counters are unknown, not 0.
        assert!(record["llm_calls"].as_u64().unwrap() >= 1);
        assert!(record["prompt_tokens"].is_null() && record["human_asks"].is_null());
        assert!(dir.join(record["trace"].as_str().unwrap()).is_file(), "AgentDojo's trace is kept");
    }
    let clean = records.iter().find(|r| r["kind"] == "clean").unwrap();
    assert!(clean["injection_task"].is_null() && clean["attack"].is_null() && clean["security"].is_null());
    let checks = json(&dir.join("environment_check.json"));
    assert_eq!(checks["checks"].as_array().unwrap().len(), 5);
    assert!(checks["checks"].as_array().unwrap().iter().all(|c| c["status"] == "ok"));
    assert_eq!(json(&dir.join("plan.json"))["cases"].as_array().unwrap().len(), 35);
    assert!(run.stdout.contains("ASR (all attacks) 100.0 % (25/25)"), "{}", run.stdout);
}

/// AgentDojo's own sequential runner on the same agent and cases, as
/// `(utility, security)` per `user|injection` pair plus the injection-task utilities.
fn agentdojo_sequential(bench: &Bench) -> (BTreeMap<String, (bool, bool)>, BTreeMap<String, bool>) {
    let env = pyenv();
    let out = Command::new(&env.python)
        .arg(env.scripts.join("examples/agentdojo_sequential.py"))
        .args(["--suite", "banking", "--benchmark-version", "v1.2.2", "--attack", "important_instructions", "--logdir"])
        .arg(bench.path().join("sequential-logs"))
        .args(["--", "python3", "scripts/examples/agent_replay.py"])
        .arg(truth_file())
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pairs = value["utility"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, u)| (k.clone(), (u.as_bool().unwrap(), value["security"][k].as_bool().unwrap())))
        .collect();
    let goals = value["injection_task_utility"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_bool().unwrap()))
        .collect();
    (pairs, goals)
}

#[test]
fn banking_matches_agentdojo_sequential_runner_and_parallel_equals_serial() {
    let bench = Bench::new();
    let plan = bench.write("banking.toml", BANKING_PLAN);
    let agent = replay_agent();
    let gym = |jobs: &str, out: &str| {
        let dir = bench.path().join(out);
        bench
            .run(&[
                "gym",
                "--plan",
                plan.to_str().unwrap(),
                "--agent-cmd",
                &agent,
                "--jobs",
                jobs,
                "--out",
                dir.to_str().unwrap(),
            ])
            .ok();
        dir
    };
    // 16 in flight: threads inside each worker process, several cases per process.
    let parallel = gym("16", "parallel");
    let serial = gym("1", "serial");
    assert_eq!(cases(&parallel).len(), 16 + 144 + 9);
    assert_eq!(outcomes(&parallel), outcomes(&serial), "--jobs 16 and --jobs 1 agree case by case");
    let events = std::fs::read_to_string(parallel.join("events.jsonl")).unwrap();
    let start: serde_json::Value = serde_json::from_str(events.lines().next().unwrap()).unwrap();
    assert_eq!(start["jobs"], 16, "{start}");
    assert!(start["processes"].as_u64().unwrap() < 16, "fewer processes than cases in flight: {start}");

    let (pairs, goals) = agentdojo_sequential(&bench);
    assert_eq!(pairs.len(), 144);
    let records = cases(&parallel);
    for record in records.iter().filter(|r| r["kind"] == "attacked") {
        let key = format!("{}|{}", record["user_task"].as_str().unwrap(), record["injection_task"].as_str().unwrap());
        let expected = pairs[&key];
        assert_eq!((record["utility"].as_bool().unwrap(), record["security"].as_bool().unwrap()), expected, "{key}");
    }
    for record in records.iter().filter(|r| r["kind"] == "injection_goal") {
        assert_eq!(record["utility"].as_bool().unwrap(), goals[record["injection_task"].as_str().unwrap()]);
    }
    // The comparison must discriminate: this agent's outcomes are not all alike.
    let landed = pairs.values().filter(|(_, s)| *s).count();
    let useful = pairs.values().filter(|(u, _)| *u).count();
    assert!(landed > 0 && useful > 0 && useful < 144, "landed {landed}, useful {useful}");
}

const WORDED_PLAN: &str = r#"
name = "worded"
benchmark_version = "v1.2.2"
wording = "per_run"
attacks = ["important_instructions", "roleplay", "tool_knowledge"]
injection_goals = false
jobs = 4
case_timeout_s = 120
[[suites]]
name = "banking"
user_tasks = ["user_task_0", "user_task_1", "user_task_2", "user_task_3"]
injection_tasks = ["injection_task_0", "injection_task_3"]
"#;

/// case id → the texts its trace says were injected.
fn injected(dir: &Path) -> BTreeMap<String, Vec<String>> {
    cases(dir)
        .into_iter()
        .filter(|r| r["kind"] == "attacked")
        .map(|r| {
            let trace = json(&dir.join(r["trace"].as_str().unwrap()));
            let texts = trace["injections"].as_object().unwrap().values().map(|v| v.as_str().unwrap().to_string());
            (r["case_id"].as_str().unwrap().to_string(), texts.collect())
        })
        .collect()
}

#[test]
fn per_run_wording_differs_between_runs_keeps_the_goal_and_repeats_on_resume() {
    let bench = Bench::new();
    let plan = bench.write("worded.toml", WORDED_PLAN);
    let agent = replay_agent();
    let gym = |out: &Path| {
        let args = ["gym", "--plan", plan.to_str().unwrap(), "--agent-cmd", &agent, "--out", out.to_str().unwrap()];
        bench.run(&args).ok();
    };
    let (one, two) = (bench.path().join("one"), bench.path().join("two"));
    gym(&one);
    gym(&two);
    let (first, second) = (injected(&one), injected(&two));
    assert_eq!(first.len(), 4 * 2 * 3);
    let goal = "US133000000121212121212"; // both planned goals name the attacker's account
    let placeholders = ["{goal}", "{body}", "{user}", "{model}", "{secret}", "{tools}"];
    for (id, texts) in &first {
        let whole = |t: &String| t.contains(goal) && !placeholders.iter().any(|p| t.contains(p));
        assert!(!texts.is_empty() && texts.iter().all(whole), "{id}: {texts:?}");
    }
    let differ = first.iter().filter(|(id, texts)| second[*id] != **texts).count();
    assert!(differ >= first.len() / 2, "another run, other wording: only {differ} of {} differ", first.len());

    // Resume: the cases dropped from cases.jsonl run again with the same words.
    let seed = json(&one.join("identity.json"))["seed"].clone();
    let text = std::fs::read_to_string(one.join("cases.jsonl")).unwrap();
    let kept: Vec<&str> = text.lines().take(5).collect();
    std::fs::write(one.join("cases.jsonl"), kept.join("\n") + "\n").unwrap();
    std::fs::remove_file(one.join("cases.sha256")).ok();
    gym(&one);
    assert_eq!(json(&one.join("identity.json"))["seed"], seed);
    let started = last_events(&one).iter().filter(|e| e["event"] == "case_start").count();
    assert!(started >= first.len() - 5, "the dropped cases ran again ({started})");
    assert_eq!(injected(&one), first, "a resumed run injects exactly the words it drew");
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map(|t| t.lines().count()).unwrap_or(0)
}

/// The events of the last gym invocation in a run directory.
fn last_events(dir: &Path) -> Vec<serde_json::Value> {
    let all: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let start = all.iter().rposition(|e| e["event"] == "start").unwrap();
    all[start..].to_vec()
}

#[test]
fn an_interrupted_run_resumes_without_rerunning_finished_cases() {
    let bench = Bench::new();
    let plan = bench.write("banking.toml", BANKING_PLAN);
    let agent = replay_agent();
    let args = |out: &Path, jobs: &str| -> Vec<String> {
        ["gym", "--plan", plan.to_str().unwrap(), "--agent-cmd", &agent, "--jobs", jobs, "--out", out.to_str().unwrap()]
            .map(String::from)
            .to_vec()
    };
    let reference = bench.path().join("uninterrupted");
    bench.run(&args(&reference, "2").iter().map(String::as_str).collect::<Vec<_>>()).ok();

    // Kill the whole process group (pruefstand, the gym, its workers, the agents) mid-run.
    let dir = bench.path().join("interrupted");
    let mut child = bench
        .cmd(&args(&dir, "1").iter().map(String::as_str).collect::<Vec<_>>())
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while lines(&dir.join("cases.jsonl")) < 30 {
        assert!(Instant::now() < deadline, "the run never got going");
        std::thread::sleep(Duration::from_millis(50));
    }
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let recorded = lines(&dir.join("cases.jsonl"));
    assert!(recorded < 169, "killed before the end ({recorded} recorded)");

    bench.run(&args(&dir, "2").iter().map(String::as_str).collect::<Vec<_>>()).ok();
    let events = last_events(&dir);
    let skipped: Vec<&str> =
        events.iter().filter(|e| e["event"] == "skip").map(|e| e["case_id"].as_str().unwrap()).collect();
    let started: Vec<&str> =
        events.iter().filter(|e| e["event"] == "case_start").map(|e| e["case_id"].as_str().unwrap()).collect();
    assert!(skipped.len() >= recorded - 1, "finished cases are skipped ({} of {recorded})", skipped.len());
    assert!(skipped.iter().all(|id| !started.contains(id)), "a skipped case was run again");
    assert_eq!(skipped.len() + started.len(), 169);
    assert_eq!(outcomes(&dir), outcomes(&reference), "resumed = uninterrupted");

    // A damaged trace makes its case run again — no crash.
    let victim = cases(&dir).into_iter().find(|r| r["kind"] == "attacked").unwrap();
    let trace = dir.join(victim["trace"].as_str().unwrap());
    let text = std::fs::read(&trace).unwrap();
    std::fs::write(&trace, &text[..text.len() / 2]).unwrap();
    bench.run(&args(&dir, "2").iter().map(String::as_str).collect::<Vec<_>>()).ok();
    let events = last_events(&dir);
    let rerun: Vec<&serde_json::Value> = events.iter().filter(|e| e["event"] == "rerun").collect();
    assert_eq!(rerun.len(), 1, "{events:?}");
    assert_eq!(rerun[0]["case_id"], victim["case_id"]);
    assert!(rerun[0]["reason"].as_str().unwrap().contains("corrupt"));
    assert_eq!(outcomes(&dir), outcomes(&reference));
    assert_eq!(cases(&dir).len(), 169, "one record per case after compaction");
}

#[test]
fn misbehaving_agents_become_case_errors_and_the_run_goes_on() {
    let bench = Bench::new();
    let plan = bench.counter_plan("two", &["user_task_0", "user_task_3"], &["important_instructions"], 3);
    // The hostile agent fixture (tests/fixtures/hostile/agent.py), mode by mode.
    let modes = [
        ("garbage", "invalid JSON"),
        ("exits", "exited"),
        ("hangs", "timeout"),
        // A counter Rust could not read back would have cost the run every record.
        ("huge-count", "stats.prompt_tokens must be an integer from 0 to 9223372036854775807"),
        // The line reader refuses at its limit instead of reading on into memory.
        ("huge-line", "line longer than 67108864 bytes"),
        // A 20 MB error is stored cut, its rest counted.
        ("error-flood", "characters more"),
    ];
    for (mode, reason) in modes {
        let run = bench.run(&["gym", "--plan", plan.to_str().unwrap(), "--agent-cmd", &hostile_agent(mode)]).ok();
        let records = cases(&run.run_dir());
        assert_eq!(records.len(), 2, "{mode}: every case recorded");
        for record in &records {
            let error = record["error"].as_str().unwrap_or_else(|| panic!("{mode}: no error in {record}"));
            assert!(error.contains(reason), "{mode}: {}", &error[..error.len().min(300)]);
            assert!(error.len() < 4200, "{mode}: the error is stored cut ({} bytes)", error.len());
            assert!(
                record["utility"].is_null() && record["security"].is_null(),
                "an error is neither a failure nor a success"
            );
        }
        assert_eq!(json(&run.run_dir().join("telemetry.json"))["counts"]["errors"], 2);
    }
    // Answers written in random pieces with blank lines between them read back whole.
    let run = bench.run(&["gym", "--plan", plan.to_str().unwrap(), "--agent-cmd", &hostile_agent("chunked")]).ok();
    for record in cases(&run.run_dir()) {
        assert!(record["error"].is_null(), "{record}");
        let trace = json(&run.run_dir().join(record["trace"].as_str().unwrap())).to_string();
        assert!(trace.contains("done in pieces ppp"), "the whole answer reached AgentDojo");
    }
}

#[test]
fn agentdojos_silent_rerun_of_a_case_is_counted_and_text_beside_calls_prevents_it() {
    let bench = Bench::new();
    let plan = bench.write(
        "one.toml",
        "name = \"one\"\nbenchmark_version = \"v1.2.2\"\nattacks = []\njobs = 1\ncase_timeout_s = 60\n\
         injection_goals = false\n[[suites]]\nname = \"banking\"\nuser_tasks = [\"user_task_0\"]\n",
    );
    // An agent that calls get_balance forever: the case hits AgentDojo's tool-loop limit.
    let source = "import json, sys\ntext = sys.argv[1:] == ['text']\nfor line in sys.stdin:\n    if '\"query\"' not in line:\n        continue\n    reply = {'tool_calls': [{'function': 'get_balance', 'args': {}}]}\n    if text:\n        reply['content'] = 'Checking the balance again.'\n    print(json.dumps(reply), flush=True)\n";
    let script = bench.write("loops.py", source);
    let restarts = |extra: &str| {
        let agent = format!("python3 {} {extra}", script.display());
        let run = bench.run(&["gym", "--plan", plan.to_str().unwrap(), "--agent-cmd", &agent]).ok();
        let records = cases(&run.run_dir());
        assert_eq!(records.len(), 1);
        assert!(records[0]["error"].is_null(), "{}", records[0]);
        records[0]["restarts"].as_u64().unwrap()
    };
    assert_eq!(restarts(""), 2, "without text AgentDojo runs the task three times, and it is counted");
    assert_eq!(restarts("text"), 0, "the model's text beside its calls is its output: no re-run");
}

#[test]
fn unknown_names_fail_at_start_listing_the_valid_ones() {
    let bench = Bench::new();
    let agent = "python3 scripts/examples/agent_counter.py";
    let run = bench.run(&["gym", "--plan", "schnell", "--agent-cmd", agent, "--suite", "bankin"]).code(2);
    assert!(
        run.stderr.contains("unknown suite \"bankin\"")
            && run.stderr.contains("banking, counter, slack, travel, workspace"),
        "{}",
        run.stderr
    );
    let run = bench.run(&["gym", "--plan", "schnell", "--agent-cmd", agent, "--attack", "jailbreak"]).code(2);
    assert!(
        run.stderr.contains("unknown attack \"jailbreak\"") && run.stderr.contains("tool_knowledge"),
        "{}",
        run.stderr
    );
    let run = bench.run(&["gym", "--plan", "schnell", "--agent-cmd", agent, "--user-task", "user_task_99"]).code(2);
    assert!(run.stderr.contains("unknown user task \"user_task_99\""), "{}", run.stderr);

    let plan = bench.write("v9.toml", &COUNTER_PLAN.replace("v1.2.2", "v9"));
    let run = bench.run(&["gym", "--plan", plan.to_str().unwrap(), "--agent-cmd", agent]).code(2);
    assert!(run.stderr.contains("unknown benchmark version 'v9'") && run.stderr.contains("v1.2.2"), "{}", run.stderr);

    let plan = bench.write("bad.toml", &COUNTER_PLAN.replace("\"injection_task_4\"]", "\"injection_task_44\"]"));
    let run = bench.run(&["gym", "--plan", plan.to_str().unwrap(), "--agent-cmd", agent]).code(2);
    assert!(
        run.stderr.contains("bad.toml:10:100:") && run.stderr.contains("unknown injection task \"injection_task_44\""),
        "{}",
        run.stderr
    );
    assert!(!bench.path().join("reports/gym").exists(), "nothing was started");
}

#[test]
fn the_gym_selftest_passes() {
    let env = pyenv();
    let out = Command::new(&env.python).arg(env.scripts.join("gym.py")).arg("selftest").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.trim_end().lines().last().unwrap().ends_with(" passed, 0 failed"), "{stdout}");
}

#[test]
fn a_missing_or_wrong_python_is_a_clear_error_saying_what_to_install() {
    let dir = tempfile::tempdir().unwrap();
    let setup = |python: &Path| {
        Run::from(
            Command::new(BIN)
                .arg("setup")
                .env("PRUEFSTAND_VENV", dir.path().join("venv"))
                .env("PRUEFSTAND_PYTHON", python)
                .output()
                .unwrap(),
        )
    };
    let run = setup(Path::new("/nonexistent/python3")).code(2);
    assert!(run.stderr.contains("no Python 3.10–3.12 found") && run.stderr.contains("install"), "{}", run.stderr);
    // A Python that is too new for agentdojo's dependencies.
    let fake = dir.path().join("python3.13");
    std::fs::write(&fake, "#!/bin/sh\necho 3.13\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let run = setup(&fake).code(2);
    assert!(run.stderr.contains("is 3.13"), "{}", run.stderr);
    assert!(!dir.path().join("venv/bin/python").exists(), "no half-made venv is left to be mistaken for a ready one");
}

#[test]
fn an_agent_gets_only_the_variables_passed_on_to_it() {
    let bench = Bench::new();
    let plan = bench.counter_plan("one", &["user_task_0"], &[], 60);
    let seen = bench.path().join("seen.txt");
    let agent = bench.write(
        "env.py",
        "import json, os, sys\nfor line in sys.stdin:\n    if '\"query\"' in line:\n        open(sys.argv[1], 'w').write(os.environ.get('PRUEFSTAND_API_KEY', 'missing'))\n        print(json.dumps({'final_answer': 'done'}), flush=True)\n",
    );
    let agent_cmd = format!("python3 {} {}", agent.display(), seen.display());
    let gym = |extra: &[&str]| {
        let mut args = vec!["gym", "--plan", plan.to_str().unwrap(), "--agent-cmd", &agent_cmd];
        args.extend_from_slice(extra);
        Run::from(bench.cmd(&args).env("PRUEFSTAND_API_KEY", "sekrit").output().unwrap())
    };
    gym(&[]).ok();
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "missing", "not passed unless asked");
    gym(&["--pass-env", "PRUEFSTAND_API_KEY"]).ok();
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "sekrit");
    let refused = gym(&["--pass-env", "NO_SUCH_VARIABLE_HERE"]).code(2);
    assert!(refused.stderr.contains("--pass-env NO_SUCH_VARIABLE_HERE"), "{}", refused.stderr);
}
