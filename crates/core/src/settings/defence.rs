//! The two defence layers a version names in its spec — guardrail and simulated human —
//! as typed settings. Shared by the spec (which parses them), the agent runtime (which
//! enforces them) and the gym (which applies AgentDojo's own defences).
//!
//! Behaviour lives in `agent::guardrail` and `agent::human`; this module only says what
//! can be configured.

use serde::{Deserialize, Serialize};

/// `[guardrail]` of a version spec. Inspects tool outputs before the model sees them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum GuardrailSpec {
    #[default]
    None,
    /// Documented pattern rules over tool outputs (see `agent::guardrail`).
    Heuristic {
        /// Extra case-insensitive regular expressions, added to the built-in rules.
        #[serde(default)]
        extra_patterns: Vec<String>,
    },
    /// A classification prompt to the served model, or to a named guard adapter on the
    /// same server.
    Llm {
        #[serde(default)]
        model: Option<String>,
    },
    /// POST `{"text": ...}` to a classifier endpoint; flagged when its `score` ≥ threshold.
    /// Applied in the agent runtime, which withholds a flagged output with its own notice
    /// (the gym's trace keeps the original). Credentials in `url` are redacted wherever
    /// it is shown or written; the agent gets the URL itself through its environment.
    Http {
        #[serde(deserialize_with = "super::url::deserialize_unchecked_one")]
        url: super::url::SecretUrl,
        #[serde(default = "default_threshold")]
        threshold: f64,
        #[serde(default = "default_http_timeout")]
        timeout_s: f64,
    },
    /// AgentDojo's prompt-injection detector (`transformers_pi_detector`) with the
    /// classifier behind an HTTP classification endpoint (vLLM's `/classify`): applied
    /// in the gym where AgentDojo applies it, after the tools ran and before the model
    /// reads their outputs, so the trace and the report show the replaced output.
    Classifier(ClassifierSpec),
    /// One of AgentDojo's own pipeline defences that need no cloud model; applied in
    /// the gym, not in the agent runtime.
    Agentdojo {
        defence: AgentdojoDefence,
        /// `tool_filter` only: the served model (e.g. a guard adapter on the same
        /// server) that picks the tools; the version's own model when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
}

/// `[guardrail] kind = "classifier"`: where the classifier is and how its answer reads.
/// A text is an injection when the classifier's probability of `safe_label` is below
/// `threshold` — AgentDojo's direction (`TransformersBasedPIDetector`), the opposite of
/// the `http` kind's score ≥ threshold.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClassifierSpec {
    /// The classification endpoint, e.g. `http://127.0.0.1:8001/classify` (vLLM serving
    /// the classifier). Absent: `/classify` of the version's own model server. Its
    /// credentials, if any, are redacted wherever it is shown or written.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "super::url::deserialize_unchecked")]
    pub url: Option<super::url::SecretUrl>,
    /// The classifier's served name (the request's `model`).
    #[serde(default = "default_classifier_model")]
    pub model: String,
    /// The label of a clean text.
    #[serde(default = "default_safe_label")]
    pub safe_label: String,
    /// Flagged when P(`safe_label`) < threshold.
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    #[serde(default = "default_http_timeout")]
    pub timeout_s: f64,
}

/// The classifier AgentDojo's `transformers_pi_detector` runs.
pub(crate) const DEFAULT_CLASSIFIER: &str = "protectai/deberta-v3-base-prompt-injection-v2";

fn default_classifier_model() -> String {
    DEFAULT_CLASSIFIER.to_string()
}

fn default_safe_label() -> String {
    "SAFE".to_string()
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AgentdojoDefence {
    SpotlightingWithDelimiting,
    RepeatUserPrompt,
    /// One extra call before the first turn: the model names the tools the task needs
    /// (AgentDojo's prompt, `tool_choice = "none"`), and only those are offered.
    ToolFilter,
}

impl AgentdojoDefence {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentdojoDefence::SpotlightingWithDelimiting => "spotlighting_with_delimiting",
            AgentdojoDefence::RepeatUserPrompt => "repeat_user_prompt",
            AgentdojoDefence::ToolFilter => "tool_filter",
        }
    }
}

/// The gym's name of AgentDojo's detector composition (`ToolsExecutor`, detector, model)
/// with pruefstand's HTTP classifier: it names the pipeline and the traces' folder.
pub const PI_DETECTOR: &str = "pi_detector";

fn default_threshold() -> f64 {
    0.5
}

fn default_http_timeout() -> f64 {
    10.0
}

/// `[human]` of a version spec: who approves side-effecting tool calls.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(tag = "policy", rename_all = "snake_case", deny_unknown_fields)]
pub enum HumanSpec {
    /// No human in the loop: calls run unasked.
    #[default]
    None,
    /// A rubber stamp: every side-effecting call is asked and approved.
    ApproveAll,
    /// Denies a side-effecting call whose recipients/targets appear nowhere in the
    /// user's own request.
    TaskScoped,
    /// Asks the model with an approver persona.
    Llm {
        #[serde(default)]
        model: Option<String>,
    },
}

/// The role tool results carry in prompted mode: what the model's chat template turns
/// into the turn a defended model was trained to treat as data.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ToolResultRole {
    /// A `user` message holding `{"result": text}` (pruefstand's default: every chat
    /// template has the role).
    #[default]
    User,
    /// AgentDojo's `local` format: role `tool`, its JSON-dumped content blocks.
    Tool,
    /// Meta-SecAlign's untrusted-input role (`--tool-delimiter input`), the same content.
    Input,
}

impl ToolResultRole {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolResultRole::User => "user",
            ToolResultRole::Tool => "tool",
            ToolResultRole::Input => "input",
        }
    }

    pub fn is_user(&self) -> bool {
        *self == ToolResultRole::User
    }
}

/// How the agent runtime talks tools with the model.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ToolCalling {
    /// OpenAI `tools` in the request, `tool_calls` in the answer.
    #[default]
    Native,
    /// AgentDojo's local-model text format: tools listed in the system prompt, calls as
    /// `<function=name>{json}</function>` in the answer.
    Prompted,
}
