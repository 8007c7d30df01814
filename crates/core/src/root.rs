//! The bench root: a folder holding `pruefstand.toml`, `versions/`, `profiles/` and
//! `reports/` (the repository itself is one). Found from `--root`, `PRUEFSTAND_ROOT`,
//! or by walking up from the current directory.
//!
//! This module locates the root, reads its config and makes a new one from the
//! examples a package installs ([`create`]); what lives inside belongs to `spec`,
//! `plan` and `rundir`.

use std::path::{Path, PathBuf};

use crate::input;
use crate::settings::Config;
use crate::util;
use anyhow::{Context, bail};

pub const CONFIG_FILE: &str = "pruefstand.toml";

/// The bench root `pruefstand init` makes without a folder, relative to the home
/// folder: the packaged systemd units run the daemon on `%h/pruefstand`.
pub const HOME_ROOT: &str = "pruefstand";

/// What a new bench root is made of, copied from the examples: the config file and the
/// version and plan folders (`reports/` starts empty).
pub(crate) const TEMPLATE: [&str; 3] = [CONFIG_FILE, "versions", "profiles"];

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
            crate::input::read_config(&config_path).with_context(|| format!("reading {}", config_path.display()))?;
        let config = input::parse_toml(&config_path, &text)?;
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

    /// This bench's key for identities of secrets (`.pruefstand/identity.key`, 32
    /// random bytes, user-only), made on first use: provenance's model-URL identity is
    /// an HMAC under it, equal across this bench's runs for the same URL and useless
    /// for guessing to anyone without the key.
    pub fn identity_key(&self) -> anyhow::Result<Vec<u8>> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = self.path.join(".pruefstand");
        let path = dir.join("identity.key");
        if let Ok(key) = std::fs::read(&path) {
            return Ok(key);
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // Written aside and linked into place, so two first runs agree on one key.
        let fresh = dir.join(format!("identity.key.{}", std::process::id()));
        let key: [u8; 32] = rand::RngExt::random(&mut rand::rng());
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&fresh)
            .with_context(|| format!("creating {}", fresh.display()))?;
        std::io::Write::write_all(&mut file, &key).with_context(|| format!("writing {}", fresh.display()))?;
        let linked = std::fs::hard_link(&fresh, &path);
        let _ = std::fs::remove_file(&fresh);
        match linked {
            Ok(()) => Ok(key.to_vec()),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
            }
            Err(err) => Err(err).with_context(|| format!("creating {}", path.display())),
        }
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

/// Makes a bench root in `dir` (created if missing) from the examples in `from`: its
/// `pruefstand.toml`, `versions/*.toml`, `profiles/*.toml`, and an empty `reports/`.
/// Refuses, before writing anything, when `dir` already holds any of these: an
/// existing root is never overwritten. The config is written user-only, as `check`
/// wants once it holds hooks. Returns the files written.
pub fn create(dir: &Path, from: &Path) -> anyhow::Result<Vec<PathBuf>> {
    for name in TEMPLATE {
        let source = from.join(name);
        anyhow::ensure!(
            source.exists(),
            "{} is missing: {} holds no bench root examples (pass --from DIR)",
            source.display(),
            from.display()
        );
    }
    for name in TEMPLATE.iter().copied().chain(["reports"]) {
        let target = dir.join(name);
        if target.symlink_metadata().is_ok() {
            bail!(
                "{} exists: {} is (part of) a bench root already, and init overwrites nothing; pick another folder",
                target.display(),
                dir.display()
            );
        }
    }
    let mut written = Vec::new();
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    written.push(copy_new(&from.join(CONFIG_FILE), &dir.join(CONFIG_FILE), 0o600)?);
    for sub in ["versions", "profiles"] {
        let (source, target) = (from.join(sub), dir.join(sub));
        std::fs::create_dir(&target).with_context(|| format!("creating {}", target.display()))?;
        let mut names: Vec<_> = std::fs::read_dir(&source)
            .with_context(|| format!("reading {}", source.display()))?
            .flatten()
            .map(|e| e.file_name())
            // Specs and plans, and the chat templates and tool-parser plugins specs name
            // beside them.
            .filter(|n| [".toml", ".jinja", ".py"].iter().any(|end| n.to_string_lossy().ends_with(end)))
            .collect();
        names.sort();
        for name in names {
            written.push(copy_new(&source.join(&name), &target.join(&name), 0o644)?);
        }
    }
    let reports = dir.join("reports");
    std::fs::create_dir(&reports).with_context(|| format!("creating {}", reports.display()))?;
    Ok(written)
}

/// Copies one file to a path that must not exist yet (`create_new`: a file that
/// appeared meanwhile is an error, not overwritten).
fn copy_new(source: &Path, target: &Path, mode: u32) -> anyhow::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let text = std::fs::read(source).with_context(|| format!("reading {}", source.display()))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(target)
        .with_context(|| format!("creating {}", target.display()))?;
    file.write_all(&text).with_context(|| format!("writing {}", target.display()))?;
    Ok(target.to_path_buf())
}

/// The last path component, as the run id.
pub fn run_id(run_dir: &Path) -> String {
    run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
