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
    Http {
        url: String,
        #[serde(default = "default_threshold")]
        threshold: f64,
        #[serde(default = "default_http_timeout")]
        timeout_s: f64,
    },
    /// One of AgentDojo's own pipeline defences that need no cloud model; applied in
    /// the gym, not in the agent runtime.
    Agentdojo { defence: AgentdojoDefence },
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AgentdojoDefence {
    SpotlightingWithDelimiting,
    RepeatUserPrompt,
}

impl AgentdojoDefence {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentdojoDefence::SpotlightingWithDelimiting => "spotlighting_with_delimiting",
            AgentdojoDefence::RepeatUserPrompt => "repeat_user_prompt",
        }
    }
}

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
