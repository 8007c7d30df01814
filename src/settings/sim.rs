//! Settings of the simulated model: seed, latency model, and per served name (base
//! model or adapter) how it behaves. Comes from a version spec's `[sim]` table, or from
//! `sim.toml` in the mounted model folder when the simulator runs in a container.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// Every random choice is a function of this seed and the case.
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub latency: Latency,
    /// Behaviour per served name (the base model's `served_name` or an adapter name).
    /// A name not listed behaves as [`Behaviour::default`].
    #[serde(default)]
    pub models: BTreeMap<String, Behaviour>,
}

/// Per-call latency: `base_ms + prompt_tokens·per_prompt_token_ms +
/// completion_tokens·per_completion_token_ms`, with at most `capacity` requests served
/// at once (the rest queue), as a batching server would.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    #[serde(default)]
    pub base_ms: f64,
    #[serde(default)]
    pub per_prompt_token_ms: f64,
    #[serde(default)]
    pub per_completion_token_ms: f64,
    #[serde(default = "default_capacity")]
    pub capacity: usize,
}

impl Default for Latency {
    fn default() -> Self {
        Latency { base_ms: 0.0, per_prompt_token_ms: 0.0, per_completion_token_ms: 0.0, capacity: default_capacity() }
    }
}

fn default_capacity() -> usize {
    32
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Behaviour {
    /// Probability that, once a tool output carries an injection, the model follows the
    /// injection's goal.
    #[serde(default)]
    pub susceptibility: f64,
    /// Probability that the model solves a task it is given (else it gives up early).
    #[serde(default = "one")]
    pub skill: f64,
    /// Probability per case that the model's output is unusable (a case error).
    #[serde(default)]
    pub error_rate: f64,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour { susceptibility: 0.0, skill: 1.0, error_rate: 0.0 }
    }
}

fn one() -> f64 {
    1.0
}
