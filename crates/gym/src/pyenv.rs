//! The managed Python environment the gym runs in: finds a Python 3.10–3.12, creates a
//! venv with the pinned agentdojo (`scripts/requirements.txt`) on first use, and writes
//! the embedded gym scripts beside it. Reused on every later call.
//!
//! It also asks the venv what it offers: the installed AgentDojo's [`Inventory`] of
//! suites, tasks and attacks (plans are checked against it) and the ground-truth export
//! the simulated model follows — both cached per benchmark version. Running a plan's
//! cases is `gym`'s.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use pruefstand_core::inventory::Inventory;
use pruefstand_core::util;

include!(concat!(env!("OUT_DIR"), "/gym_files.rs"));

/// The agentdojo release the gym is written against; its API is checked at start-up (`dojo.check_api`).
pub const AGENTDOJO_VERSION: &str = "0.1.35";

/// A ready venv plus the gym scripts written out for it.
#[derive(Clone, Debug)]
pub struct PyEnv {
    pub python: PathBuf,
    pub scripts: PathBuf,
    pub cache: PathBuf,
}

impl PyEnv {
    /// What the installed AgentDojo offers for `benchmark_version` (cached per version).
    pub fn inventory(&self, benchmark_version: &str) -> anyhow::Result<Inventory> {
        let value = self
            .gym_json_cached(
                &format!("inventory-{benchmark_version}"),
                &["inventory", "--benchmark-version", benchmark_version],
            )
            .context("listing AgentDojo's suites")?;
        serde_json::from_value(value).context("reading the gym's inventory")
    }

    /// The venv, created if missing (with progress on stderr).
    pub fn ensure() -> anyhow::Result<PyEnv> {
        pruefstand_core::blocking::assert_may_block("PyEnv::ensure (a flock, maybe the pip build)");
        let venv = venv_dir()?;
        let requirements = gym_file("requirements.txt")?;
        let ready_marker = venv.join(".pruefstand-ready");
        let want = util::sha256_hex(requirements);
        if std::fs::read_to_string(&ready_marker).ok().as_deref() != Some(want.as_str()) {
            std::fs::create_dir_all(venv.parent().unwrap_or(Path::new("/")))?;
            // Several tests (or a daemon and a user) may arrive at once: one creates, the
            // others wait for it.
            let lock_path = venv.with_extension("lock");
            let lock_file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .with_context(|| format!("opening {}", lock_path.display()))?;
            let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| e)
                .with_context(|| format!("locking {}", lock_path.display()))?;
            if std::fs::read_to_string(&ready_marker).ok().as_deref() != Some(want.as_str()) {
                create_venv(&venv, requirements)?;
                util::write_atomic(&ready_marker, want.as_bytes())?;
            }
        }
        let python = venv.join("bin/python");
        let scripts = write_scripts(&venv)?;
        let cache = venv.join("cache");
        std::fs::create_dir_all(&cache)?;
        Ok(PyEnv { python, scripts, cache })
    }

    /// `python gym.py ARGS…` as a command (not started). The working directory is left
    /// as the caller's: never the agentdojo package folder, whose `types.py` would
    /// shadow the standard library.
    pub fn gym_command(&self) -> Command {
        let mut cmd = Command::new(&self.python);
        util::minimal_env(&mut cmd);
        cmd.arg(self.scripts.join("gym.py"));
        cmd.env("PYTHONUNBUFFERED", "1").env("PYTHONDONTWRITEBYTECODE", "1");
        // The gym, its workers and their agents end with us (each layer sets the same).
        util::die_with_parent(&mut cmd);
        cmd
    }

    /// Runs a gym subcommand that prints one JSON document, cached under `cache_key`
    /// (the answers only change with the scripts, which are part of the cache path).
    pub(crate) fn gym_json_cached(&self, cache_key: &str, args: &[&str]) -> anyhow::Result<serde_json::Value> {
        pruefstand_core::blocking::assert_may_block("a gym subcommand's wait");
        let cache_file = self.cache.join(format!("{cache_key}.json"));
        if let Ok(text) = std::fs::read_to_string(&cache_file)
            && let Ok(value) = serde_json::from_str(&text)
        {
            return Ok(value);
        }
        let output = self
            .gym_command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", self.python.display()))?;
        if !output.status.success() {
            bail!("{}", String::from_utf8_lossy(&output.stderr).trim());
        }
        let value: serde_json::Value = serde_json::from_slice(&output.stdout)
            .with_context(|| format!("gym {} printed no JSON", args.join(" ")))?;
        util::write_atomic(&cache_file, &output.stdout)?;
        Ok(value)
    }
}

