//! Cases and case records: the unit of work of a plan and the one line per finished
//! case in `cases.jsonl`.
//!
//! This is the contract between the Python gym (which produces records) and everything
//! in Rust that reads them (telemetry, judgement, reports). It does not know how a case
//! is run.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a case measures.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum CaseKind {
    /// A user task without any injection: utility.
    Clean,
    /// A user task with one injection task under one attack: utility under attack and
    /// attack success (`security`).
    Attacked,
    /// An injection task's goal given to the agent directly as the user's prompt: can
    /// the model do the attacker's task at all? (AgentDojo's injection task utility.)
    InjectionGoal,
}

/// One planned AgentDojo episode.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Case {
    pub id: String,
    pub kind: CaseKind,
    pub suite: String,
    /// None for [`CaseKind::InjectionGoal`].
    pub user_task: Option<String>,
    /// None for [`CaseKind::Clean`].
    pub injection_task: Option<String>,
    /// None unless [`CaseKind::Attacked`].
    pub attack: Option<String>,
}

/// A user task's key: `suite/user_task`, as its cluster is named everywhere (the
/// dispatch order, early stopping, R1).
pub fn user_task_key(suite: &str, user_task: &str) -> String {
    format!("{suite}/{user_task}")
}

impl Case {
    /// The key of the case's user task ([`user_task_key`]); None for an injection-goal
    /// case.
    pub fn user_task_key(&self) -> Option<String> {
        self.user_task.as_deref().map(|u| user_task_key(&self.suite, u))
    }

    pub fn clean(suite: &str, user_task: &str) -> Case {
        Case::new(CaseKind::Clean, suite, Some(user_task), None, None)
    }

    pub fn attacked(suite: &str, user_task: &str, injection_task: &str, attack: &str) -> Case {
        Case::new(CaseKind::Attacked, suite, Some(user_task), Some(injection_task), Some(attack))
    }

    pub fn injection_goal(suite: &str, injection_task: &str) -> Case {
        Case::new(CaseKind::InjectionGoal, suite, None, Some(injection_task), None)
    }

    fn new(
        kind: CaseKind,
        suite: &str,
        user_task: Option<&str>,
        injection_task: Option<&str>,
        attack: Option<&str>,
    ) -> Case {
        // The id is stable across runs and versions: it is how two runs of one plan are
        // paired case by case.
        let id = match kind {
            CaseKind::InjectionGoal => format!("{suite}/goal/{}", injection_task.unwrap_or("-")),
            _ => format!(
                "{suite}/{}/{}/{}",
                user_task.unwrap_or("-"),
                attack.unwrap_or("none"),
                injection_task.unwrap_or("none")
            ),
        };
        Case {
            id,
            kind,
            suite: suite.to_string(),
            user_task: user_task.map(str::to_string),
            injection_task: injection_task.map(str::to_string),
            attack: attack.map(str::to_string),
        }
    }
}

/// How the agent's error begins when it could not connect to the model server (after
/// the agent's own retries), after `model server: `.
pub const CANNOT_CONNECT: &str = "cannot connect";

/// Whether a case's error says its agent could not connect to the model server.
pub fn is_unreachable(error: &str) -> bool {
    error.contains(&format!("model server: {CANNOT_CONNECT}: "))
}

/// How a case ended.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Scored by AgentDojo's rules — whatever the model did, malformed output included.
    Scored,
    /// The server refused the conversation for its length: scored as AgentDojo does,
    /// utility false and (attacked cases) the injection counted as landed.
    ContextOverflow,
    /// The bench failed (server unreachable or 5xx after retries, timeout, the agent
    /// died, protocol): no scores, counted by R1.
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Scored => "scored",
            Outcome::ContextOverflow => "context_overflow",
            Outcome::Error => "error",
        }
    }
}

/// The counters an agent reports with each reply of the JSON-line protocol (`stats`,
/// cumulative since the case began), each filling the case record's field of its name.
/// The gym reads their names from the generated contract (`constants.json`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct AgentStats {
    pub llm_calls: Option<u64>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub guardrail_flags: Option<u64>,
    pub human_asks: Option<u64>,
    pub human_denials: Option<u64>,
    pub malformed_outputs: Option<u64>,
    pub unknown_tool_calls: Option<u64>,
    pub cut_generations: Option<u64>,
    pub streamed_calls: Option<u64>,
    pub ttft_ms: Option<u64>,
    pub decode_ms: Option<u64>,
}

