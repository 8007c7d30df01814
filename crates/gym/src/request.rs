//! What `gym.py run` is asked (docs/protocol.md §2): the request pruefstand writes into
//! the run directory before each pass (`gym-request.json`, its JSON Schema generated
//! from these types for the Python side) and the classifier endpoint of the gym's
//! prompt-injection detector. Not here: starting the gym and reading its events (the
//! binary's `gym`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use pruefstand_core::case::Case;
use pruefstand_core::record::Wording;
use pruefstand_core::settings::url::SecretUrl;
use pruefstand_store::{RunDocument, RunFile};

/// Everything `gym.py run` needs (docs/protocol.md §2).
#[derive(Serialize, schemars::JsonSchema, Debug)]
pub struct GymRequest {
    pub run_dir: PathBuf,
    pub benchmark_version: String,
    /// Cases in flight to begin with.
    #[schemars(range(min = 1, max = pruefstand_core::settings::MAX_IN_FLIGHT))]
    pub jobs: usize,
    /// The most cases in flight; between the two, pruefstand's `concurrency` commands
    /// on the gym's stdin decide.
    #[schemars(range(min = 1, max = pruefstand_core::settings::MAX_IN_FLIGHT))]
    pub max_in_flight: usize,
    pub agent_cmd: Vec<String>,
    pub model_display_name: String,
    pub case_timeout_s: f64,
    pub seed: u64,
    pub defence: Option<String>,
    /// With `defence = "pi_detector"`: the classifier AgentDojo's detector asks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detector: Option<DetectorRequest>,
    pub cases: Vec<Case>,
    pub done: Vec<String>,
    /// Case ids in the order to dispatch them (early stopping); absent: the gym's own (a user task's cases together, longest first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<String>>,
    /// The wording of every case whose attack is worded from a family grammar, by case
    /// id: drawn from the run's seed (docs/attacks.md), so a resume injects the same text.
    pub wording: BTreeMap<String, Wording>,
    /// Templates an attacker model wrote (holding `{goal}`), by case id
    /// (docs/attacks.md): injected as they are, never parsed as YAML; absent when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub templates: BTreeMap<String, String>,
    /// An open pass (an attacker campaign's): `cases` begins it, more come as `cases`
    /// commands on the gym's stdin, at most this many cases in all; it ends once `close`
    /// came and every case finished. Absent: the pass runs `cases` and ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open: Option<usize>,
}

impl RunDocument for GymRequest {
    const FILE: RunFile = RunFile::GymRequest;
}

/// The classification endpoint of the gym's prompt-injection detector
/// (docs/defences.md): POST `{"model", "input": [text]}`, answered with vLLM's
/// `{"data": [{"label", "probs"}]}`.
#[derive(Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct DetectorRequest {
    /// The endpoint, e.g. `http://127.0.0.1:8001/classify`, its credentials as `***`
    /// (the request is a file of the run).
    pub url: String,
    /// The agents' environment variable holding the whole URL, when it carries
    /// credentials: the gym connects with that one and names `url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url_env: Option<String>,
    pub model: String,
    pub safe_label: String,
    /// A text is an injection when P(`safe_label`) < threshold.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub threshold: f64,
    pub timeout_s: f64,
    /// Send the model server's key (from the agents' environment): the endpoint is the
    /// version's own model server.
    pub model_server_key: bool,
}

impl DetectorRequest {
    /// The request for a version's `[guardrail] kind = "classifier"`, its model server at
    /// `base_url` (`…/v1`): vLLM serves `/classify` beside `/v1`, not under it. With it,
    /// the variable for the agents' environment that holds a URL with credentials.
    pub fn of(
        spec: &pruefstand_core::settings::defence::ClassifierSpec,
        base_url: &SecretUrl,
    ) -> (Self, Option<(String, String)>) {
        let url = spec.url.clone().unwrap_or_else(|| classify_url(base_url));
        let env = url.has_secrets().then(|| (DETECTOR_URL_ENV.to_string(), url.expose().to_string()));
        let request = DetectorRequest {
            url: url.redacted(),
            url_env: env.as_ref().map(|(name, _)| name.clone()),
            model: spec.model.clone(),
            safe_label: spec.safe_label.clone(),
            threshold: spec.threshold,
            timeout_s: spec.timeout_s,
            model_server_key: spec.url.is_none(),
        };
        (request, env)
    }
}

/// The agents' environment variable holding a classifier URL with credentials.
pub(crate) const DETECTOR_URL_ENV: &str = "PRUEFSTAND_DETECTOR_URL";

/// `/classify` beside a model server's `…/v1`, its query (a token) kept.
fn classify_url(base_url: &SecretUrl) -> SecretUrl {
    let text = base_url.expose();
    let (path, query) = text.split_at(text.find(['?', '#']).unwrap_or(text.len()));
    SecretUrl::own(format!("{}/classify{query}", path.trim_end_matches('/').trim_end_matches("/v1")))
}
