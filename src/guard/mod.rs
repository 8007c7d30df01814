//! Guards: what must be clear before a job may use the shared GPU, and what is watched
//! while it runs. Two sources:
//!
//! - `gpu`: NVML (nvml-wrapper). Idle = no compute process other than our own, and
//!   utilization ≤ a threshold. Thor answers memory queries NOT_SUPPORTED, so none is
//!   made; any other NOT_SUPPORTED answer is handled per query.
//! - `units`: systemd units matching configured patterns on the user and the system
//!   bus (zbus + zbus_systemd); any active one blocks.
//!
//! For the daemon: [`Guards::wait_until_clear`] before a job (N consecutive clear
//! samples at the interval), [`Guards::watch`] during it (its [`Watch::finish`] gives
//! R1's [`GpuExclusivity`]). Nothing here samples at rest: NVML is opened on the first
//! sample and D-Bus connected on demand; no task runs outside a wait or a watch, and
//! [`Guards::release`] closes both between jobs.
//!
//! Not here: deciding which jobs need the guards (the daemon), finding our container's
//! processes (the caller describes them as [`OwnProcesses`]), the report.

pub(crate) mod gpu;
#[cfg(test)]
mod tests;
pub(crate) mod units;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pruefstand_core::record::GpuExclusivity;
use pruefstand_core::settings::GuardConfig;
use pruefstand_core::util;

/// A sample waits this long for NVML; a hung driver then blocks with a reason.
const NVML_TIMEOUT: Duration = Duration::from_secs(10);

/// The processes that are ours (the model container's) and so never block or violate:
/// explicit pids, and/or every process in a Docker container's cgroup (vLLM starts
/// worker processes after start-up, so a pid list taken once would miss them).
#[derive(Clone, Debug, Default)]
pub(crate) struct OwnProcesses {
    pids: HashSet<u32>,
    containers: Vec<String>,
    /// Containers known only later (a model container created after a watch began):
    /// asked on every look.
    later: Option<fn() -> Vec<String>>,
}

impl OwnProcesses {
    pub(crate) fn none() -> OwnProcesses {
        OwnProcesses::default()
    }

    #[cfg(test)]
    pub(crate) fn pids(pids: impl IntoIterator<Item = u32>) -> OwnProcesses {
        OwnProcesses { pids: pids.into_iter().collect(), containers: Vec::new(), later: None }
    }

    /// Also counts the processes of every container `containers()` names when asked.
    pub(crate) fn with_containers_from(mut self, containers: fn() -> Vec<String>) -> OwnProcesses {
        self.later = Some(containers);
        self
    }

    /// Also counts every process whose `/proc/PID/cgroup` names this container (its
    /// full 64-hex id, as bollard returns it).
    #[cfg(test)]
    pub(crate) fn with_container(mut self, container_id: &str) -> OwnProcesses {
        self.containers.push(container_id.to_string());
        self
    }

    pub(crate) fn contains(&self, pid: u32) -> bool {
        if self.pids.contains(&pid) {
            return true;
        }
        let later = self.later.map(|containers| containers()).unwrap_or_default();
        if self.containers.is_empty() && later.is_empty() {
            return false;
        }
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else { return false };
        self.containers.iter().chain(&later).any(|id| cgroup_names_container(&text, id))
    }
}

impl From<HashSet<u32>> for OwnProcesses {
    fn from(pids: HashSet<u32>) -> Self {
        OwnProcesses { pids, containers: Vec::new(), later: None }
    }
}

/// Docker puts a container's processes in `…/docker-<id>.scope` (systemd driver) or
/// `…/docker/<id>` (cgroupfs driver): the full id appears as a path component piece.
/// Short ids are refused: a 3-character prefix would match unrelated paths.
fn cgroup_names_container(cgroup_text: &str, container_id: &str) -> bool {
    container_id.len() >= 12
        && cgroup_text.lines().any(|line| {
            line.rsplit(':').next().unwrap_or("").split('/').any(|part| {
                part == container_id
                    || part.strip_prefix("docker-").and_then(|p| p.strip_suffix(".scope")) == Some(container_id)
            })
        })
}

/// A compute process on the GPU that is not ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ForeignProcess {
    pub(crate) gpu: u32,
    pub(crate) pid: u32,
    /// From `/proc/PID/comm`; "?" when not visible (another PID namespace).
    pub(crate) name: String,
}

impl ForeignProcess {
    pub(crate) fn describe(&self) -> String {
        format!("foreign compute process {} ({}) on GPU {}", self.pid, self.name, self.gpu)
    }
}

