//! The version's spec projected into what each part of a run takes, built once when the
//! request is resolved: the agent's setup (how `pruefstand agent` or the version's own
//! agent is configured) and the defence (guardrail and simulated human). The parts take
//! their projection, not the whole spec. Not here: the model server's projection,
//! `container::ServerSetup`, which lives below `run` because the container module takes
//! it (the request builds it beside these).

use pruefstand_core::settings::defence::{GuardrailSpec, HumanSpec, ToolCalling, ToolResultRole};
use pruefstand_core::spec::Version;

/// What configures the agent under test.
#[derive(Clone, Debug)]
pub(super) struct AgentSetup {
    /// The version's own agent (argv), in place of `pruefstand agent`.
    pub(crate) agent_cmd: Option<Vec<String>>,
    /// The model name the agent sends (the adapter's when there is one).
    pub(crate) model: String,
    /// The name the important_instructions attacks address the model by.
    pub(crate) display_name: String,
    pub(crate) tool_calling: ToolCalling,
    pub(crate) tool_result_role: ToolResultRole,
    /// The bound of every turn, the agent's default written out when the spec has none
    /// (agent.json shows the bound every turn had).
    pub(crate) max_tokens: u32,
    pub(crate) idle_timeout_s: f64,
}

impl AgentSetup {
    pub(crate) fn of(version: &Version) -> AgentSetup {
        let (spec, model) = (&version.spec, &version.spec.model);
        AgentSetup {
            agent_cmd: spec.agent_cmd.clone(),
            model: version.request_model().to_string(),
            display_name: model.display_name.clone(),
            tool_calling: model.tool_calling,
            tool_result_role: model.tool_result_role,
            max_tokens: model.max_tokens.unwrap_or(pruefstand_agent::llm::DEFAULT_MAX_TOKENS),
            idle_timeout_s: model.idle_timeout_s.unwrap_or(pruefstand_agent::AgentConfig::default().idle_timeout_s),
        }
    }
}

/// The version's defences around the agent.
#[derive(Clone, Debug)]
pub(super) struct Defence {
    pub(crate) guardrail: GuardrailSpec,
    pub(crate) human: HumanSpec,
}

impl Defence {
    pub(crate) fn of(version: &Version) -> Defence {
        Defence { guardrail: version.spec.guardrail.clone(), human: version.spec.human.clone() }
    }
}
