//! The GPU guard: NVML through nvml-wrapper, opened on the first sample (never at
//! rest) and re-opened after a failure. Per GPU it asks for the compute processes and
//! the utilization; each query's NOT_SUPPORTED is handled on its own (utilization
//! unsupported → judged by processes alone, and said so). Memory is never queried:
//! Thor answers NOT_SUPPORTED to memory queries.
//!
//! Calls block; callers run [`GpuGuard::sample`] off the async executor.

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use super::{ForeignProcess, OwnProcesses};
use pruefstand_core::settings::{GpuConfig, Unavailable};

const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

pub(crate) struct GpuGuard {
    config: GpuConfig,
    nvml: Option<Nvml>,
}

/// One look at the GPUs.
#[derive(Debug, Default)]
pub(crate) struct GpuSample {
    pub(crate) blocking: Vec<String>,
    pub(crate) notes: Vec<String>,
    pub(crate) foreign: Vec<ForeignProcess>,
    /// A compute process list was read (what R1's exclusivity needs).
    pub(crate) observed: bool,
}

impl GpuSample {
    pub(crate) fn failed(reason: String) -> GpuSample {
        GpuSample { blocking: vec![reason], ..GpuSample::default() }
    }
}

/// What `check` reports about NVML.
#[derive(Debug)]
pub(crate) struct NvmlInfo {
    pub(crate) library: String,
    pub(crate) driver: Option<String>,
    /// (index, name, utilization supported?, process list supported?)
    pub(crate) devices: Vec<(u32, String, bool, bool)>,
}

impl GpuGuard {
    pub(crate) fn new(config: GpuConfig) -> GpuGuard {
        GpuGuard { config, nvml: None }
    }

    pub(crate) fn library(&self) -> String {
        self.config.library.as_ref().map_or(DEFAULT_LIBRARY.to_string(), |p| p.display().to_string())
    }

    fn open(&mut self) -> Result<&Nvml, String> {
        if self.nvml.is_none() {
            let library = self.library();
            let nvml = Nvml::builder()
                .lib_path(std::ffi::OsStr::new(&library))
                .init()
                .map_err(|e| format!("cannot load NVML from {library}: {}", nvml_error(&e)))?;
            self.nvml = Some(nvml);
        }
        Ok(self.nvml.as_ref().expect("opened above"))
    }

    /// Shuts NVML down (it is opened again by the next sample).
    pub(crate) fn close(&mut self) {
        self.nvml = None;
    }

    /// NVML's own description of itself and its GPUs, for `check`.
    pub(crate) fn info(&mut self) -> Result<NvmlInfo, String> {
        let library = self.library();
        let nvml = self.open()?;
        let driver = nvml.sys_driver_version().ok();
        let count = nvml.device_count().map_err(|e| format!("NVML cannot count GPUs: {}", nvml_error(&e)))?;
        let mut devices = Vec::new();
        for index in 0..count {
            let device =
                nvml.device_by_index(index).map_err(|e| format!("NVML cannot open GPU {index}: {}", nvml_error(&e)))?;
            let name = device.name().unwrap_or_else(|_| "?".into());
            let utilization = !matches!(device.utilization_rates(), Err(NvmlError::NotSupported));
            let processes = !matches!(device.running_compute_processes(), Err(NvmlError::NotSupported));
            devices.push((index, name, utilization, processes));
        }
        Ok(NvmlInfo { library, driver, devices })
    }