/// A unit matching a busy pattern, in a busy state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BusyUnit {
    pub(crate) bus: units::Bus,
    pub(crate) name: String,
    pub(crate) active_state: String,
}

impl BusyUnit {
    pub(crate) fn describe(&self) -> String {
        format!("busy unit {} {} ({} bus)", self.name, self.active_state, self.bus)
    }
}

/// One look at everything guarded.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sample {
    /// Why a job may not start now, one human-readable line each ("GPU 0 utilization
    /// 87 % > 10 %", "foreign compute process 1234 (python3) on GPU 0", "busy unit
    /// training@x.service active (user bus)", "no NVML: …"). Empty = clear.
    pub(crate) blocking: Vec<String>,
    /// Worth showing but not blocking ("GPU 0 utilization not supported: judged by
    /// compute processes only", "no NVML (ignored): …").
    pub(crate) notes: Vec<String>,
    pub(crate) foreign_processes: Vec<ForeignProcess>,
    pub(crate) busy_units: Vec<BusyUnit>,
    /// Whether NVML listed the compute processes of at least one GPU (false: R1's
    /// exclusivity cannot be judged).
    pub(crate) gpu_observed: bool,
}

impl Sample {
    pub(crate) fn is_clear(&self) -> bool {
        self.blocking.is_empty()
    }
}

/// Progress of [`Guards::wait_until_clear`], for `status` and sd_notify STATUS lines.
#[derive(Clone, Debug)]
pub(crate) struct WaitStatus {
    pub(crate) sample: Sample,
    /// Consecutive clear samples so far, of `needed`.
    pub(crate) clear_samples: u32,
    pub(crate) needed: u32,
}

impl WaitStatus {
    /// One line: the blocking reasons, or the idle window's progress.
    pub(crate) fn line(&self) -> String {
        if self.sample.blocking.is_empty() {
            format!("guards clear ({} of {} samples)", self.clear_samples, self.needed)
        } else {
            format!("waiting: {}", self.sample.blocking.join("; "))
        }
    }
}

/// Both guards. Cheap to clone (shared state): a [`Watch`] holds a clone while the
/// daemon keeps its own for the next job.
#[derive(Clone)]
pub(crate) struct Guards {
    config: GuardConfig,
    // NVML calls block (briefly, but a sick driver can stall), so they run on the
    // blocking pool with the guard behind a std mutex.
    gpu: Arc<Mutex<gpu::GpuGuard>>,
    units: Arc<tokio::sync::Mutex<units::UnitGuard>>,
}

impl Guards {
    /// Opens nothing yet: NVML and D-Bus are first touched by a sample.
    pub(crate) fn new(config: &GuardConfig) -> Guards {
        Guards {
            config: config.clone(),
            gpu: Arc::new(Mutex::new(gpu::GpuGuard::new(config.gpu.clone()))),
            units: Arc::new(tokio::sync::Mutex::new(units::UnitGuard::new(config.units.clone()))),
        }
    }

    /// With explicit bus addresses instead of `DBUS_*_BUS_ADDRESS` (tests).
    #[cfg(test)]
    pub(crate) fn with_bus_addresses(config: &GuardConfig, user: Option<String>, system: Option<String>) -> Guards {
        let mut guards = Guards::new(config);
        guards.units =
            Arc::new(tokio::sync::Mutex::new(units::UnitGuard::at_addresses(config.units.clone(), user, system)));
        guards
    }

    /// Closes NVML and the bus connections until the next sample: for the daemon
    /// between jobs, so nothing of the guards stays open at rest.
    pub(crate) async fn release(&self) {
        util::lock(&self.gpu).close();
        self.units.lock().await.disconnect();
    }

    /// One sample of both guards, now.
    pub(crate) async fn sample(&self, own: &OwnProcesses) -> Sample {
        let gpu = {
            let guard = self.gpu.clone();
            let own = own.clone();
            tokio::task::spawn_blocking(move || {
                pruefstand_core::blocking::section(move || match guard.try_lock() {
                    Ok(mut gpu) => gpu.sample(&own),
                    Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().sample(&own),
                    // An earlier call still hangs inside the driver: report it instead of
                    // queueing behind it (and stalling `wait_until_clear`'s status).
                    Err(std::sync::TryLockError::WouldBlock) => {
                        gpu::GpuSample::failed("NVML has not answered an earlier call (driver hung?)".into())
                    }
                })
            })
        };
        let units = self.units.lock().await.sample().await;
        let gpu = match tokio::time::timeout(NVML_TIMEOUT, gpu).await {
            Ok(Ok(gpu)) => gpu,
            Ok(Err(err)) => gpu::GpuSample::failed(format!("GPU sampling failed: {err}")),
            Err(_) => gpu::GpuSample::failed(format!(
                "NVML gave no answer within {} s (driver hung?)",
                NVML_TIMEOUT.as_secs()
            )),
        };
        let mut sample = Sample {
            blocking: gpu.blocking,
            notes: gpu.notes,
            foreign_processes: gpu.foreign,
            busy_units: units.busy,
            gpu_observed: gpu.observed,
        };
        sample.blocking.extend(units.blocking);
        sample.notes.extend(units.notes);
        sample
    }

