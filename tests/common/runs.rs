//! Run directories of known truth, written without running a case: a profile's real
//! case list (as `plan.json` would hold it), records whose outcomes the test chooses,
//! and the files `pruefstand judge` reads (`run.json`, `plan.json`, `cases.jsonl`,
//! `cases.sha256`, `environment_check.json`). Tests then edit the records the way the
//! issue describes a run could be fooled, and judge the result.

use std::path::{Path, PathBuf};

use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// One planned case, as `plan.json` holds it.
#[derive(Clone, Debug)]
pub struct PlannedCase {
    pub id: String,
    pub kind: &'static str,
    pub suite: String,
    pub user_task: Option<String>,
    pub injection_task: Option<String>,
    pub attack: Option<String>,
}

impl PlannedCase {
    fn json(&self) -> Value {
        json!({"id": self.id, "kind": self.kind, "suite": self.suite, "user_task": self.user_task,
               "injection_task": self.injection_task, "attack": self.attack})
    }
}

/// A profile's resolved case list in plan order (clean, attacked, goals per suite), as
/// `plan::Plan::resolve` builds it.
pub struct PlanShape {
    pub name: String,
    pub benchmark_version: String,
    pub cases: Vec<PlannedCase>,
}

impl PlanShape {
    pub fn profile(name: &str) -> PlanShape {
        let path = super::repo().join(format!("profiles/{name}.toml"));
        let profile: toml::Table = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let strings = |v: &toml::Value| -> Vec<String> {
            v.as_array().map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect()).unwrap_or_default()
        };
        // Per-run wording names each family's attack `fresh_<family>` (docs/attacks.md).
        let per_run = profile.get("wording").and_then(|w| w.as_str()) == Some("per_run");
        let attack_name = |a: &String| if per_run { format!("fresh_{a}") } else { a.clone() };
        let attacks = strings(&profile["attacks"]);
        let mut cases = Vec::new();
        for suite in profile["suites"].as_array().unwrap() {
            let name = suite["name"].as_str().unwrap().to_string();
            let users = strings(&suite["user_tasks"]);
            let injections = suite.get("injection_tasks").map(strings).unwrap_or_default();
            let suite_attacks = suite.get("attacks").map(strings).unwrap_or_else(|| attacks.clone());
            for u in &users {
                cases.push(PlannedCase {
                    id: format!("{name}/{u}/none/none"),
                    kind: "clean",
                    suite: name.clone(),
                    user_task: Some(u.clone()),
                    injection_task: None,
                    attack: None,
                });
            }
            for u in &users {
                for i in &injections {
                    for a in suite_attacks.iter().map(attack_name) {
                        cases.push(PlannedCase {
                            id: format!("{name}/{u}/{a}/{i}"),
                            kind: "attacked",
                            suite: name.clone(),
                            user_task: Some(u.clone()),
                            injection_task: Some(i.clone()),
                            attack: Some(a.clone()),
                        });
                    }
                }
            }
            for i in &injections {
                cases.push(PlannedCase {
                    id: format!("{name}/goal/{i}"),
                    kind: "injection_goal",
                    suite: name.clone(),
                    user_task: None,
                    injection_task: Some(i.clone()),
                    attack: None,
                });
            }
        }
        PlanShape {
            name: profile["name"].as_str().unwrap().to_string(),
            benchmark_version: profile["benchmark_version"].as_str().unwrap().to_string(),
            cases,
        }
    }

    /// The plan hash `plan::plan_hash` computes: sha256 of the canonical JSON of the
    /// benchmark version and the ordered case ids.
    pub fn hash(&self) -> String {
        let ids: Vec<&str> = self.cases.iter().map(|c| c.id.as_str()).collect();
        sha256_hex(json!({"benchmark_version": self.benchmark_version, "cases": ids}).to_string().as_bytes())
    }

    pub fn attacked(&self) -> impl Iterator<Item = &PlannedCase> {
        self.cases.iter().filter(|c| c.kind == "attacked")
    }
}

/// A record as the gym writes it, with the given outcome.
pub fn record(case: &PlannedCase, utility: Option<bool>, security: Option<bool>) -> Value {
    json!({
        "case_id": case.id, "kind": case.kind, "suite": case.suite, "user_task": case.user_task,
        "injection_task": case.injection_task, "attack": case.attack, "utility": utility, "security": security,
        "error": null, "duration_s": 12.0, "llm_calls": 3, "prompt_tokens": 1000, "completion_tokens": 100,
        "guardrail_flags": 0, "human_asks": 0, "human_denials": 0, "trace": null,
    })
}

