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
    /// The prompt-injection classifier the simulator serves at `/classify` (vLLM's
    /// classification API), for `[guardrail] kind = "classifier"` without a `url`.
    #[serde(default, skip_serializing_if = "Classifier::is_default")]
    pub classifier: Classifier,
}

/// `[sim.classifier]`: how often the simulated classifier flags a text, drawn per text
/// (the same text always gets the same answer).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Classifier {
    /// Probability that a text carrying an injection goal is flagged.
    #[serde(deserialize_with = "detects")]
    pub detects: f64,
    /// Probability that a text without one is flagged (a false positive).
    #[serde(deserialize_with = "false_positives")]
    pub false_positives: f64,
}

impl Default for Classifier {
    fn default() -> Self {
        Classifier { detects: 1.0, false_positives: 0.0 }
    }
}

impl Classifier {
    pub(crate) fn is_default(&self) -> bool {
        *self == Classifier::default()
    }
}

/// Per-call latency: `base_ms + prompt_tokens·per_prompt_token_ms +
/// completion_tokens·per_completion_token_ms`, with at most `capacity` requests served
/// at once (the rest queue), as a batching server would.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    #[serde(default, deserialize_with = "base_ms")]
    pub base_ms: f64,
    #[serde(default, deserialize_with = "per_prompt_token_ms")]
    pub per_prompt_token_ms: f64,
    #[serde(default, deserialize_with = "per_completion_token_ms")]
    pub per_completion_token_ms: f64,
    #[serde(default = "default_capacity", deserialize_with = "capacity")]
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
    #[serde(default, deserialize_with = "susceptibility")]
    pub susceptibility: f64,
    /// Per attack family (docs/attacks.md), the probability to follow an injection
    /// worded in it; a family not listed, or text of no family, takes `susceptibility`.
    /// A model trained on one template and gullible elsewhere is `{ important_instructions
    /// = 0.01 }` with `susceptibility = 0.4`.
    #[serde(default, deserialize_with = "by_family", skip_serializing_if = "BTreeMap::is_empty")]
    pub susceptibility_by_family: BTreeMap<String, f64>,
    /// Probability that the model solves a task it is given (else it gives up early).
    #[serde(default = "one", deserialize_with = "skill")]
    pub skill: f64,
    /// Probability per case that the model's last step is cut off mid-call (malformed
    /// output: scored, never an error).
    #[serde(default, deserialize_with = "error_rate")]
    pub error_rate: f64,
    /// How the model misbehaves, per call.
    #[serde(default)]
    pub faults: Faults,
    /// A weakness no grammar wording expresses (docs/attacks.md, "Known truth"): phrases
    /// that, all in the injected text, make the model follow it whatever its
    /// susceptibility; with some of them it complies partly — a quarter or more of them
    /// quoted in its answer, half or more a call of the goal's first tool with only
    /// its first argument right.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weakness: Vec<String>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            susceptibility: 0.0,
            susceptibility_by_family: BTreeMap::new(),
            skill: 1.0,
            error_rate: 0.0,
            faults: Faults::default(),
            weakness: Vec::new(),
        }
    }
}

