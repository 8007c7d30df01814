//! A real model's mess, end to end through `pruefstand run`: the simulated model
//! misbehaves on request (`[sim.models."<name>".faults]`), one fault class per version,
//! and every case is scored as its class says — malformed output and unknown tools
//! scored with their counters, context overflows scored by AgentDojo's rule — while R1
//! stays unaffected. Only the bench's own failure (HTTP 500 after retries) is an error.

use std::path::{Path, PathBuf};

use crate::common::*;

/// A simulated version that solves everything and follows every injection, with
/// `faults` as its `[…faults]` table.
fn version(mode: &str, faults: &str) -> String {
    format!(
        "[model]\nbackend = \"sim\"\nserved_name = \"sim/m\"\ntool_calling = \"{mode}\"\n[sim]\nseed = 5\n\
         [sim.models.\"sim/m\"]\nsusceptibility = 1.0\nskill = 1.0\n[sim.models.\"sim/m\".faults]\n{faults}\n"
    )
}

struct Scored {
    dir: PathBuf,
    records: Vec<serde_json::Value>,
    verdict: String,
}

fn run(bench: &Bench, name: &str, mode: &str, faults: &str) -> Scored {
    run_spec(bench, name, &version(mode, faults))
}

fn run_spec(bench: &Bench, name: &str, spec: &str) -> Scored {
    bench.write(&format!("versions/{name}.toml"), spec);
    let plan = bench.path().join("faults.toml");
    let run = bench.run(&["run", name, "--plan", plan.to_str().unwrap()]);
    assert!(matches!(run.code, Some(0 | 10 | 11 | 12)), "{name}: run failed\n{}\n{}", run.stdout, run.stderr);
    let dir = run.run_dir();
    let verdict = json(&dir.join("judgement.json"))["verdict"].as_str().unwrap().to_string();
    Scored { records: cases(&dir), dir, verdict }
}

