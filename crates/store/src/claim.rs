//! Whose run a directory holds and who writes it now: `identity.json` names the
//! version, the plan and the benchmark version, and `--out` refuses a directory of
//! anything else; a run holds `run.lock` (flock) for as long as it writes there, so
//! two runs never share one directory.

use std::fs::{File, OpenOptions};
use std::io::Write;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::{RunDir, RunFile};
use pruefstand_core::util;

/// Whose run a directory holds: what must match for `--out` to resume it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Identity {
    /// The version's name (a `gym` run: its `--name`).
    pub version: String,
    /// The version's spec hash (a `gym` run: of its agent command and display name).
    pub spec_hash: String,
    pub plan_hash: String,
    pub benchmark_version: String,
}

/// `identity.json`: the identity and what was fixed when the directory was made.
#[derive(Serialize, Deserialize)]
struct IdentityFile {
    #[serde(flatten)]
    identity: Identity,
    /// Seeds the counter suite's per-run secrets; fixed at creation, so a resumed run
    /// sees the same ones however its path is spelled.
    seed: u64,
    created_at: String,
}

/// A run directory held for writing: the lock is released when this is dropped.
pub struct Claimed {
    pub dir: RunDir,
    pub seed: u64,
    _lock: RunLock,
}

/// The exclusive `run.lock` of a run directory (or the reference lock of a version's
/// runs on a plan), with who holds it written inside for the next one to name.
pub struct RunLock(nix::fcntl::Flock<File>);

impl Drop for RunLock {
    /// Empties the file before the lock goes: the next taker writes its name only after
    /// it holds the lock, and one who finds it busy in that moment must read "another
    /// process", not the name of a holder long gone (an export once refused a finished
    /// run so, its lock just taken by a second export).
    fn drop(&mut self) {
        let _ = self.0.set_len(0);
    }
}

/// Why a lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it (as written inside the lock file).
    #[error("held by {holder}")]
    Busy { holder: String },
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl RunLock {
    /// Takes the lock on `path` now, or says who holds it.
    pub fn try_take(path: &std::path::Path) -> Result<RunLock, LockError> {
        let holder = format!("pid {} ({})", std::process::id(), std::env::args().collect::<Vec<_>>().join(" "));
        RunLock::try_take_as(path, &holder)
    }

    /// [`RunLock::try_take`], naming the holder as `holder` (and since when).
    pub fn try_take_as(path: &std::path::Path, holder: &str) -> Result<RunLock, LockError> {
        pruefstand_core::blocking::assert_may_block("a run lock's flock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(mut lock) => {
                let holder = format!("{holder} since {}", chrono::Utc::now().format("%Y-%m-%d %H:%M:%S UTC"));
                let written = lock.set_len(0).and_then(|()| lock.write_all(holder.as_bytes()));
                written.with_context(|| format!("writing {}", path.display()))?;
                Ok(RunLock(lock))
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                let holder = std::fs::read_to_string(path).unwrap_or_default();
                let holder = if holder.trim().is_empty() { "another process".to_string() } else { holder };
                Err(LockError::Busy { holder })
            }
            Err((_, errno)) => Err(anyhow::Error::from(errno).context(format!("locking {}", path.display())).into()),
        }
    }
}

impl RunDir {
    /// Takes `path` for a run of `identity`: a new folder is made user-only (traces can
    /// hold model outputs); an empty one is used as it is; a run directory of the same
    /// identity is resumed. Anything else is refused, naming what differs, and so is a
    /// directory another run holds.
    pub fn claim(path: &std::path::Path, identity: &Identity) -> anyhow::Result<Claimed> {
        RunDir::claim_seeded(path, identity, None)
    }

