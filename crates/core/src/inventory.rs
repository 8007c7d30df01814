//! What the installed AgentDojo (plus pruefstand's custom suites) offers for one
//! benchmark version: its suites, their tasks, its attacks. Plans are checked against it
//! and a run's plan file records it. Asking the venv for it is `pruefstand_gym::pyenv`'s.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What the installed AgentDojo (plus our custom suites) offers for one benchmark
/// version.
#[derive(Deserialize, Serialize, Clone, Debug)]
pub struct Inventory {
    pub agentdojo_version: String,
    pub benchmark_version: String,
    pub benchmark_versions: Vec<String>,
    pub suites: BTreeMap<String, SuiteInventory>,
    pub attacks: Vec<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug)]
pub struct SuiteInventory {
    pub user_tasks: Vec<String>,
    pub injection_tasks: Vec<String>,
    #[serde(default)]
    pub injection_tasks_with_ground_truth: Vec<String>,
}

impl Inventory {
    pub(crate) fn suite_names(&self) -> String {
        self.suites.keys().cloned().collect::<Vec<_>>().join(", ")
    }
}