/// `[sim.models."<name>".faults]`: the probability per model call of each way a real
/// model (or its server) misbehaves. Each call draws at most one of the output faults
/// (in the order below); `think` and `slow` come on top. Draws are keyed by seed, case
/// and call like every other draw, so versions stay coupled.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// HTTP 400 with vLLM's "maximum context length" error: a context overflow.
    #[serde(deserialize_with = "context_overflow")]
    pub context_overflow: f64,
    /// HTTP 500 (the same answer to every retry of that call): an infrastructure error.
    #[serde(deserialize_with = "http_500")]
    pub http_500: f64,
    /// An empty completion.
    #[serde(deserialize_with = "empty")]
    pub empty: f64,
    /// A completion cut by the length limit (`finish_reason: "length"`).
    #[serde(deserialize_with = "truncated")]
    pub truncated: f64,
    /// Call arguments that are not valid JSON (a trailing comma).
    #[serde(deserialize_with = "broken_json")]
    pub broken_json: f64,
    /// Call arguments that are JSON but not an object.
    #[serde(deserialize_with = "non_object_args")]
    pub non_object_args: f64,
    /// A call of a tool that does not exist.
    #[serde(deserialize_with = "unknown_tool")]
    pub unknown_tool: f64,
    /// Prose around a call.
    #[serde(deserialize_with = "prose")]
    pub prose: f64,
    /// A `<think>…</think>` block before the answer.
    #[serde(deserialize_with = "think")]
    pub think: f64,
    /// A response slower by `slow_ms`.
    #[serde(deserialize_with = "slow")]
    pub slow: f64,
    #[serde(deserialize_with = "slow_ms")]
    pub slow_ms: f64,
    /// A model that does not stop: filler text, one token per `ramble_token_ms`, until
    /// the request's `max_tokens` (without one: the end of an 8,192-token context),
    /// `finish_reason: "length"` — streamed or not.
    #[serde(deserialize_with = "ramble")]
    pub ramble: f64,
    #[serde(deserialize_with = "ramble_token_ms")]
    pub ramble_token_ms: f64,
    /// A stream that falls silent after a few tokens (a hung generation): nothing more
    /// until the client gives up (ten minutes at most).
    #[serde(deserialize_with = "stall")]
    pub stall: f64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            context_overflow: 0.0,
            http_500: 0.0,
            empty: 0.0,
            truncated: 0.0,
            broken_json: 0.0,
            non_object_args: 0.0,
            unknown_tool: 0.0,
            prose: 0.0,
            think: 0.0,
            slow: 0.0,
            slow_ms: 2000.0,
            ramble: 0.0,
            ramble_token_ms: 50.0,
            stall: 0.0,
        }
    }
}

fn one() -> f64 {
    1.0
}

/// Every number of the simulator is bounded where it is read (a latency of 1e300 ms
/// would panic the server's sleep): probabilities in [0, 1], delays up to ten minutes.
macro_rules! bounded_fields {
    ($($field:ident: $range:expr, $unit:literal;)*) => {$(
        fn $field<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
            crate::input::bounded(d, stringify!($field), $range, $unit)
        }
    )*};
}

const PROBABILITY: (f64, f64, bool) = (0.0, 1.0, false);
const DELAY_MS: (f64, f64, bool) = (0.0, 600_000.0, false);

bounded_fields! {
    detects: PROBABILITY, "a probability";
    false_positives: PROBABILITY, "a probability";
    susceptibility: PROBABILITY, "a probability";
    skill: PROBABILITY, "a probability";
    error_rate: PROBABILITY, "a probability";
    context_overflow: PROBABILITY, "a probability";
    http_500: PROBABILITY, "a probability";
    empty: PROBABILITY, "a probability";
    truncated: PROBABILITY, "a probability";
    broken_json: PROBABILITY, "a probability";
    non_object_args: PROBABILITY, "a probability";
    unknown_tool: PROBABILITY, "a probability";
    prose: PROBABILITY, "a probability";
    think: PROBABILITY, "a probability";
    slow: PROBABILITY, "a probability";
    slow_ms: DELAY_MS, "a delay (ms)";
    ramble: PROBABILITY, "a probability";
    ramble_token_ms: DELAY_MS, "a delay (ms)";
    stall: PROBABILITY, "a probability";
    base_ms: DELAY_MS, "a delay (ms)";
    per_prompt_token_ms: DELAY_MS, "a delay (ms)";
    per_completion_token_ms: DELAY_MS, "a delay (ms)";
}

impl Behaviour {
    /// The probability to follow an injection of `family` (None: no family recognised).
    pub fn susceptibility_to(&self, family: Option<&str>) -> f64 {
        family.and_then(|f| self.susceptibility_by_family.get(f)).copied().unwrap_or(self.susceptibility)
    }
}

/// Each probability of `susceptibility_by_family` bounded like `susceptibility`.
fn by_family<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f64>, D::Error> {
    let raw = BTreeMap::<String, toml::Value>::deserialize(d)?;
    raw.into_iter()
        .map(|(family, value)| {
            let p = value.as_float().or_else(|| value.as_integer().map(|i| i as f64));
            match p {
                Some(p) if (0.0..=1.0).contains(&p) => Ok((family, p)),
                _ => Err(serde::de::Error::custom(format!(
                    "susceptibility_by_family.{family} = {value} is not a probability (0 to 1)"
                ))),
            }
        })
        .collect()
}

/// Concurrent requests the simulated server serves at once.
fn capacity<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    crate::input::bounded_count(d, "capacity", (1, 100_000))
}
