//! The seam between the daemon and the guards (GPU idle window over NVML, busy systemd
//! units over D-Bus — `crate::guard`). The daemon asks a [`Gate`] before every job and
//! keeps an [`Observation`] of the GPU while the job runs; the observation ends up in
//! `run.json` (`gpu`) and so in R1.
//!
//! [`AlwaysClear`] is the gate of a build without guards. The guards plug in by
//! implementing `Gate` over `guard::Guards`: `wait_clear` → `wait_until_clear(own_pids,
//! on_status)`, `watch` → `Guards::watch(..)` wrapped so that `exclusivity()` calls the
//! watch's `finish()` once and caches it.

use std::sync::Arc;

use crate::judge::GpuExclusivity;

#[allow(async_fn_in_trait)]
pub trait Gate {
    /// Returns once a job may start. Calls `on_status` with a one-line reason ("GPU
    /// busy: utilization 63 % > 10 %", "busy unit training@3.service active") whenever
    /// what it waits for changes; the daemon publishes it (`pruefstand status`). The
    /// future is dropped when the daemon stops or the queue empties meanwhile, so it
    /// must hold nothing that needs cleaning up beyond `Drop`.
    async fn wait_clear(&mut self, on_status: &mut dyn FnMut(&str)) -> anyhow::Result<()>;

    /// Starts observing the GPU for the job about to start. The daemon drops the
    /// observation when the job ends, which should stop any sampling.
    fn watch(&mut self) -> Arc<dyn Observation>;
}

/// What the GPU guard saw while a job ran. Read (possibly more than once: a job can
/// record a reference run and its own) from the job's thread.
pub trait Observation: Send + Sync {
    fn exclusivity(&self) -> GpuExclusivity;
}

/// No guards: every job may start at once, and exclusivity is not observed.
pub struct AlwaysClear;

struct NotObserved;

impl Observation for NotObserved {
    fn exclusivity(&self) -> GpuExclusivity {
        GpuExclusivity::NotObserved
    }
}

impl Gate for AlwaysClear {
    async fn wait_clear(&mut self, _on_status: &mut dyn FnMut(&str)) -> anyhow::Result<()> {
        Ok(())
    }

    fn watch(&mut self) -> Arc<dyn Observation> {
        Arc::new(NotObserved)
    }
}
