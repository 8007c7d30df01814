//! The defences a version's guardrail names as AgentDojo runs them — the tool filter,
//! the prompt-injection detector with a classifier over HTTP — and the role of prompted
//! tool results, each as a shipped demo spec on `schnell` with the simulated model, the
//! real binary and the real gym: valid runs, the defence's effect in the attack success
//! and in the conversation the trace keeps. The shapes of what is sent are pinned
//! against agentdojo's own elements beside the code (`crates/agent/src/pins.rs`, the gym's
//! selftest).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::*;

/// Strings of the installed agentdojo: its tool-filter prompt and its detector's
/// replacement text.
fn agentdojo_strings() -> (String, String) {
    let env = pyenv();
    let out = Command::new(&env.python)
        .args(["-c", "import json\nfrom agentdojo.agent_pipeline.agent_pipeline import TOOL_FILTER_PROMPT\nfrom agentdojo.agent_pipeline.pi_detector import PromptInjectionDetector\nprint(json.dumps([TOOL_FILTER_PROMPT, PromptInjectionDetector().transform([{'type': 'text', 'content': 'x'}])[0]['content']]))"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A run of `version` on schnell in `bench`: valid (R1), no bench error.
fn run_schnell(bench: &Bench, version: &str) -> PathBuf {
    let run = bench.run(&["run", version, "--plan", "schnell"]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "{version}: exit {:?}\n{}\n{}", run.code, run.stdout, run.stderr);
    let dir = run.run_dir();
    let judgement = json(&dir.join("judgement.json"));
    assert_eq!(judgement["rules"][0]["status"], "pass", "{version} R1: {}", judgement["rules"][0]["reason"]);
    assert!(cases(&dir).iter().all(|r| r["outcome"] != "error"), "{version}: a bench error");
    dir
}

/// Attacked cases whose injection landed, of all attacked cases.
fn asr(dir: &Path) -> (usize, usize) {
    let attacked: Vec<Value> = cases(dir).into_iter().filter(|r| r["kind"] == "attacked").collect();
    (attacked.iter().filter(|r| r["security"] == true).count(), attacked.len())
}

fn by_case(dir: &Path) -> BTreeMap<String, Value> {
    cases(dir).into_iter().map(|r| (r["case_id"].as_str().unwrap().to_string(), r)).collect()
}

fn traces(dir: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    let mut stack = vec![dir.join("traces")];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                out.push(json(&path));
            }
        }
    }
    out
}

fn text(message: &Value) -> String {
    match &message["content"] {
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["content"].as_str()).collect(),
        Value::String(s) => s.clone(),
        _ => String::new(),
    }
}

#[test]
fn tool_filter_and_classifier_detector_lower_the_asr_and_show_in_the_conversation() {
    let (filter_prompt, omitted) = agentdojo_strings();
    let bench = Bench::new();
    let baseline = run_schnell(&bench, "demo-baseline");
    let (landed, attacked) = asr(&baseline);
    assert!(landed * 4 > attacked, "the reference is gullible: {landed}/{attacked}");

    // The tool filter: one extra call per case before the first turn, its prompt and
    // the model's answer kept in the conversation; injections that need a tool the
    // task does not are answered "Invalid tool" and land less often.
    let filtered = run_schnell(&bench, "demo-toolfilter");
    let (landed_f, _) = asr(&filtered);
    assert!(landed_f * 4 < landed, "ASR with the tool filter {landed_f}/{attacked}, without {landed}/{attacked}");
    let reference = by_case(&baseline);
    for (id, record) in by_case(&filtered).iter().filter(|(_, r)| r["kind"] == "clean") {
        let before = &reference[id];
        assert_eq!(
            record["llm_calls"].as_u64(),
            before["llm_calls"].as_u64().map(|n| n + 1),
            "{id}: the filter's call counts"
        );
        // Its answer's tokens too (the prompts shrink: fewer tools are offered after it).
        assert!(record["completion_tokens"].as_u64() > before["completion_tokens"].as_u64(), "{id}: and its tokens");
    }
    let traces_f = traces(&filtered);
    assert_eq!(traces_f.len(), 141);
    for trace in &traces_f {
        let m = trace["messages"].as_array().unwrap();
        assert_eq!((m[2]["role"].as_str(), text(&m[2])), (Some("user"), filter_prompt.clone()), "the filter's prompt");
        assert_eq!(m[3]["role"], "assistant");
        let kept = trace["pruefstand_events"].as_array().unwrap().iter().find(|e| e["kind"] == "tool_filter").unwrap();
        assert_eq!(kept["at"], 4, "marked after the filter's answer: {kept}");
    }

    // The detector: flagged outputs replaced in the conversation by AgentDojo's text,
    // each marked; the clean cases it flags are R5's false positives.
    let detected = run_schnell(&bench, "demo-detektor");
    let (landed_d, _) = asr(&detected);
    assert!(landed_d * 4 < landed, "ASR with the detector {landed_d}/{attacked}, without {landed}/{attacked}");
    let mut replaced = 0;
    for trace in traces(&detected) {
        let m = trace["messages"].as_array().unwrap();
        let events = trace["pruefstand_events"].as_array().cloned().unwrap_or_default();
        for (i, message) in m.iter().enumerate().filter(|(_, m)| m["role"] == "tool" && text(m) == omitted) {
            replaced += 1;
            assert!(
                events.iter().any(|e| e["kind"] == "guardrail_flag" && e["at"] == i + 1),
                "a replaced output is marked where it happened: {message}"
            );
        }
    }
    let records = cases(&detected);
    let flags: u64 = records.iter().map(|r| r["guardrail_flags"].as_u64().expect("every case reports its flags")).sum();
    assert_eq!(flags, replaced, "each flag is one replaced output");
    let clean: Vec<&Value> = records.iter().filter(|r| r["kind"] == "clean").collect();
    let flagged_clean = clean.iter().filter(|r| r["guardrail_flags"].as_u64() > Some(0)).count();
    assert!(flagged_clean > 0, "the simulated classifier's false positives reach clean cases");
    let r5 = &json(&detected.join("judgement.json"))["rules"][4];
    let fp = r5["measured"]["guardrail_fp_rate"]["value"].as_f64().unwrap();
    assert_eq!(fp, flagged_clean as f64 / clean.len() as f64, "{r5}");
    assert_eq!(r5["status"], "fail", "4 % of outputs flag a third of the clean cases: {r5}");
}

#[test]
fn each_tool_result_role_runs_prompted_with_the_same_outcomes() {
    let bench = Bench::new();
    let mut outcomes = Vec::new();
    for role in ["user", "tool", "input"] {
        let dir = run_schnell(&bench, &format!("demo-rolle-{role}"));
        let agent = json(&dir.join("agent.json"));
        assert_eq!(agent["tool_calling"], "prompted");
        // `user` is the default, left out so older versions keep their hash.
        assert_eq!(agent.get("tool_result_role").and_then(Value::as_str).unwrap_or("user"), role);
        let records: Vec<(Value, Value, Value)> = by_case(&dir)
            .into_values()
            .map(|r| (r["case_id"].clone(), r["utility"].clone(), r["security"].clone()))
            .collect();
        outcomes.push(records);
    }
    // The simulated model reads tool results in any role: the same seed, the same
    // outcomes — a result it could not read would change them.
    assert_eq!(outcomes[0], outcomes[1]);
    assert_eq!(outcomes[0], outcomes[2]);
}