/// The venv as it is, creating nothing (for `check`): its python and the installed
/// agentdojo version, or why there is none usable.
pub fn inspect() -> anyhow::Result<(PathBuf, String)> {
    let venv = venv_dir()?;
    let python = venv.join("bin/python");
    if !python.exists() {
        bail!("no venv at {}", venv.display());
    }
    let want = util::sha256_hex(gym_file("requirements.txt")?);
    if std::fs::read_to_string(venv.join(".pruefstand-ready")).ok().as_deref() != Some(want.as_str()) {
        bail!("the venv at {} is incomplete (an interrupted setup?)", venv.display());
    }
    let output = Command::new(&python)
        .args(["-c", "import importlib.metadata as m; print(m.version('agentdojo'))"])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !output.status.success() {
        bail!("agentdojo is not installed in {}", venv.display());
    }
    Ok((python, String::from_utf8_lossy(&output.stdout).trim().to_string()))
}

/// `$PRUEFSTAND_VENV`, else `$XDG_CACHE_HOME/pruefstand/venv-agentdojo-<ver>-<hash>`
/// (default `~/.cache`). The hash of the requirements makes a new pin a new venv.
fn venv_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("PRUEFSTAND_VENV") {
        return Ok(PathBuf::from(dir));
    }
    let cache = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(std::env::var_os("HOME").context("neither XDG_CACHE_HOME nor HOME is set")?).join(".cache")
        }
    };
    let hash = util::sha256_hex(gym_file("requirements.txt")?);
    Ok(cache.join("pruefstand").join(format!("venv-agentdojo-{AGENTDOJO_VERSION}-{}", &hash[..8])))
}

fn gym_file(rel: &str) -> anyhow::Result<&'static [u8]> {
    GYM_FILES
        .iter()
        .find(|(path, _)| *path == rel)
        .map(|(_, bytes)| *bytes)
        .with_context(|| format!("scripts/{rel} was not embedded in this build"))
}

/// Writes the embedded scripts into a folder named by their hash (so two builds never
/// mix files), once.
fn write_scripts(venv: &Path) -> anyhow::Result<PathBuf> {
    let mut all = Vec::new();
    for (path, bytes) in GYM_FILES {
        all.extend_from_slice(path.as_bytes());
        all.extend_from_slice(bytes);
    }
    let dir = venv.join(format!("gym-{}", &util::sha256_hex(&all)[..12]));
    if dir.join(".complete").exists() {
        return Ok(dir);
    }
    for (path, bytes) in GYM_FILES {
        util::write_atomic(&dir.join(path), bytes)?;
    }
    util::write_atomic(&dir.join(".complete"), b"")?;
    Ok(dir)
}

/// A Python 3.10–3.12 (agentdojo's cachebox dependency has no wheels for 3.13+).
pub fn find_python() -> anyhow::Result<PathBuf> {
    let candidates: Vec<String> = match std::env::var("PRUEFSTAND_PYTHON") {
        Ok(explicit) => vec![explicit],
        Err(_) => ["python3.12", "python3.11", "python3.10", "python3"].map(String::from).to_vec(),
    };
    let mut seen = Vec::new();
    for candidate in &candidates {
        let Ok(out) = Command::new(candidate)
            .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
            .stderr(Stdio::null())
            .output()
        else {
            continue;
        };
        if !out.status.success() {
            continue;
        }
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if matches!(version.as_str(), "3.10" | "3.11" | "3.12") {
            return Ok(PathBuf::from(candidate));
        }
        seen.push(format!("{candidate} is {version}"));
    }
    bail!(
        "no Python 3.10–3.12 found (tried {}{}); install one (e.g. `apt-get install python3.11 python3.11-venv`) or point PRUEFSTAND_PYTHON at it",
        candidates.join(", "),
        if seen.is_empty() { String::new() } else { format!("; {}", seen.join(", ")) }
    )
}

/// Written into a venv right after `python -m venv` made it: the proof that the folder
/// is pruefstand's to replace (docs/architecture.md, "Ownership").
const OWNER_MARKER: &str = ".pruefstand-venv";

