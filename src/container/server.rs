//! The version's spec projected into what its model server is made from, whatever the
//! backend: the `[model]`, `[adapter]` and `[sim]` tables, the files the server reads
//! (resolved on this machine), and which version it is. Built once where a run request
//! is resolved (`run`), beside the agent's and the defence's projections; the model
//! server's parts (`model::up`, the container pool, the preflight, provenance, `check`'s
//! vLLM warnings) take it, not the whole spec.
//!
//! Here, in `container`, because the container is the lowest of those parts: the
//! modules above it (`model`, `provenance`, `run`, `cmd`) may use it, not the reverse.

use std::path::PathBuf;

use pruefstand_core::settings::sim::SimConfig;
use pruefstand_core::spec::{AdapterSpec, Backend, ModelSpec, ServedFileKind, Version};

/// What a version's model server is made from.
#[derive(Clone, Debug)]
pub(crate) struct ServerSetup {
    /// The version's name: the container's name and label, provenance.
    pub(crate) name: String,
    /// The spec file, named by every error about the server's inputs.
    pub(crate) spec_file: PathBuf,
    /// The spec's hash, for provenance.
    pub(crate) spec_hash: String,
    pub(crate) model: ModelSpec,
    pub(crate) adapter: Option<AdapterSpec>,
    /// The simulated model's behaviour (backend "sim", or the sim image in Docker).
    pub(crate) sim: Option<SimConfig>,
    /// The files of the bench root's that the server reads (chat template, tool-parser
    /// plugin), resolved against the spec's folder, in `ServedFileKind::ALL`'s order.
    pub(crate) served_files: Vec<(ServedFileKind, PathBuf)>,
    /// A folder mounted read-only at `/adapters` for adapters loaded at run time
    /// (`runtime_lora`) that did not exist at start: an online training's
    /// (`train::online`), which loads each step's adapter from there. None elsewhere.
    pub(crate) lora_dir: Option<PathBuf>,
}

impl ServerSetup {
    pub(crate) fn of(version: &Version) -> ServerSetup {
        let spec = &version.spec;
        ServerSetup {
            name: version.name.clone(),
            spec_file: version.path.clone(),
            spec_hash: version.hash.clone(),
            model: spec.model.clone(),
            adapter: spec.adapter.clone(),
            sim: spec.sim.clone(),
            served_files: version.served_files(),
            lora_dir: None,
        }
    }

    pub(crate) fn backend(&self) -> Backend {
        *self.model.backend.get_ref()
    }
}