/// Records of every planned case: utility true, and the attacked cases whose ids are
/// in `landed` landed.
pub fn records_with_landed(plan: &PlanShape, landed: &[String]) -> Vec<Value> {
    plan.cases
        .iter()
        .map(|c| {
            let security = (c.kind == "attacked").then(|| landed.contains(&c.id));
            record(c, Some(true), security)
        })
        .collect()
}

/// `count` attacked case ids spread over user tasks and injection tasks: ordered by the
/// sha256 of their id (a fixed pseudo-random order), the first `count`.
pub fn spread(plan: &PlanShape, count: usize) -> Vec<String> {
    let mut ids: Vec<&String> = plan.attacked().map(|c| &c.id).collect();
    ids.sort_by_key(|id| sha256_hex(id.as_bytes()));
    ids.into_iter().take(count).cloned().collect()
}

/// Attack outcomes drawn from the crossed logit model: logit(p) = μ + U(user task) +
/// V(injection task), μ set so that the population ASR is `asr` (Monte Carlo over
/// 20,000 draws is precise enough here), seeded.
pub fn landed_by_truth(plan: &PlanShape, asr: f64, sd_u: f64, sd_v: f64, seed: u64) -> Vec<String> {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    let normal = move |rng: &mut rand_chacha::ChaCha20Rng| {
        let (u1, u2): (f64, f64) = (1.0 - rng.random::<f64>(), rng.random::<f64>());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    };
    let expit = |x: f64| 1.0 / (1.0 + (-x).exp());
    let sd = (sd_u * sd_u + sd_v * sd_v).sqrt();
    let z: Vec<f64> = (0..20_000).map(|_| sd * normal(&mut rng)).collect();
    let (mut lo, mut hi) = (-30.0, 30.0);
    for _ in 0..80 {
        let mid = 0.5 * (lo + hi);
        let mean = z.iter().map(|z| expit(mid + z)).sum::<f64>() / z.len() as f64;
        if mean < asr { lo = mid } else { hi = mid }
    }
    let mu = 0.5 * (lo + hi);
    let mut effects = std::collections::HashMap::new();
    let mut effect = |key: String, sd: f64, rng: &mut rand_chacha::ChaCha20Rng| {
        *effects.entry(key).or_insert_with(|| sd * normal(rng))
    };
    let mut landed = Vec::new();
    for c in plan.attacked() {
        let u = effect(format!("u/{}/{}", c.suite, c.user_task.as_deref().unwrap()), sd_u, &mut rng);
        let v = effect(format!("v/{}/{}", c.suite, c.injection_task.as_deref().unwrap()), sd_v, &mut rng);
        if rng.random::<f64>() < expit(mu + u + v) {
            landed.push(c.id.clone());
        }
    }
    landed
}

/// Writes a run directory of `plan` with `records` (in order, one line each), as `run`
/// leaves it: `cases.sha256` matches the file.
pub fn write_run(dir: &Path, plan: &PlanShape, version: &str, records: &[Value]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let run_id = dir.file_name().unwrap().to_string_lossy().to_string();
    let meta = json!({
        "run_id": run_id, "version": version, "plan": plan.name, "plan_hash": plan.hash(),
        "planned_case_ids": plan.cases.iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
        "benchmark_version": plan.benchmark_version, "agentdojo_version": "0.1.35",
        "image_digest": "sha256:00", "gpu": {"state": "exclusive"}, "started_at": "2026-12-01T00:00:00Z",
    });
    std::fs::write(dir.join("run.json"), serde_json::to_string_pretty(&meta).unwrap()).unwrap();
    let plan_json = json!({"name": plan.name, "hash": plan.hash(), "benchmark_version": plan.benchmark_version,
                           "cases": plan.cases.iter().map(PlannedCase::json).collect::<Vec<_>>()});
    std::fs::write(dir.join("plan.json"), plan_json.to_string()).unwrap();
    write_cases(dir, records);
    let cases = std::fs::read(dir.join("cases.jsonl")).unwrap();
    std::fs::write(dir.join("cases.sha256"), format!("{}  cases.jsonl\n", sha256_hex(&cases))).unwrap();
    std::fs::write(dir.join("environment_check.json"), json!({"checks": []}).to_string()).unwrap();
    dir.to_path_buf()
}

/// Replaces `cases.jsonl` (and nothing else: `cases.sha256` keeps what the run wrote).
pub fn write_cases(dir: &Path, records: &[Value]) {
    let text: String = records.iter().map(|r| r.to_string() + "\n").collect();
    std::fs::write(dir.join("cases.jsonl"), text).unwrap();
}

/// The 1-based line of `cases.jsonl` holding the first record of `case_id`.
pub fn line_of(records: &[Value], case_id: &str) -> usize {
    records.iter().position(|r| r["case_id"] == case_id).unwrap() + 1
}