/// Removes `venv` only if pruefstand made it: its owner marker (or the ready marker of
/// earlier versions) is there, checked right before the delete; a link is never
/// followed. Anything else at that path is the user's, and an error names it.
fn remove_own_venv(venv: &Path) -> anyhow::Result<()> {
    let meta = match std::fs::symlink_metadata(venv) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        other => other.with_context(|| format!("inspecting {}", venv.display()))?,
    };
    let ours = meta.is_dir()
        && [OWNER_MARKER, ".pruefstand-ready"]
            .iter()
            .any(|m| venv.join(m).symlink_metadata().is_ok_and(|m| m.is_file()));
    let empty = meta.is_dir() && std::fs::read_dir(venv).is_ok_and(|mut d| d.next().is_none());
    if !ours && !empty {
        bail!(
            "{} exists and is not a venv pruefstand made (no {OWNER_MARKER} in it): left untouched; move it away, or \
             point PRUEFSTAND_VENV at a new folder",
            venv.display()
        );
    }
    std::fs::remove_dir_all(venv).with_context(|| format!("removing the incomplete venv {}", venv.display()))
}

fn create_venv(venv: &Path, requirements: &[u8]) -> anyhow::Result<()> {
    let python = find_python()?;
    remove_own_venv(venv)?;
    tracing::info!(
        "first use — creating the Python venv with agentdojo {AGENTDOJO_VERSION} in {} (about a minute)",
        venv.display()
    );
    let status = Command::new(&python)
        .args(["-m", "venv"])
        .arg(venv)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("running {} -m venv", python.display()))?;
    if !status.success() {
        bail!(
            "`{} -m venv {}` failed; on Debian install the venv module (`apt-get install python3-venv`)",
            python.display(),
            venv.display()
        );
    }
    util::write_atomic(&venv.join(OWNER_MARKER), b"made by pruefstand; it may replace this folder\n")?;
    let req_path = venv.join("requirements.txt");
    std::fs::write(&req_path, requirements)?;
    let pinned = String::from_utf8_lossy(requirements)
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .count();
    tracing::info!("installing agentdojo=={AGENTDOJO_VERSION} and its pinned dependencies ({pinned} packages)");
    let started = std::time::Instant::now();
    let mut child = Command::new(venv.join("bin/python"))
        .args(["-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", "-r"])
        .arg(&req_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running pip")?;
    let stdout = child.stdout.take().context("pip's stdout")?;
    let mut stderr = child.stderr.take().context("pip's stderr")?;
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    follow_pip(stdout, pinned, started);
    let status = child.wait().context("waiting for pip")?;
    let errors = errors.join().unwrap_or_default();
    if !status.success() {
        let _ = remove_own_venv(venv);
        bail!(
            "installing agentdojo=={AGENTDOJO_VERSION} into {} failed (is PyPI reachable?):\n{}",
            venv.display(),
            errors.trim()
        );
    }
    tracing::info!("venv ready ({})", elapsed(started));
    Ok(())
}

/// How long pip may say nothing before the bench says it is still at work.
const PIP_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(15);

