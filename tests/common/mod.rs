//! The test bench builder: a fresh bench root in a temporary folder (the repo's
//! pruefstand.toml, versions/ and profiles/ copied in) and the real `pruefstand`
//! binary driven against it, so each test reads like a user's session.
//!
//! Commands run with the repository as working directory, so agent commands such as
//! `python3 scripts/examples/agent_counter.py` resolve as in the README.

#![allow(dead_code)]

pub mod docker;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_pruefstand");

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub struct Bench {
    dir: tempfile::TempDir,
}

impl Bench {
    pub fn new() -> Bench {
        let dir = tempfile::Builder::new().prefix("pruefstand-test-").tempdir().expect("temp dir");
        std::fs::copy(repo().join("pruefstand.toml"), dir.path().join("pruefstand.toml")).unwrap();
        for sub in ["versions", "profiles"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
            for entry in std::fs::read_dir(repo().join(sub)).unwrap().flatten() {
                std::fs::copy(entry.path(), dir.path().join(sub).join(entry.file_name())).unwrap();
            }
        }
        Bench { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `pruefstand --root <bench> ARGS…`, not yet run.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--root").arg(self.path()).args(args).current_dir(repo()).stdin(Stdio::null());
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Run {
        Run::from(self.cmd(args).output().expect("pruefstand runs"))
    }
}

/// A finished command with its output as text.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Run {
    pub fn ok(self) -> Run {
        assert_eq!(self.code, Some(0), "expected success\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }

    pub fn code(self, code: i32) -> Run {
        assert_eq!(self.code, Some(code), "expected exit {code}\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }

    /// The run directory: the last stdout line that names an existing folder.
    pub fn run_dir(&self) -> PathBuf {
        self.stdout
            .lines()
            .rev()
            .map(PathBuf::from)
            .find(|p| p.is_dir())
            .unwrap_or_else(|| panic!("no run directory printed\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr))
    }
}

/// `cases.jsonl` as JSON values.
pub fn cases(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("cases.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

/// (case_id, utility, security, error?) per case, sorted: what must match between
/// runs that should agree.
pub fn outcomes(run_dir: &Path) -> Vec<(String, serde_json::Value, serde_json::Value, bool)> {
    let mut out: Vec<_> = cases(run_dir)
        .into_iter()
        .map(|c| (c["case_id"].as_str().unwrap().to_string(), c["utility"].clone(), c["security"].clone(), !c["error"].is_null()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