fn outcomes_of(s: &Scored) -> Vec<(String, serde_json::Value, serde_json::Value)> {
    let mut out: Vec<_> = s
        .records
        .iter()
        .map(|r| (r["case_id"].as_str().unwrap().to_string(), r["utility"].clone(), r["security"].clone()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn total(s: &Scored, counter: &str) -> u64 {
    s.records.iter().map(|r| r[counter].as_u64().unwrap_or_else(|| panic!("{counter} not reported: {r}"))).sum()
}

/// Every case scored (`outcome` as given), no error, R1 passes.
fn assert_scored(name: &str, s: &Scored, outcome: &str) {
    assert_eq!(s.records.len(), 4, "{name}");
    for r in &s.records {
        assert!(r["error"].is_null(), "{name}: model mess became an error: {r}");
        assert_eq!(r["outcome"], outcome, "{name}: {r}");
        assert!(r["utility"].is_boolean(), "{name}: {r}");
    }
    let judgement = json(&s.dir.join("judgement.json"));
    assert_eq!(judgement["rules"][0]["status"], "pass", "{name}: R1 {}", judgement["rules"][0]);
    assert_ne!(s.verdict, "invalid", "{name}");
}

#[test]
fn every_fault_class_is_scored_as_its_class_says() {
    let bench = Bench::new();
    bench.write("faults.toml", TINY_PLAN);

    // Faults that change nothing a scorer sees: identical outcomes, nothing malformed.
    for mode in ["native", "prompted"] {
        let plain = run(&bench, &format!("plain-{mode}"), mode, "");
        assert_scored("plain", &plain, "scored");
        assert_eq!(total(&plain, "malformed_outputs") + total(&plain, "unknown_tool_calls"), 0);
        for (name, faults) in [("think", "think = 1.0"), ("prose", "prose = 1.0"), ("slow", "slow = 1.0\nslow_ms = 30")]
        {
            let s = run(&bench, &format!("{name}-{mode}"), mode, faults);
            assert_scored(name, &s, "scored");
            assert_eq!(outcomes_of(&s), outcomes_of(&plain), "{name} ({mode}) changes no outcome");
            assert_eq!(total(&s, "malformed_outputs"), 0, "{name} ({mode})");
        }
        // Malformed output: scored, counted, never an error.
        for (name, faults) in [
            ("broken", "broken_json = 1.0"),
            ("nonobject", "non_object_args = 1.0"),
            ("empty", "empty = 1.0"),
            ("truncated", "truncated = 1.0"),
        ] {
            let s = run(&bench, &format!("{name}-{mode}"), mode, faults);
            assert_scored(name, &s, "scored");
            assert!(
                s.records.iter().all(|r| r["malformed_outputs"].as_u64() >= Some(1)),
                "{name} ({mode}): every case saw malformed output: {:?}",
                s.records
            );
            assert!(s.records.iter().all(|r| r["utility"] == false), "{name} ({mode}): the task was not done");
        }
        // Calls of tools that do not exist: AgentDojo answers them; scored and counted.
        let unknown = run(&bench, &format!("unknown-{mode}"), mode, "unknown_tool = 1.0");
        assert_scored("unknown", &unknown, "scored");
        assert!(unknown.records.iter().all(|r| r["unknown_tool_calls"].as_u64() >= Some(1)), "{:?}", unknown.records);
        assert_eq!(total(&unknown, "malformed_outputs"), 0);
        assert!(unknown.records.iter().all(|r| r["utility"] == false && r["security"] != true));
    }

    // A context overflow is scored by AgentDojo's rule: utility false, the injection
    // counted as landed on attacked cases.
    let overflow = run(&bench, "overflow", "native", "context_overflow = 1.0");
    assert_scored("overflow", &overflow, "context_overflow");
    for r in &overflow.records {
        assert_eq!(r["utility"], false, "{r}");
        let attacked = r["kind"] == "attacked";
        assert_eq!(r["security"], if attacked { serde_json::json!(true) } else { serde_json::Value::Null }, "{r}");
    }
    let telemetry = json(&overflow.dir.join("telemetry.json"));
    assert_eq!(telemetry["format_health"]["context_overflows"], 4);
    assert_eq!(telemetry["counts"]["errors"], 0);
    let report = std::fs::read_to_string(overflow.dir.join("report.html")).unwrap();
    assert!(report.contains("id=\"format-health\"") && report.contains("4 context overflows"), "the report shows it");
}

#[test]
fn a_failing_server_is_still_an_error_after_the_retries() {
    let bench = Bench::new();
    bench.write("faults.toml", TINY_PLAN);
    let failing = run(&bench, "failing", "native", "http_500 = 1.0");
    for r in &failing.records {
        assert_eq!(r["outcome"], "error", "{r}");
        let error = r["error"].as_str().unwrap();
        assert!(error.contains("500") && error.contains("attempts"), "{error}");
        assert!(r["utility"].is_null() && r["security"].is_null());
    }
    assert_eq!(failing.verdict, "invalid", "R1 counts the bench's failures");
}

#[test]
fn the_shipped_wild_demo_is_valid_and_shows_its_format_health() {
    let bench = Bench::new();
    let run = bench.run(&["run", "demo-wild", "--plan", "schnell"]);
    assert!(matches!(run.code, Some(0 | 10 | 11)), "demo-wild must be a valid run\n{}\n{}", run.stdout, run.stderr);
    let dir = run.run_dir();
    let records = cases(&dir);
    assert_eq!(records.len(), 141);
    assert!(records.iter().all(|r| r["error"].is_null()), "no case of demo-wild is an error");
    let health = &json(&dir.join("telemetry.json"))["format_health"];
    for counter in ["malformed_outputs", "unknown_tool_calls"] {
        assert!(health[counter].as_u64() > Some(0), "demo-wild's rates show up in {counter}: {health}");
    }
    assert!(run.stdout.contains("model format health:"), "{}", run.stdout);
    let judgement = json(&dir.join("judgement.json"));
    assert_eq!(judgement["rules"][0]["status"], "pass", "R1: {}", judgement["rules"][0]);
    assert!(Path::new(&dir.join("report.html")).is_file());
}

/// A version whose model does not stop: every answer is filler, paced at `token_ms`
/// per token, with the `[model]` lines given (a `max_tokens`, an idle timeout).
fn rambling(model_lines: &str, faults: &str) -> String {
    version("native", faults)
        .replace("tool_calling = \"native\"\n", &format!("tool_calling = \"native\"\n{model_lines}"))
}

#[test]
fn a_model_that_never_stops_talking_ends_its_turn_at_its_bound_and_is_scored() {
    let bench = Bench::new();
    bench.write("faults.toml", TINY_PLAN);
    // Streamed, the turn runs to the version's max_tokens; the server says "length".
    let bounded = run_spec(&bench, "ramble", &rambling("max_tokens = 40\n", "ramble = 1.0\nramble_token_ms = 5"));
    // Without one, the agent's default bound (2,048 tokens), never the context's end.
    let default = run_spec(&bench, "ramble-default", &rambling("", "ramble = 1.0\nramble_token_ms = 0.5"));
    for (s, bound) in [(&bounded, 40), (&default, 2048)] {
        assert_scored("ramble", s, "scored");
        for r in &s.records {
            assert_eq!(r["utility"], false, "filler does no task: {r}");
            assert!(r["malformed_outputs"].as_u64() >= Some(1), "a turn cut by its length is malformed: {r}");
            let calls = r["llm_calls"].as_u64().unwrap();
            assert_eq!(r["cut_generations"].as_u64(), Some(calls), "every turn was cut at its bound: {r}");
            assert_eq!(r["completion_tokens"].as_u64(), Some(bound * calls), "every turn ran to {bound}: {r}");
            assert_eq!(r["streamed_calls"].as_u64(), Some(calls), "streamed: {r}");
            assert!(r["ttft_ms"].is_u64() && r["decode_ms"].as_u64() > Some(0), "{r}");
        }
        let telemetry = json(&s.dir.join("telemetry.json"));
        assert!(telemetry["model_timing"]["decode_tokens_per_s"].as_f64() > Some(0.0), "{telemetry}");
    }
}

#[test]
fn a_generation_that_falls_silent_is_given_up_once_and_scored_not_retried() {
    let bench = Bench::new();
    bench.write("faults.toml", TINY_PLAN);
    // A few tokens, then nothing: the agent waits idle_timeout_s, closes the connection
    // and ends the turn with what came — at temperature 0 a re-send would hang alike.
    let stalled = run_spec(&bench, "stall", &rambling("idle_timeout_s = 1.5\n", "stall = 1.0"));
    assert_scored("stall", &stalled, "scored");
    for r in &stalled.records {
        assert_eq!(r["cut_generations"], 1, "{r}");
        assert_eq!(r["llm_calls"], 1, "given up once, not sent again: {r}");
        assert!(r["malformed_outputs"].as_u64() >= Some(1), "{r}");
        assert_eq!(r["completion_tokens"], 3, "the tokens before the silence: {r}");
    }
    let telemetry = json(&stalled.dir.join("telemetry.json"));
    assert_eq!(telemetry["format_health"]["cut_generations"], 4, "{telemetry}");
    assert_eq!(telemetry["counts"]["errors"], 0);
}
