//! The seam between the daemon and the guards (GPU idle window over NVML, busy systemd
//! units over D-Bus — `crate::guard`). The daemon asks a [`Gate`] before every job and
//! keeps an [`Observation`] of the GPU while the job runs; the observation ends up in
//! `run.json` (`gpu`) and so in R1.
//!
//! [`Guarded`] is the gate over `guard::Guards`.

use std::sync::{Arc, Mutex};

use crate::guard::{Guards, OwnProcesses, Watch};
use pruefstand_core::record::GpuExclusivity;
use pruefstand_core::util;

#[allow(async_fn_in_trait)]
pub(super) trait Gate {
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
pub(super) trait Observation: Send + Sync {
    fn exclusivity(&self) -> GpuExclusivity;
}

/// The guards: the GPU idle window and busy units before a job, a watch during it.
pub(super) struct Guarded {
    guards: Guards,
}

impl Guarded {
    pub(crate) fn new(guards: Guards) -> Guarded {
        Guarded { guards }
    }
}

/// A running watch; dropping the observation stops its sampling.
struct Watching(Mutex<Watch>);

impl Observation for Watching {
    fn exclusivity(&self) -> GpuExclusivity {
        util::lock(&self.0).exclusivity()
    }
}

impl Gate for Guarded {
    async fn wait_clear(&mut self, on_status: &mut dyn FnMut(&str)) -> anyhow::Result<()> {
        let mut last = String::new();
        self.guards
            .wait_until_clear(&ours(), |status| {
                let line = status.line();
                if line != last {
                    on_status(&line);
                    last = line;
                }
            })
            .await;
        // NVML and the buses are only held while waiting or watching, never at rest.
        self.guards.release().await;
        Ok(())
    }

    fn watch(&mut self) -> Arc<dyn Observation> {
        Arc::new(Watching(Mutex::new(self.guards.watch(ours()))))
    }
}

/// Our model containers (a warm one kept from the last job, the job's own once it is
/// created) are never foreign.
fn ours() -> OwnProcesses {
    OwnProcesses::none().with_containers_from(crate::container::created_ids)
}
