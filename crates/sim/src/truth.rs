//! The ground truth the simulated model acts out: `truth.json` as exported by
//! `gym.py truth` (docs/protocol.md §3). Only types and loading live here; what the
//! model does with them is in `policy`. Unknown fields are ignored so that the gym may
//! add fields without breaking older simulators.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Truth {
    #[serde(default)]
    pub agentdojo_version: Option<String>,
    #[serde(default)]
    pub benchmark_version: Option<String>,
    /// Suite name → suite. A BTreeMap so every scan runs in one fixed order.
    pub suites: BTreeMap<String, Suite>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Suite {
    /// Names of the suite's tools; used to tell suites apart when prompts coincide.
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub user_tasks: BTreeMap<String, UserTask>,
    #[serde(default)]
    pub injection_tasks: BTreeMap<String, InjectionTask>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct UserTask {
    pub prompt: String,
    #[serde(default)]
    pub calls: Vec<Call>,
    /// The task's `GROUND_TRUTH_OUTPUT`, when it has one.
    #[serde(default)]
    pub output: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct InjectionTask {
    pub goal: String,
    /// Empty for tasks that ship no ground truth; such goals cannot be acted out.
    #[serde(default)]
    pub calls: Vec<Call>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Call {
    pub function: String,
    #[serde(default = "empty_args")]
    pub args: serde_json::Value,
}

fn empty_args() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

impl Truth {
    pub fn load(path: &Path) -> anyhow::Result<Truth> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the simulator's ground truth {}", path.display()))?;
        Truth::parse(&text).with_context(|| format!("parsing the simulator's ground truth {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Truth> {
        let truth: Truth = serde_json::from_str(text)?;
        for (name, suite) in &truth.suites {
            for (id, task) in &suite.user_tasks {
                anyhow::ensure!(!task.prompt.trim().is_empty(), "suite {name}: {id} has an empty prompt");
            }
            for (id, task) in &suite.injection_tasks {
                anyhow::ensure!(!task.goal.trim().is_empty(), "suite {name}: {id} has an empty goal");
            }
        }
        Ok(truth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_shape_and_ignores_extra_fields() {
        let t = Truth::parse(
            r#"{"agentdojo_version":"0.1.35","benchmark_version":"v1.2.2","extra":1,
                "suites":{"banking":{"tools":["send_money"],
                  "user_tasks":{"user_task_0":{"prompt":"Pay","calls":[{"function":"send_money","args":{"amount":1}}],"output":null}},
                  "injection_tasks":{"injection_task_6":{"goal":"Steal","calls":[]}}}}}"#,
        )
        .unwrap();
        let s = &t.suites["banking"];
        assert_eq!(s.user_tasks["user_task_0"].calls[0].args["amount"], 1);
        assert!(s.injection_tasks["injection_task_6"].calls.is_empty());
    }

    #[test]
    fn load_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("truth.json");
        let err = Truth::load(&path).unwrap_err();
        assert!(format!("{err:#}").contains("truth.json"), "{err:#}");
        std::fs::write(&path, "{").unwrap();
        let err = Truth::load(&path).unwrap_err();
        assert!(format!("{err:#}").contains("truth.json"), "{err:#}");
    }
}
