//! The fake NVML library (`tests/fixtures/fake_nvml.c`): compiled
//! once per source version with `cc`, then copied per test (dlopen shares one loaded
//! copy per inode, and the state file lives beside the copy). Point
//! `[guard.gpu] library` at [`FakeNvml::library`]. [`aarch64_library`] is the same
//! source built for arm64 (the Jetson's architecture), for the arm64 package's
//! container; [`NvmlState::render`] is its state file.
//!
//! Self-contained (no `super::`): unit tests in `src/guard` include it by `#[path]`.

#![allow(dead_code)]

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const SOURCE: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake_nvml.c"));

/// What the fake reports; written as its state file.
#[derive(Clone, Debug)]
pub struct NvmlState {
    pub gpus: u32,
    pub name: String,
    /// None = NOT_SUPPORTED.
    pub utilization: Option<u32>,
    /// (gpu index, pid, used memory bytes); None = NOT_SUPPORTED.
    pub processes: Option<Vec<(u32, u32, u64)>>,
}

impl Default for NvmlState {
    fn default() -> Self {
        NvmlState { gpus: 1, name: "Fake Thor".into(), utilization: Some(0), processes: Some(Vec::new()) }
    }
}

impl NvmlState {
    pub fn utilization(mut self, percent: u32) -> Self {
        self.utilization = Some(percent);
        self
    }

    pub fn process(mut self, gpu: u32, pid: u32) -> Self {
        self.processes.get_or_insert_with(Vec::new).push((gpu, pid, 512 << 20));
        self
    }

    /// The state file's text (`fake_nvml.state` beside the library).
    pub fn render(&self) -> String {
        let mut text = format!("gpus {}\nname {}\n", self.gpus, self.name);
        match self.utilization {
            Some(u) => text.push_str(&format!("utilization {u}\n")),
            None => text.push_str("utilization unsupported\n"),
        }
        match &self.processes {
            Some(list) => {
                list.iter().for_each(|(gpu, pid, mem)| text.push_str(&format!("process {gpu} {pid} {mem}\n")))
            }
            None => text.push_str("processes unsupported\n"),
        }
        text
    }
}

/// One test's copy of the fake library and its state file.
pub struct FakeNvml {
    dir: tempfile::TempDir,
}

impl FakeNvml {
    /// A fresh copy, idle (one GPU, 0 %, no processes).
    pub fn new() -> FakeNvml {
        let dir = tempfile::Builder::new().prefix("pruefstand-nvml-").tempdir().expect("temp dir for fake NVML");
        std::fs::copy(built(), dir.path().join("libnvidia-ml.so.1")).expect("copying the fake NVML");
        let fake = FakeNvml { dir };
        fake.set(&NvmlState::default());
        fake
    }

    pub fn library(&self) -> PathBuf {
        self.dir.path().join("libnvidia-ml.so.1")
    }

    /// Replaces the state atomically (the library re-reads it on every call).
    pub fn set(&self, state: &NvmlState) {
        let tmp = self.dir.path().join("fake_nvml.state.tmp");
        std::fs::write(&tmp, state.render()).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("fake_nvml.state")).unwrap();
    }
}

/// The compiled library, shared read-only by all tests of all test processes: built
/// into a folder named by the source's hash, published by rename.
fn built() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        compile(&cc, "libfake_nvml.so", "install gcc")
    })
}

/// The library built for aarch64 with Debian's cross compiler, as [`built`] is for
/// this machine: for the arm64 binary under emulation.
pub fn aarch64_library() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let lib = compile("aarch64-linux-gnu-gcc", "libfake_nvml.aarch64.so", "install gcc-aarch64-linux-gnu");
        let head = std::fs::read(&lib).unwrap();
        // ELF e_machine 183 = EM_AARCH64.
        assert_eq!(u16::from_le_bytes([head[18], head[19]]), 183, "{} is not an aarch64 library", lib.display());
        lib
    })
}

fn compile(cc: &str, name: &str, hint: &str) -> PathBuf {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    SOURCE.hash(&mut hasher);
    let dir = std::env::temp_dir().join(format!("pruefstand-fake-nvml-{:016x}", hasher.finish()));
    let lib = dir.join(name);
    if lib.is_file() {
        return lib;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.{}.c", std::process::id()));
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    std::fs::write(&src, SOURCE).unwrap();
    let out = Command::new(cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&tmp)
        .arg(&src)
        .arg("-ldl")
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{cc}` to build the fake NVML ({e}): {hint}"));
    assert!(out.status.success(), "building the fake NVML with {cc} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    std::fs::rename(&tmp, &lib).unwrap();
    let _ = std::fs::remove_file(&src);
    lib
}