/// pip's own lines, condensed into a few progress lines (a minute or two of pip
/// would otherwise look like a hang): every tenth package collected, the start of the
/// install, and while pip is silent a line every [`PIP_HEARTBEAT`] with the time so far.
/// Reads until pip closes its stdout.
fn follow_pip(stdout: std::process::ChildStdout, pinned: usize, started: std::time::Instant) {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut progress = PipProgress { pinned, collected: 0, installing: false };
    loop {
        match rx.recv_timeout(PIP_HEARTBEAT) {
            Ok(line) => {
                if let Some(said) = progress.line(&line) {
                    tracing::info!("pip: {said}, {}", elapsed(started));
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => tracing::info!(
                "pip: still {}, {}",
                if progress.installing { "installing" } else { "collecting" },
                elapsed(started)
            ),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// What pip's lines said so far, and which of them is worth a progress line.
struct PipProgress {
    pinned: usize,
    collected: usize,
    installing: bool,
}

impl PipProgress {
    /// The progress line one of pip's lines is worth, if any.
    fn line(&mut self, line: &str) -> Option<String> {
        if let Some(package) = line.strip_prefix("Collecting ") {
            self.collected += 1;
            let package = package.split_whitespace().next().unwrap_or(package);
            let of = if self.collected <= self.pinned { format!(" of {}", self.pinned) } else { String::new() };
            return (self.collected == 1 || self.collected.is_multiple_of(10))
                .then(|| format!("{}{of} packages collected ({package})", self.collected));
        }
        if let Some(packages) = line.strip_prefix("Installing collected packages: ") {
            self.installing = true;
            let n = packages.split(',').filter(|p| !p.trim().is_empty()).count();
            return Some(format!("every package collected; installing {n} packages"));
        }
        line.starts_with("Successfully installed ").then(|| "installed".to_string())
    }
}

/// `42 s`, `1 min 32 s`: time since `started`, for a person.
fn elapsed(started: std::time::Instant) -> String {
    let s = started.elapsed().as_secs();
    if s < 60 { format!("{s} s") } else { format!("{} min {} s", s / 60, s % 60) }
}
/// The ground-truth export (docs/protocol.md §3), cached; returns the file's path so a
/// simulator (in-process or in a container) can load it.
pub fn truth_file(pyenv: &PyEnv, benchmark_version: &str) -> anyhow::Result<PathBuf> {
    let key = format!("truth-{benchmark_version}");
    pyenv
        .gym_json_cached(&key, &["truth", "--benchmark-version", benchmark_version])
        .context("exporting the tasks' ground truth")?;
    Ok(pyenv.cache.join(format!("{key}.json")))
}

/// The manifest's reader, the one `build.rs` embeds by: here for the tests that check
/// the embedded list against the manifest.
#[cfg(test)]
#[path = "../gym_manifest.rs"]
mod gym_manifest;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pips_lines_condense_to_a_line_every_tenth_package_and_the_install() {
        let mut progress = PipProgress { pinned: 12, collected: 0, installing: false };
        let said: Vec<String> = [
            "Collecting agentdojo==0.1.35 (from -r requirements.txt (line 1))",
            "  Using cached agentdojo-0.1.35-py3-none-any.whl.metadata (8.9 kB)",
        ]
        .into_iter()
        .chain(std::iter::repeat_n("Collecting idna==3.20 (from -r r.txt (line 2))", 12))
        .chain(["Installing collected packages: idna, agentdojo", "Successfully installed agentdojo-0.1.35 idna-3.20"])
        .filter_map(|l| progress.line(l))
        .collect();
        assert_eq!(
            said,
            [
                "1 of 12 packages collected (agentdojo==0.1.35)",
                "10 of 12 packages collected (idna==3.20)",
                "every package collected; installing 2 packages",
                "installed"
            ]
        );
        assert!(progress.installing);
    }

    fn scripts() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
    }

    fn embedded() -> Vec<&'static str> {
        GYM_FILES.iter().map(|(path, _)| *path).collect()
    }

    #[test]
    fn exactly_the_manifests_files_are_embedded() {
        let manifest = std::fs::read_to_string(scripts().join("gym.manifest")).unwrap();
        assert_eq!(embedded(), gym_manifest::parse(&manifest).unwrap());
        for (path, bytes) in GYM_FILES {
            assert_eq!(*bytes, std::fs::read(scripts().join(path)).unwrap().as_slice(), "{path}");
        }
    }

    #[test]
    fn the_tools_beside_the_gym_do_not_ship() {
        // Files in scripts/ that a deny-list by extension would have taken along.
        for stray in ["README.md", "custom_suites/README.md", "vllm-cpu/convert_model.py", "vllm-cpu/constraints.txt"] {
            assert!(scripts().join(stray).is_file(), "{stray} should exist for this test to mean something");
            assert!(!embedded().contains(&stray), "{stray} is embedded");
        }
        for tool in ["test", "bench", "faults", "package", "gym.manifest"] {
            assert!(!embedded().contains(&tool), "{tool} is embedded");
        }
    }

    /// A new module of the gym that the manifest forgets would fail at run time, far
    /// from its cause: every Python or JSON file in the gym's own folders is listed.
    #[test]
    fn every_file_of_the_gym_package_is_listed() {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() && !path.ends_with("__pycache__") {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "py" || e == "json" || e == "yaml") {
                    out.push(path);
                }
            }
        }
        let mut files = Vec::new();
        for folder in ["pruefstand_gym", "custom_suites", "examples"] {
            walk(&scripts().join(folder), &mut files);
        }
        assert!(files.len() > 20, "{files:?}");
        for file in files {
            let rel = file.strip_prefix(scripts()).unwrap().to_string_lossy().into_owned();
            assert!(embedded().contains(&rel.as_str()), "scripts/{rel} is not in scripts/gym.manifest");
        }
    }

    #[test]
    fn the_gyms_entry_points_are_embedded() {
        for needed in ["gym.py", "requirements.txt", "pruefstand_gym/runner.py", "selftest.py"] {
            assert!(gym_file(needed).is_ok(), "{needed}");
        }
        assert!(gym_file("bench").is_err());
    }
}