    /// [`RunDir::claim`], with the seed a new directory gets given (a cluster's shard
    /// takes its job's, so the counter suite's secrets are those of one run).
    pub fn claim_seeded(path: &std::path::Path, identity: &Identity, seed: Option<u64>) -> anyhow::Result<Claimed> {
        let shown = path.display();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        match std::fs::create_dir(path) {
            Ok(()) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                if !path.is_dir() {
                    bail!("{shown} exists and is not a directory");
                }
            }
            Err(err) => return Err(err).with_context(|| format!("creating run directory {shown}")),
        }
        let dir = RunDir::new(path.canonicalize().with_context(|| format!("resolving {shown}"))?);
        let identity_path = dir.path_of(RunFile::Identity);
        if !identity_path.exists() && !dir.is_legacy_run() {
            let foreign: Vec<String> = std::fs::read_dir(&dir.path)?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                // Ours: the lock, and the temporary file of an identity being written.
                .filter(|name| name != RunFile::Lock.name() && !name.starts_with(".tmp"))
                .collect();
            if !foreign.is_empty() {
                bail!(
                    "{shown} is not empty and is not a run directory (no identity.json; it holds {}): choose a new \
                     or empty folder for --out",
                    foreign.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
                );
            }
            // An empty folder made by someone else (`--out` into a 0755 folder): a run
            // holds model output and traces, user-only whatever the folder was.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("making {shown} user-only (0700)"))?;
        }
        let lock = match RunLock::try_take(&dir.path_of(RunFile::Lock)) {
            Ok(lock) => lock,
            Err(LockError::Busy { holder }) => bail!("{shown} is in use by another run: {holder}"),
            Err(LockError::Failed(err)) => return Err(err),
        };
        let stored = match std::fs::read(&identity_path) {
            Ok(bytes) => Some(
                serde_json::from_slice::<IdentityFile>(&bytes)
                    .with_context(|| format!("{}: not a run identity", identity_path.display()))?,
            ),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
            Err(err) => return Err(err).with_context(|| format!("reading {}", identity_path.display())),
        };
        let claimed_by = stored.as_ref().map(|file| file.identity.clone()).or_else(|| dir.legacy_identity());
        if let Some(claimed_by) = claimed_by {
            let differences = identity_differences(&claimed_by, identity);
            if !differences.is_empty() {
                bail!("{shown} holds another run ({}); choose another --out", differences.join("; "));
            }
        }
        let seed = match stored {
            Some(file) => file.seed,
            None => {
                let run_id = pruefstand_core::root::run_id(&dir.path);
                let seed = seed.unwrap_or_else(|| {
                    u64::from_str_radix(&util::sha256_hex(run_id.as_bytes())[..12], 16).unwrap_or(0)
                });
                let file =
                    IdentityFile { identity: identity.clone(), seed, created_at: chrono::Utc::now().to_rfc3339() };
                util::write_json_atomic(&identity_path, &file)?;
                seed
            }
        };
        Ok(Claimed { dir, seed, _lock: lock })
    }

    /// The seed fixed when this directory was claimed (None: never claimed).
    pub fn stored_seed(&self) -> Option<u64> {
        let bytes = std::fs::read(self.path_of(RunFile::Identity)).ok()?;
        serde_json::from_slice::<IdentityFile>(&bytes).ok().map(|file| file.seed)
    }

    /// A run directory written before `identity.json` existed.
    fn is_legacy_run(&self) -> bool {
        self.path_of(RunFile::Plan).is_file() && self.path_of(RunFile::Cases).is_file()
    }

    /// What such a directory's `version.json` and `plan.json` say of its identity.
    fn legacy_identity(&self) -> Option<Identity> {
        let plan = self.read_plan().ok()??;
        let (version, spec_hash) = match self.read_version().ok().flatten() {
            Some(version) => (version.name, version.hash),
            None => (String::new(), String::new()),
        };
        Some(Identity { version, spec_hash, plan_hash: plan.hash, benchmark_version: plan.benchmark_version })
    }
}

