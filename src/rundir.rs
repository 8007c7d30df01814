//! A run directory and the files in it: `cases.jsonl` (the durable record of finished
//! cases), `plan.json`, `events.jsonl`, and the paths of everything else a run writes.
//!
//! `cases.jsonl` is append-only while a run goes on, one fsync'd line per case, so a
//! crash at any point loses at most the case in flight; reading it back tolerates a
//! truncated last line. It does not decide what to run: `gym` does.
//!
//! A run directory knows whose it is: `identity.json` names the version (its spec
//! hash), the plan hash and the benchmark version, and `--out` refuses a directory of
//! anything else. A run holds `run.lock` (flock) for as long as it writes there, so two
//! runs never share one directory.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::case::{Case, CaseRecord};
use crate::util;

/// The gym's environment check (`GymEvent::EnvironmentCheck`).
const ENVIRONMENT_CHECK_FILE: &str = "environment_check.json";

#[derive(Clone, Debug)]
pub struct RunDir {
    pub path: PathBuf,
}

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
pub struct RunLock(#[allow(dead_code)] nix::fcntl::Flock<File>);

/// Why a lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it (as written inside the lock file).
    #[error("held by {holder}")]
    Busy { holder: String },
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// How a wait for a lock ended.
pub enum Waited<S> {
    Taken(RunLock),
    /// The caller's stop came first, with its value.
    Stopped(S),
}

/// How often a waiter looks at a lock again.
pub const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

impl RunLock {
    /// Takes the lock on `path` now, or says who holds it.
    pub fn try_take(path: &std::path::Path) -> Result<RunLock, LockError> {
        let holder = format!("pid {} ({})", std::process::id(), std::env::args().collect::<Vec<_>>().join(" "));
        RunLock::try_take_as(path, &holder)
    }

    /// [`RunLock::try_take`], naming the holder as `holder` (and since when).
    pub fn try_take_as(path: &std::path::Path, holder: &str) -> Result<RunLock, LockError> {
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

    /// Takes a lock, waiting while another process holds it: `take` now and every
    /// [`LOCK_RETRY`], `waiting(holder)` each time it is busy, until taken or `stop`
    /// resolves. The one waiter of the bench lock and the reference locks.
    pub async fn wait<S>(
        mut take: impl FnMut() -> Result<RunLock, LockError>,
        mut waiting: impl FnMut(&str),
        stop: impl std::future::Future<Output = S>,
    ) -> anyhow::Result<Waited<S>> {
        tokio::pin!(stop);
        loop {
            match take() {
                Ok(lock) => return Ok(Waited::Taken(lock)),
                Err(LockError::Busy { holder }) => waiting(&holder),
                Err(LockError::Failed(err)) => return Err(err),
            }
            tokio::select! {
                () = tokio::time::sleep(LOCK_RETRY) => {}
                stopped = &mut stop => return Ok(Waited::Stopped(stopped)),
            }
        }
    }
}

/// What reading `cases.jsonl` found.
pub struct StoredCases {
    /// Last record per case id (a re-run case replaces its earlier record).
    pub records: BTreeMap<String, CaseRecord>,
    /// `file:line: reason` for each line that could not be read; those cases count as
    /// not run.
    pub damaged: Vec<String>,
}

impl RunDir {
    pub fn new(path: impl Into<PathBuf>) -> RunDir {
        RunDir { path: path.into() }
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn cases_file(&self) -> PathBuf {
        self.file("cases.jsonl")
    }

    /// `cases.sha256`: the sha256 of `cases.jsonl` as the run last wrote it
    /// (`sha256sum` format), so `judge` can tell when the file changed afterwards.
    pub fn cases_digest_file(&self) -> PathBuf {
        self.file("cases.sha256")
    }

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
        let identity_path = dir.file("identity.json");
        if !identity_path.exists() && !dir.is_legacy_run() {
            let foreign: Vec<String> = std::fs::read_dir(&dir.path)?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                // Ours: the lock, and the temporary file of an identity being written.
                .filter(|name| name != "run.lock" && !name.starts_with(".tmp"))
                .collect();
            if !foreign.is_empty() {
                bail!(
                    "{shown} is not empty and is not a run directory (no identity.json; it holds {}): choose a new \
                     or empty folder for --out",
                    foreign.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
                );
            }
        }
        let lock = match RunLock::try_take(&dir.file("run.lock")) {
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
                let run_id = crate::root::run_id(&dir.path);
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
        let bytes = std::fs::read(self.file("identity.json")).ok()?;
        serde_json::from_slice::<IdentityFile>(&bytes).ok().map(|file| file.seed)
    }

    /// A run directory written before `identity.json` existed.
    fn is_legacy_run(&self) -> bool {
        self.file("plan.json").is_file() && self.cases_file().is_file()
    }

    /// What such a directory's `version.json` and `plan.json` say of its identity.
    fn legacy_identity(&self) -> Option<Identity> {
        let read = |name: &str| -> Option<serde_json::Value> {
            serde_json::from_str(&std::fs::read_to_string(self.file(name)).ok()?).ok()
        };
        let plan = read("plan.json")?;
        let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_string();
        let (version, spec_hash) = match read("version.json") {
            Some(version) => (text(&version["name"]), text(&version["hash"])),
            None => (String::new(), String::new()),
        };
        Some(Identity {
            version,
            spec_hash,
            plan_hash: text(&plan["hash"]),
            benchmark_version: text(&plan["benchmark_version"]),
        })
    }

    /// Reads `cases.jsonl` leniently, for resuming: damaged lines are reported, and
    /// their cases will run again.
    pub fn read_cases_lenient(&self) -> anyhow::Result<StoredCases> {
        let path = self.cases_file();
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
        };
        let mut stored = StoredCases { records: BTreeMap::new(), damaged: Vec::new() };
        for (number, line) in lines(&bytes) {
            match serde_json::from_slice::<CaseRecord>(line) {
                Ok(record) => {
                    stored.records.insert(record.case_id.clone(), record);
                }
                Err(err) => stored.damaged.push(format!("{}:{number}: {err}", path.display())),
            }
        }
        Ok(stored)
    }

    /// Reads `cases.jsonl` strictly, for judging: any damaged line is an error naming
    /// the file and line.
    pub fn read_cases_strict(&self) -> anyhow::Result<Vec<CaseRecord>> {
        let path = self.cases_file();
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        lines(&bytes)
            .map(|(number, line)| {
                serde_json::from_slice(line).with_context(|| format!("{}:{number}: not a case record", path.display()))
            })
            .collect()
    }

    pub fn open_cases_for_append(&self) -> anyhow::Result<CasesWriter> {
        let path = self.cases_file();
        // A crash can leave a last line without its newline; start on a fresh line so
        // the next record is not glued to it.
        let needs_newline =
            std::fs::read(&path).map(|bytes| bytes.last().is_some_and(|b| *b != b'\n')).unwrap_or(false);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        if needs_newline {
            file.write_all(b"\n")?;
        }
        Ok(CasesWriter { file, path })
    }

    /// Rewrites `cases.jsonl` in plan order with one record per case, keeping the old
    /// file as `cases.jsonl.damaged-*` when it had unreadable lines (nothing is lost),
    /// and records the new file's sha256 in `cases.sha256`.
    pub fn compact_cases(&self, plan: &[Case], stored: &StoredCases) -> anyhow::Result<Vec<CaseRecord>> {
        if !stored.damaged.is_empty() {
            let backup = self.file(&format!("cases.jsonl.damaged-{}", chrono::Utc::now().format("%Y%m%dT%H%M%SZ")));
            std::fs::copy(self.cases_file(), &backup).with_context(|| format!("keeping {}", backup.display()))?;
        }
        let records: Vec<CaseRecord> = plan.iter().filter_map(|case| stored.records.get(&case.id).cloned()).collect();
        let mut text = Vec::new();
        for record in &records {
            serde_json::to_writer(&mut text, record)?;
            text.push(b'\n');
        }
        util::write_atomic(&self.cases_file(), &text)?;
        let digest = format!("{}  cases.jsonl\n", util::sha256_hex(&text));
        util::write_atomic(&self.cases_digest_file(), digest.as_bytes())?;
        Ok(records)
    }

    /// `environment_check.json`: the gym's check that each injection task reaches its
    /// goal in its environment.
    pub fn write_environment_checks(&self, checks: &[crate::record::EnvCheck]) -> anyhow::Result<()> {
        util::write_json_atomic(&self.file(ENVIRONMENT_CHECK_FILE), &serde_json::json!({ "checks": checks }))
    }

    /// The environment check a pass left (None: none written).
    pub fn read_environment_checks(&self) -> anyhow::Result<Option<Vec<crate::record::EnvCheck>>> {
        let path = self.file(ENVIRONMENT_CHECK_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
        };
        #[derive(Deserialize)]
        struct File {
            checks: Vec<crate::record::EnvCheck>,
        }
        let file: File =
            serde_json::from_str(&text).with_context(|| format!("{}: not an environment check", path.display()))?;
        Ok(Some(file.checks))
    }

    /// `plan.json`: the cases this directory runs (its hash is checked by [`RunDir::claim`]).
    pub fn write_plan(&self, plan_json: &serde_json::Value) -> anyhow::Result<()> {
        if self.file("plan.json").exists() {
            return Ok(());
        }
        util::write_json_atomic(&self.file("plan.json"), plan_json)
    }
}

/// The non-blank lines of a JSON-lines file with their 1-based numbers, as bytes: a
/// line that is not UTF-8 is one damaged record, not an unreadable file.
pub fn lines(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    bytes
        .split(|b| *b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.iter().all(u8::is_ascii_whitespace))
        .map(|(index, line)| (index + 1, line))
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

pub struct CasesWriter {
    file: File,
    path: PathBuf,
}

impl CasesWriter {
    /// Appends one record and makes it durable before returning.
    pub fn append(&mut self, record: &CaseRecord) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.file.write_all(&line).with_context(|| format!("writing {}", self.path.display()))?;
        self.file.sync_data().with_context(|| format!("syncing {}", self.path.display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, utility: bool) -> CaseRecord {
        CaseRecord { case_id: id.into(), ..CaseRecord::of(&Case::clean("s", "u"), Some(utility), None) }
    }

    fn identity(version: &str) -> Identity {
        Identity {
            version: version.into(),
            spec_hash: format!("{version}-spec-hash-0000"),
            plan_hash: "plan-hash-000000".into(),
            benchmark_version: "v1.2.2".into(),
        }
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
            &run.file("plan.json"),
            &serde_json::json!({"hash": "plan-hash-000000", "benchmark_version": "v1.2.2"}),
        )
        .unwrap();
        util::write_json_atomic(
            &run.file("version.json"),
            &serde_json::json!({"name": "demo-baseline", "hash": "demo-baseline-spec-hash-0000"}),
        )
        .unwrap();
        std::fs::write(run.cases_file(), "").unwrap();
        assert!(RunDir::claim(dir.path(), &identity("demo-kandidat")).is_err());
        let claimed = RunDir::claim(dir.path(), &identity("demo-baseline")).unwrap();
        assert!(claimed.dir.file("identity.json").is_file());
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
        // An empty folder is used as it is; a new one is made user-only.
        let empty = tempfile::tempdir().unwrap();
        std::fs::set_permissions(empty.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        RunDir::claim(empty.path(), &identity("v")).unwrap();
        assert_eq!(std::fs::metadata(empty.path()).unwrap().permissions().mode() & 0o777, 0o755);
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

    #[test]
    fn a_record_that_is_not_utf8_is_one_damaged_line() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        run.open_cases_for_append().unwrap().append(&record("a", true)).unwrap();
        let mut file = OpenOptions::new().append(true).open(run.cases_file()).unwrap();
        file.write_all(b"{\"case_id\":\"b\xff\"}\n").unwrap();
        drop(file);
        run.open_cases_for_append().unwrap().append(&record("c", true)).unwrap();
        let stored = run.read_cases_lenient().unwrap();
        assert_eq!(stored.records.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert!(stored.damaged.len() == 1 && stored.damaged[0].contains("cases.jsonl:2"), "{:?}", stored.damaged);
        let err = format!("{:#}", run.read_cases_strict().unwrap_err());
        assert!(err.contains("cases.jsonl:2"), "{err}");
    }

    #[test]
    fn truncated_last_line_is_dropped_and_the_next_append_starts_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        let mut writer = run.open_cases_for_append().unwrap();
        writer.append(&record("a", true)).unwrap();
        drop(writer);
        let mut file = OpenOptions::new().append(true).open(run.cases_file()).unwrap();
        file.write_all(br#"{"case_id":"b","kin"#).unwrap();
        let stored = run.read_cases_lenient().unwrap();
        assert_eq!(stored.records.len(), 1);
        assert_eq!(stored.damaged.len(), 1);
        assert!(stored.damaged[0].contains("cases.jsonl:2"), "{:?}", stored.damaged);

        run.open_cases_for_append().unwrap().append(&record("c", false)).unwrap();
        let stored = run.read_cases_lenient().unwrap();
        assert!(stored.records.contains_key("a") && stored.records.contains_key("c"));

        let err = run.read_cases_strict().unwrap_err();
        assert!(format!("{err:#}").contains("cases.jsonl:2"), "{err:#}");
    }

    #[test]
    fn compaction_keeps_plan_order_last_record_and_a_backup() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        let mut writer = run.open_cases_for_append().unwrap();
        writer.append(&record("b", false)).unwrap();
        writer.append(&record("a", true)).unwrap();
        writer.append(&record("b", true)).unwrap();
        drop(writer);
        std::fs::OpenOptions::new().append(true).open(run.cases_file()).unwrap().write_all(b"garbage\n").unwrap();
        let plan = vec![Case::clean("s", "a"), Case::clean("s", "b")];
        let mut plan_ids = plan.clone();
        plan_ids[0].id = "a".into();
        plan_ids[1].id = "b".into();
        let stored = run.read_cases_lenient().unwrap();
        let records = run.compact_cases(&plan_ids, &stored).unwrap();
        assert_eq!(records.iter().map(|r| r.case_id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(records[1].utility, Some(true));
        assert_eq!(run.read_cases_strict().unwrap().len(), 2);
        let digest = std::fs::read_to_string(run.cases_digest_file()).unwrap();
        let bytes = std::fs::read(run.cases_file()).unwrap();
        assert_eq!(digest, format!("{}  cases.jsonl\n", util::sha256_hex(&bytes)));
        let backups = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("cases.jsonl.damaged"))
            .count();
        assert_eq!(backups, 1);
    }
}
