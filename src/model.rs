//! Brings a version's model server up for a run and down after it: the simulated model
//! in-process (`backend = "sim"`), an already-running server (`external`), or vLLM (or
//! the simulated model's image) in Docker through the `container` pool. Hands back an
//! OpenAI-compatible endpoint.
//!
//! It knows nothing of cases or agents; `run` wires the endpoint to the agent runtime.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use crate::container::{self, AcquireError, ServerSetup};
use pruefstand_core::record::ModelServerFacts;
use pruefstand_core::settings::url::SecretUrl;
use pruefstand_core::spec::Backend;
use pruefstand_core::util;
use pruefstand_sim as sim;

/// Where a docker model's container comes from and what it is labelled with.
pub(crate) struct UpContext<'a> {
    pub(crate) pool: &'a container::Pool,
    pub(crate) run_dir: &'a Path,
    pub(crate) job: &'a str,
    pub(crate) run_id: &'a str,
    /// Stops the server's clients (the gym) when the server dies.
    pub(crate) interrupt_clients: container::InterruptClients,
}

/// Where the agent finds the model, and what keeps it alive.
pub(crate) struct Endpoint {
    /// OpenAI base URL, e.g. `http://127.0.0.1:41234/v1`; shown without credentials.
    pub(crate) base_url: SecretUrl,
    /// Per-run key, given to the agent by environment (never argv or reports).
    pub(crate) api_key: Option<String>,
    server: Option<sim::Server>,
    lease: Option<container::Lease>,
}

impl Endpoint {
    /// The container serving it (docker backend).
    pub(crate) fn container(&self) -> Option<&container::pool::Container> {
        self.lease.as_ref().map(|l| &l.container)
    }

    /// The model and adapter folders the container mounted for this job.
    pub(crate) fn container_dirs(&self) -> Option<(std::path::PathBuf, Option<std::path::PathBuf>)> {
        self.lease.as_ref().map(|l| (l.model_host.clone(), l.adapter_host.clone()))
    }

    /// What the run calls when its cases stopped reaching the server: a container's
    /// watch restarts it; for another server nothing here (the run ends invalid).
    pub(crate) fn silence_hook(&self) -> Box<dyn FnMut() + Send> {
        match &self.lease {
            Some(lease) => lease.silence_hook(),
            None => Box::new(|| {}),
        }
    }

    /// Whether a container serves it (restarted on a death) rather than a server of its
    /// own that nothing here can bring back.
    pub(crate) fn is_restartable(&self) -> bool {
        self.lease.is_some()
    }

    /// After a gym pass: true when the server was restarted and the gym must resume.
    pub(crate) async fn after_gym(&self) -> anyhow::Result<bool> {
        match &self.lease {
            Some(lease) => lease.after_gym().await,
            None => Ok(false),
        }
    }

    /// Stops the in-process server, or hands the container back to the pool (which
    /// saves its log into the run directory). Docker: what happened to the server.
    pub(crate) async fn down(mut self, pool: &container::Pool) -> anyhow::Result<Option<ModelServerFacts>> {
        if let Some(server) = self.server.take() {
            server.shutdown().await?;
        }
        match self.lease.take() {
            Some(lease) => Ok(Some(pool.release(lease).await?)),
            None => Ok(None),
        }
    }
}

pub(crate) async fn up(server: &ServerSetup, truth_file: &Path, ctx: &UpContext<'_>) -> Result<Endpoint, AcquireError> {
    let model = &server.model;
    match server.backend() {
        Backend::Sim => {
            let truth = sim::Truth::load(truth_file)?;
            let api_key = util::new_api_key();
            let settings = sim::SimSettings {
                config: server.sim.clone().unwrap_or_default(),
                truth: Arc::new(truth),
                served_name: model.served_name.clone(),
                adapters: server.adapter.iter().map(|a| a.name.clone()).collect(),
                api_key: Some(api_key.clone()),
            };
            let server = sim::Server::start(settings, "127.0.0.1:0".parse().expect("valid address"))
                .await
                .context("starting the simulated model")?;
            Ok(Endpoint {
                base_url: SecretUrl::own(server.base_url()),
                api_key: Some(api_key),
                server: Some(server),
                lease: None,
            })
        }
        Backend::External => {
            let url = model.url.clone().context("backend \"external\" needs model.url")?;
            let api_key = match &model.api_key_env {
                Some(var) => Some(std::env::var(var).with_context(|| {
                    format!("{}: model.api_key_env names {var}, which is not set", server.spec_file.display())
                })?),
                None => None,
            };
            Ok(Endpoint { base_url: url, api_key, server: None, lease: None })
        }
        Backend::Docker => {
            let request = container::Request {
                server,
                truth_file,
                run_dir: ctx.run_dir,
                job: ctx.job,
                run_id: ctx.run_id,
                interrupt_clients: ctx.interrupt_clients.clone(),
            };
            let lease = ctx.pool.acquire(&request).await?;
            Ok(Endpoint {
                base_url: SecretUrl::own(lease.base_url()),
                api_key: Some(lease.container.api_key.clone()),
                server: None,
                lease: Some(lease),
            })
        }
    }
}