    /// Returns once `samples` consecutive samples (at the interval; the first now) were
    /// clear, with the last one. `on_status` sees every sample. Cancel by dropping the
    /// future (e.g. in a `select!` with SIGTERM): no state is left half-done.
    pub(crate) async fn wait_until_clear(&self, own: &OwnProcesses, mut on_status: impl FnMut(&WaitStatus)) -> Sample {
        let mut streak = 0;
        loop {
            let sample = self.sample(own).await;
            // The idle window is about GPU load; with no GPU to observe (NVML absent and
            // ignored) one clear look at the busy units is all there is to wait for.
            let needed = if sample.gpu_observed { self.config.gpu.samples } else { 1 };
            streak = if sample.is_clear() { streak + 1 } else { 0 };
            let status = WaitStatus { sample, clear_samples: streak, needed };
            on_status(&status);
            if streak >= needed {
                return status.sample;
            }
            tokio::time::sleep(self.config.gpu.interval()).await;
        }
    }

    /// Starts sampling in the background (now, then at the interval) until
    /// [`Watch::finish`]. Needs a tokio runtime.
    pub(crate) fn watch(&self, own: OwnProcesses) -> Watch {
        let events = Arc::new(Mutex::new(Events::default()));
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let guards = self.clone();
        let seen = events.clone();
        let task = tokio::spawn(async move {
            let mut interval = tokio::time::interval(guards.config.gpu.interval());
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stop_rx => break,
                    _ = interval.tick() => {
                        let sample = guards.sample(&own).await;
                        util::lock(&seen).record(&sample);
                    }
                }
            }
        });
        Watch { events, stop: Some(stop_tx), task: Some(task) }
    }
}

/// What a watch has seen; events are keyed so a process seen in 100 samples is one
/// event, with the time it was first seen.
#[derive(Default)]
struct Events {
    first_seen: BTreeMap<String, String>,
    order: Vec<String>,
    gpu_observed: bool,
    unobserved_samples: u32,
}

impl Events {
    fn record(&mut self, sample: &Sample) {
        self.gpu_observed |= sample.gpu_observed;
        if !sample.gpu_observed {
            self.unobserved_samples += 1;
        }
        let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
        let keys =
            sample.foreign_processes.iter().map(|p| p.describe()).chain(sample.busy_units.iter().map(|u| u.describe()));
        for key in keys {
            if !self.first_seen.contains_key(&key) {
                self.first_seen.insert(key.clone(), now.clone());
                self.order.push(key);
            }
        }
    }

    fn lines(&self) -> Vec<String> {
        self.order.iter().map(|k| format!("{k}, first seen {}", self.first_seen[k])).collect()
    }
}

/// A run being watched; dropping it stops the sampling ([`Watch::exclusivity`] is what
/// it saw).
pub(crate) struct Watch {
    events: Arc<Mutex<Events>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Watch {
    /// The events so far.
    #[cfg(test)]
    pub(crate) fn events(&self) -> Vec<String> {
        util::lock(&self.events).lines()
    }

    /// Stops sampling. `Violated` lists every foreign process and busy unit seen;
    /// `Exclusive` needs the GPU to have been observed; otherwise `NotObserved` (NVML
    /// absent and ignored).
    #[cfg(test)]
    pub(crate) async fn finish(mut self) -> GpuExclusivity {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let events = util::lock(&self.events);
        if events.unobserved_samples > 0 && events.gpu_observed {
            tracing::warn!("the GPU could not be observed in {} watch samples of this run", events.unobserved_samples);
        }
        drop(events);
        self.exclusivity()
    }

    /// What the watch has seen so far, as R1's input (the same rule as [`Watch::finish`]).
    pub(crate) fn exclusivity(&self) -> GpuExclusivity {
        let events = util::lock(&self.events);
        if !events.order.is_empty() {
            GpuExclusivity::Violated { events: events.lines() }
        } else if events.gpu_observed {
            GpuExclusivity::Exclusive
        } else {
            GpuExclusivity::NotObserved
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
