//! Brings a version's model server up for a run and down after it: the simulated model
//! in-process (`backend = "sim"`), an already-running server (`external`), or — from the
//! container module — vLLM in Docker. Hands back an OpenAI-compatible endpoint.
//!
//! It knows nothing of cases or agents; `run` wires the endpoint to the agent runtime.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};

use crate::sim;
use crate::spec::{Backend, Version};

/// Where the agent finds the model, and what keeps it alive.
pub struct Endpoint {
    /// OpenAI base URL, e.g. `http://127.0.0.1:41234/v1`.
    pub base_url: String,
    /// Per-run key, given to the agent by environment (never argv or reports).
    pub api_key: Option<String>,
    server: Option<sim::Server>,
}

impl Endpoint {
    pub async fn down(mut self) -> anyhow::Result<()> {
        if let Some(server) = self.server.take() {
            server.shutdown().await?;
        }
        Ok(())
    }
}

/// A random per-run API key.
pub fn new_api_key() -> String {
    use rand::RngExt;
    let bytes: [u8; 24] = rand::rng().random();
    format!("pfs-{}", hex::encode(bytes))
}

pub async fn up(version: &Version, truth_file: &Path) -> anyhow::Result<Endpoint> {
    let model = &version.spec.model;
    match model.backend.get_ref() {
        Backend::Sim => {
            let truth = sim::Truth::load(truth_file)?;
            let api_key = new_api_key();
            let settings = sim::SimSettings {
                config: version.spec.sim.clone().unwrap_or_default(),
                truth: Arc::new(truth),
                served_name: model.served_name.clone(),
                adapters: version.spec.adapter.iter().map(|a| a.name.clone()).collect(),
                api_key: Some(api_key.clone()),
            };
            let server = sim::Server::start(settings, "127.0.0.1:0".parse().expect("valid address"))
                .await
                .context("starting the simulated model")?;
            Ok(Endpoint { base_url: server.base_url(), api_key: Some(api_key), server: Some(server) })
        }
        Backend::External => {
            let url = model.url.clone().context("backend \"external\" needs model.url")?;
            let api_key = match &model.api_key_env {
                Some(var) => Some(std::env::var(var).with_context(|| format!("{}: model.api_key_env names {var}, which is not set", version.path.display()))?),
                None => None,
            };
            Ok(Endpoint { base_url: url.trim_end_matches('/').to_string(), api_key, server: None })
        }
        Backend::Docker => bail!(
            "{}: backend \"docker\" (vLLM in a container) is not available in this build yet; use backend \"sim\" or \"external\"",
            version.path.display()
        ),
    }
}
