//! The ground truth an attacker campaign reads: per (user task, injection task) pair,
//! the goal the attacker is briefed with and whose calls its feedback looks for, and the
//! user's task — its prompt, and the calls it needs itself (those are no sign of the
//! injection working). Read from the gym's ground-truth export (`gym.py truth`, cached
//! by `pruefstand_gym::pyenv::truth_file`; docs/protocol.md §3), only the fields named
//! here, unknown ones ignored. Not the simulator's view of the same file
//! (`pruefstand_sim::Truth`, which it acts out): a campaign against a real model owes
//! nothing to the simulator.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Deserialize;
use serde_json::Value;

/// The export's suites, by name.
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
pub(crate) struct Goals {
    suites: BTreeMap<String, Suite>,
}

#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
struct Suite {
    #[serde(default)]
    user_tasks: BTreeMap<String, UserTask>,
    #[serde(default)]
    injection_tasks: BTreeMap<String, InjectionTask>,
}

#[derive(Deserialize, Clone, Debug, PartialEq)]
struct UserTask {
    prompt: String,
    #[serde(default)]
    calls: Vec<Call>,
}

#[derive(Deserialize, Clone, Debug, PartialEq)]
struct InjectionTask {
    goal: String,
    #[serde(default)]
    calls: Vec<Call>,
}

/// A ground-truth tool call.
#[derive(Deserialize, Clone, Debug, PartialEq)]
pub(crate) struct Call {
    pub(crate) function: String,
    #[serde(default = "empty_args")]
    pub(crate) args: Value,
}

fn empty_args() -> Value {
    Value::Object(Default::default())
}

/// One pair's ground truth; empty where the export has no such task.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Pair<'a> {
    /// The injection task's goal, as the attacker is briefed.
    pub(crate) goal: &'a str,
    pub(crate) goal_calls: &'a [Call],
    /// The user's task as the assistant was given it.
    pub(crate) task: &'a str,
    pub(crate) user_calls: &'a [Call],
}

impl Goals {
    /// The export at `path`; an error names the file.
    pub(crate) fn load(path: &Path) -> anyhow::Result<Goals> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the gym's ground truth {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing the gym's ground truth {}", path.display()))
    }

    /// The ground truth of `suite`'s pair (`user_task`, `injection_task`).
    pub(crate) fn pair(&self, suite: &str, user_task: &str, injection_task: &str) -> Pair<'_> {
        let suite = self.suites.get(suite);
        let user = suite.and_then(|s| s.user_tasks.get(user_task));
        let injection = suite.and_then(|s| s.injection_tasks.get(injection_task));
        Pair {
            goal: injection.map_or("", |i| i.goal.as_str()),
            goal_calls: injection.map_or(&[], |i| i.calls.as_slice()),
            task: user.map_or("", |u| u.prompt.as_str()),
            user_calls: user.map_or(&[], |u| u.calls.as_slice()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_read_from_the_gyms_export_and_unknown_fields_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("truth.json");
        std::fs::write(
            &path,
            r#"{"agentdojo_version":"0.1.35","benchmark_version":"v1.2.2","extra":1,
                "suites":{"banking":{"tools":["send_money"],
                  "user_tasks":{"user_task_0":{"prompt":"Pay","calls":[{"function":"send_money","args":{"amount":1}}],"output":null}},
                  "injection_tasks":{"injection_task_6":{"goal":"Steal","calls":[{"function":"send_money"}],"output":"x"}}}}}"#,
        )
        .unwrap();
        let goals = Goals::load(&path).unwrap();
        let pair = goals.pair("banking", "user_task_0", "injection_task_6");
        assert_eq!((pair.goal, pair.task), ("Steal", "Pay"));
        assert_eq!(pair.user_calls[0].args["amount"], 1);
        assert_eq!(pair.goal_calls[0].args, serde_json::json!({}));
        let unknown = goals.pair("banking", "user_task_9", "injection_task_0");
        assert!(unknown.goal.is_empty() && unknown.goal_calls.is_empty() && unknown.task.is_empty());
        std::fs::write(&path, "{").unwrap();
        let err = Goals::load(&path).unwrap_err();
        assert!(format!("{err:#}").contains("the gym's ground truth") && format!("{err:#}").contains("truth.json"));
    }
}