    pub(crate) fn sample(&mut self, own: &OwnProcesses) -> GpuSample {
        let policy = self.config.nvml;
        let unavailable = |reason: String| match policy {
            Unavailable::Block => GpuSample::failed(format!("no NVML: {reason}")),
            Unavailable::Ignore => {
                GpuSample { notes: vec![format!("no NVML (ignored by config): {reason}")], ..GpuSample::default() }
            }
        };
        let max = self.config.utilization_max;
        let nvml = match self.open() {
            Ok(nvml) => nvml,
            Err(reason) => return unavailable(reason),
        };
        let count = match nvml.device_count() {
            Ok(0) => return unavailable("NVML sees no GPU".into()),
            Ok(n) => n,
            Err(e) => {
                let reason = format!("NVML cannot count GPUs: {}", nvml_error(&e));
                self.nvml = None; // a driver reload needs a fresh init
                return unavailable(reason);
            }
        };
        let mut sampling = Sampling { own, max, policy, out: GpuSample::default(), reopen: false };
        for index in 0..count {
            match nvml.device_by_index(index) {
                Ok(device) => sampling.gpu(index, &device),
                Err(e) => {
                    sampling.out.blocking.push(format!("GPU {index}: NVML cannot open it: {}", nvml_error(&e)));
                    sampling.reopen = true;
                }
            }
        }
        if sampling.reopen {
            self.nvml = None;
        }
        sampling.out
    }
}

/// A sample being taken, GPU by GPU.
struct Sampling<'a> {
    own: &'a OwnProcesses,
    max: u32,
    policy: Unavailable,
    out: GpuSample,
    /// A query failed: NVML is opened afresh for the next sample.
    reopen: bool,
}

impl Sampling<'_> {
    fn gpu(&mut self, index: u32, device: &nvml_wrapper::Device<'_>) {
        let utilization = self.utilization(index, device);
        let processes = self.processes(index, device);
        let seen = utilization || processes;
        if !seen && !self.reopen {
            // Neither query is supported: this GPU cannot be guarded at all, which is
            // the same as having no NVML for it.
            let reason = format!("GPU {index}: NVML supports neither utilization nor the compute process list");
            match self.policy {
                Unavailable::Block => self.out.blocking.push(format!("no NVML: {reason}")),
                Unavailable::Ignore => self.out.notes.push(format!("no NVML (ignored by config): {reason}")),
            }
        }
    }

    /// Whether the GPU's utilization was read.
    fn utilization(&mut self, index: u32, device: &nvml_wrapper::Device<'_>) -> bool {
        let max = self.max;
        match device.utilization_rates() {
            Ok(u) => {
                if u.gpu > max {
                    self.out.blocking.push(format!("GPU {index} utilization {} % > {max} %", u.gpu));
                }
                return true;
            }
            Err(NvmlError::NotSupported) => {
                self.out.notes.push(format!("GPU {index}: utilization not supported: judged by compute processes only"))
            }
            Err(e) => {
                self.out.blocking.push(format!("GPU {index}: reading utilization failed: {}", nvml_error(&e)));
                self.reopen = true;
            }
        }
        false
    }

    /// Whether the GPU's compute processes were read.
    fn processes(&mut self, index: u32, device: &nvml_wrapper::Device<'_>) -> bool {
        match device.running_compute_processes() {
            Ok(processes) => {
                // R1 asks about foreign processes: only this query observes them.
                self.out.observed = true;
                for p in processes.into_iter().filter(|p| !self.own.contains(p.pid)) {
                    let foreign = ForeignProcess { gpu: index, pid: p.pid, name: process_name(p.pid) };
                    self.out.blocking.push(foreign.describe());
                    self.out.foreign.push(foreign);
                }
                return true;
            }
            Err(NvmlError::NotSupported) => self
                .out
                .notes
                .push(format!("GPU {index}: compute process list not supported: judged by utilization only")),
            Err(e) => {
                self.out.blocking.push(format!("GPU {index}: reading compute processes failed: {}", nvml_error(&e)));
                self.reopen = true;
            }
        }
        false
    }
}

/// nvml-wrapper's errors, in words a user can act on.
fn nvml_error(err: &NvmlError) -> String {
    match err {
        NvmlError::LibloadingError(e) => {
            format!("{e} (is the NVIDIA driver installed? set [guard.gpu] library to its libnvidia-ml.so.1)")
        }
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".into(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".into(),
        other => other.to_string(),
    }
}

/// The process's short name; NVML's pids are the host's, so /proc usually has it.
fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim().to_string()).unwrap_or_else(|_| "?".into())
}
