//! The bench root: a folder holding `pruefstand.toml`, `versions/`, `profiles/` and
//! `reports/` (the repository itself is one). Found from `--root`, `PRUEFSTAND_ROOT`,
//! or by walking up from the current directory.
//!
//! This module only locates the root and reads its config; what lives inside belongs
//! to `spec`, `plan` and `rundir`.

use std::path::{Path, PathBuf};

use crate::settings::Config;
use crate::util;
use anyhow::{Context, bail};

pub const CONFIG_FILE: &str = "pruefstand.toml";

#[derive(Debug, Clone)]
pub struct Root {
    pub path: PathBuf,
    pub config: Config,
}

impl Root {
    pub fn find(explicit: Option<PathBuf>) -> anyhow::Result<Root> {
        let path = match explicit {
            Some(path) => {
                if !path.join(CONFIG_FILE).is_file() {
                    bail!("{} is not a bench root: it has no {CONFIG_FILE}", path.display());
                }
                path
            }
            None => {
                let cwd = std::env::current_dir().context("reading the current directory")?;
                match cwd.ancestors().find(|dir| dir.join(CONFIG_FILE).is_file()) {
                    Some(dir) => dir.to_path_buf(),
                    None => bail!(
                        "no bench root: neither {} nor a parent holds a {CONFIG_FILE}; pass --root DIR or set PRUEFSTAND_ROOT",
                        cwd.display()
                    ),
                }
            }
        };
        let path = path.canonicalize().with_context(|| format!("resolving {}", path.display()))?;
        let config_path = path.join(CONFIG_FILE);
        let text =
            crate::util::read_config(&config_path).with_context(|| format!("reading {}", config_path.display()))?;
        let config = util::parse_toml(&config_path, &text)?;
        Ok(Root { path, config })
    }

    pub fn reports(&self) -> PathBuf {
        self.path.join(&self.config.paths.reports)
    }

    /// What runs learn about this machine (`state/capacity/`: per served model).
    /// `.pruefstand/locks/<name>.lock`, its folder created: the bench lock and the
    /// reference locks live there, beside the queue (`reports/` holds run directories
    /// only).
    pub fn lock_file(&self, name: &str) -> anyhow::Result<PathBuf> {
        let dir = self.path.join(".pruefstand/locks");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir.join(format!("{name}.lock")))
    }

    pub fn state(&self) -> PathBuf {
        self.path.join("state")
    }

    pub fn versions(&self) -> PathBuf {
        self.path.join("versions")
    }

    /// A fresh run directory `reports/<name>/<plan>/<UTC timestamp>-<id>/`.
    pub fn new_run_dir(&self, name: &str, plan: &str) -> PathBuf {
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
        let id = &util::sha256_hex(
            format!("{name}{plan}{}{}", std::process::id(), chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0))
                .as_bytes(),
        )[..6];
        self.reports().join(name).join(plan).join(format!("{stamp}-{id}"))
    }
}

/// The last path component, as the run id.
pub fn run_id(run_dir: &Path) -> String {
    run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