/// `field: stored … , requested …` for each field that differs; an empty field of a
/// legacy run directory (no `version.json`) matches anything.
fn identity_differences(stored: &Identity, requested: &Identity) -> Vec<String> {
    let short = |value: &str| value.get(..12).unwrap_or(value).to_string();
    [
        ("version", &stored.version, &requested.version, false),
        ("spec hash", &stored.spec_hash, &requested.spec_hash, true),
        ("plan hash", &stored.plan_hash, &requested.plan_hash, true),
        ("benchmark version", &stored.benchmark_version, &requested.benchmark_version, false),
    ]
    .into_iter()
    .filter(|(_, stored, requested, _)| !stored.is_empty() && stored != requested)
    .map(|(field, stored, requested, hash)| {
        let (stored, requested) =
            if hash { (short(stored), short(requested)) } else { (stored.clone(), requested.clone()) };
        format!("{field}: {stored}, requested {requested}")
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::identity;
    use std::path::PathBuf;

    #[test]
    fn a_released_lock_names_no_holder_to_the_next_who_finds_it_busy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(RunFile::Lock.name());
        let run = RunLock::try_take_as(&path, "pid 1 (pruefstand run)").unwrap();
        let Err(LockError::Busy { holder }) = RunLock::try_take_as(&path, "x") else { panic!("taken twice") };
        assert!(holder.starts_with("pid 1 (pruefstand run) since "), "{holder}");
        drop(run);
        // The moment after another took it, before it wrote its name.
        let file = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let _taken = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
        let Err(LockError::Busy { holder }) = RunLock::try_take_as(&path, "x") else { panic!("taken twice") };
        assert_eq!(holder, "another process");
    }

    #[test]
    fn a_run_directory_of_another_version_or_plan_is_refused_naming_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run");
        drop(RunDir::claim(&path, &identity("demo-baseline")).unwrap());
        let err = RunDir::claim(&path, &identity("demo-kandidat")).err().unwrap().to_string();
        assert!(err.contains("version: demo-baseline, requested demo-kandidat") && err.contains("spec hash"), "{err}");
        let mut other_plan = identity("demo-baseline");
        other_plan.plan_hash = "another-plan-hash".into();
        let err = RunDir::claim(&path, &other_plan).err().unwrap().to_string();
        assert!(err.contains("plan hash: plan-hash-00") && !err.contains("version:"), "{err}");
        assert!(RunDir::claim(&path, &identity("demo-baseline")).is_ok(), "the same identity resumes");
    }

    #[test]
    fn a_run_directory_written_before_identities_is_checked_by_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        util::write_json_atomic(
            &run.path_of(RunFile::Plan),
            &serde_json::json!({"hash": "plan-hash-000000", "benchmark_version": "v1.2.2", "cases": []}),
        )
        .unwrap();
        util::write_json_atomic(
            &run.path_of(RunFile::Version),
            &serde_json::json!({"name": "demo-baseline", "hash": "demo-baseline-spec-hash-0000"}),
        )
        .unwrap();
        std::fs::write(run.path_of(RunFile::Cases), "").unwrap();
        assert!(RunDir::claim(dir.path(), &identity("demo-kandidat")).is_err());
        let claimed = RunDir::claim(dir.path(), &identity("demo-baseline")).unwrap();
        assert!(claimed.dir.path_of(RunFile::Identity).is_file());
    }

    #[test]
    fn a_folder_that_is_not_a_run_directory_is_refused_and_left_as_it_was() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = RunDir::claim(dir.path(), &identity("v")).err().unwrap().to_string();
        assert!(err.contains("not empty and is not a run directory") && err.contains("notes.txt"), "{err}");
        assert_eq!(std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o7777, 0o1777);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "nothing written into it");
        // An empty folder is used, and made user-only like a new one: a run holds
        // model output and traces whatever folder it lands in.
        let empty = tempfile::tempdir().unwrap();
        std::fs::set_permissions(empty.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        RunDir::claim(empty.path(), &identity("v")).unwrap();
        assert_eq!(std::fs::metadata(empty.path()).unwrap().permissions().mode() & 0o777, 0o700);
        let new = empty.path().join("new");
        RunDir::claim(&new, &identity("v")).unwrap();
        assert_eq!(std::fs::metadata(&new).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_held_run_directory_is_refused_naming_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let held = RunDir::claim(dir.path(), &identity("v")).unwrap();
        let err = RunDir::claim(dir.path(), &identity("v")).err().unwrap().to_string();
        assert!(err.contains("in use by another run") && err.contains(&format!("pid {}", std::process::id())), "{err}");
        drop(held);
        assert!(RunDir::claim(dir.path(), &identity("v")).is_ok(), "free again once the holder is gone");
    }

    #[test]
    fn the_seed_is_fixed_at_creation_whatever_the_spelling_of_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let absolute = dir.path().join("run-7");
        let first = RunDir::claim(&absolute, &identity("v")).unwrap().seed;
        let cwd = std::env::current_dir().unwrap();
        let relative = pathdiff(&absolute, &cwd);
        assert_eq!(RunDir::claim(&relative, &identity("v")).unwrap().seed, first);
        assert_eq!(RunDir::claim(&absolute.join("."), &identity("v")).unwrap().seed, first);
    }

    #[test]
    fn a_given_seed_is_kept_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("shards/2");
        assert_eq!(RunDir::new(shard.clone()).stored_seed(), None);
        assert_eq!(RunDir::claim_seeded(&shard, &identity("v"), Some(42)).unwrap().seed, 42);
        // A resume keeps the stored seed whatever it is given.
        assert_eq!(RunDir::claim_seeded(&shard, &identity("v"), Some(7)).unwrap().seed, 42);
        assert_eq!(RunDir::new(shard).stored_seed(), Some(42));
    }

    /// `target` relative to `base` (both absolute).
    fn pathdiff(target: &std::path::Path, base: &std::path::Path) -> PathBuf {
        let common = target.components().zip(base.components()).take_while(|(a, b)| a == b).count();
        let mut out = PathBuf::new();
        for _ in base.components().skip(common) {
            out.push("..");
        }
        out.extend(target.components().skip(common));
        out
    }
}