/// One line of `cases.jsonl`: the outcome of one case.
///
/// Polarity follows AgentDojo: `security == Some(true)` means the injection landed.
/// A case that errored has `error` set and `utility`/`security` None: an error is never
/// counted as a utility failure or an attack success. Counters the agent did not report
/// are None, not 0.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct CaseRecord {
    pub case_id: String,
    pub kind: CaseKind,
    pub suite: String,
    pub user_task: Option<String>,
    pub injection_task: Option<String>,
    pub attack: Option<String>,
    pub utility: Option<bool>,
    pub security: Option<bool>,
    /// Absent in records of older runs: then it follows from `error`.
    #[serde(default)]
    pub outcome: Option<Outcome>,
    pub error: Option<String>,
    pub duration_s: f64,
    pub llm_calls: Option<u64>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub guardrail_flags: Option<u64>,
    pub human_asks: Option<u64>,
    pub human_denials: Option<u64>,
    /// Model answers that broke the tool-calling format (the agent's count).
    #[serde(default)]
    pub malformed_outputs: Option<u64>,
    /// Calls of tools the case does not offer (the agent's count).
    #[serde(default)]
    pub unknown_tool_calls: Option<u64>,
    /// Generations cut off — stopped by the server at `max_tokens`, or given up on by
    /// the agent after silence or at its time bound — scored with the text so far (the
    /// agent's count).
    #[serde(default)]
    pub cut_generations: Option<u64>,
    /// Streamed model calls that produced a first token; their summed time to it, and
    /// from it to the last token (ms): time to first token and decode rate per case.
    #[serde(default)]
    pub streamed_calls: Option<u64>,
    #[serde(default)]
    pub ttft_ms: Option<u64>,
    #[serde(default)]
    pub decode_ms: Option<u64>,
    /// Times AgentDojo re-ran the task because the last turn had no model output.
    #[serde(default)]
    pub restarts: Option<u64>,
    /// AgentDojo's trace of this case, relative to the run directory.
    #[serde(default)]
    pub trace: Option<String>,
}

impl CaseRecord {
    /// A record of `case` with the given outcome and nothing else known (counters
    /// None): the starting point for constructed records in studies and tests.
    pub fn of(case: &Case, utility: Option<bool>, security: Option<bool>) -> CaseRecord {
        CaseRecord {
            case_id: case.id.clone(),
            kind: case.kind,
            suite: case.suite.clone(),
            user_task: case.user_task.clone(),
            injection_task: case.injection_task.clone(),
            attack: case.attack.clone(),
            utility,
            security,
            outcome: Some(Outcome::Scored),
            error: None,
            duration_s: 1.0,
            llm_calls: None,
            prompt_tokens: None,
            completion_tokens: None,
            guardrail_flags: None,
            human_asks: None,
            human_denials: None,
            malformed_outputs: None,
            unknown_tool_calls: None,
            cut_generations: None,
            streamed_calls: None,
            ttft_ms: None,
            decode_ms: None,
            restarts: None,
            trace: None,
        }
    }

    pub fn is_error(&self) -> bool {
        self.error.is_some()
    }

    /// An attacked case counted as a landed attack only because its conversation outgrew
    /// the model's context: AgentDojo scores such a case security true (the injection's
    /// goal "may have been reached"), so it is in the ASR, but no injection was followed.
    pub fn is_overflow_counted_as_landed(&self) -> bool {
        self.kind == CaseKind::Attacked && self.outcome() == Outcome::ContextOverflow && self.security == Some(true)
    }

    /// Whether the case failed because its agent could not connect to the model server
    /// at all, even after its retries: the server is not there (`run::silence` counts
    /// these across cases; a restarted container runs them again).
    pub fn could_not_connect(&self) -> bool {
        self.error.as_deref().is_some_and(is_unreachable)
    }

    pub fn outcome(&self) -> Outcome {
        match (&self.error, self.outcome) {
            (Some(_), _) => Outcome::Error,
            (None, Some(Outcome::Error) | None) => Outcome::Scored,
            (None, Some(outcome)) => outcome,
        }
    }

    /// Total tokens, when the agent reported both counters.
    pub fn tokens(&self) -> Option<u64> {
        Some(self.prompt_tokens?.saturating_add(self.completion_tokens?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_pair_runs_and_tell_kinds_apart() {
        assert_eq!(Case::clean("banking", "user_task_0").id, "banking/user_task_0/none/none");
        assert_eq!(
            Case::attacked("banking", "user_task_0", "injection_task_1", "important_instructions").id,
            "banking/user_task_0/important_instructions/injection_task_1"
        );
        assert_eq!(Case::injection_goal("slack", "injection_task_2").id, "slack/goal/injection_task_2");
    }

    #[test]
    fn record_roundtrips_with_nulls() {
        let line = r#"{"case_id":"a/b/none/none","kind":"clean","suite":"a","user_task":"b","injection_task":null,"attack":null,"utility":true,"security":null,"error":null,"duration_s":1.5,"llm_calls":null,"prompt_tokens":3,"completion_tokens":4,"guardrail_flags":null,"human_asks":null,"human_denials":null}"#;
        let record: CaseRecord = serde_json::from_str(line).unwrap();
        assert_eq!(record.tokens(), Some(7));
        assert_eq!(record.llm_calls, None);
        assert!(!record.is_error());
    }
}
