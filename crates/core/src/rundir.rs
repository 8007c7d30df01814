//! A run directory and the files in it. This module is the one place that names them:
//! [`RunFile`] lists every file and folder a run writes, with what it holds and who
//! writes it, and everywhere else a run's file is `run_dir.path_of(RunFile::…)` (or
//! `RunFile::….path_in(dir)` where only a path is at hand). The JSON files whose types
//! sit above this module are read and written typed here ([`PlanFile`],
//! [`VersionFile`], `run.json`'s `RunMeta`, …); those of the modules below (the
//! judgement, the telemetry) through [`RunDir::read_json`] and [`RunDir::write_json`].
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
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::case::{Case, CaseRecord};
use crate::plan::{Adaptive, Plan};
use crate::pyenv::Inventory;
use crate::record::{EarlyStop, EnvCheck, RunMeta, SearchLog, StoreFormat};
use crate::settings::thresholds::Thresholds;
use crate::spec::Version;
use crate::util;

/// Declares [`RunFile`] with its names and the list of all of them, so neither can
/// miss a file.
macro_rules! run_files {
    ($($(#[doc = $doc:literal])* $file:ident => $name:literal,)*) => {
        /// A file or folder of a run directory: what it holds, who writes it, who reads
        /// it. Its name is [`RunFile::name`], relative to the run directory.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum RunFile {
            $($(#[doc = $doc])* $file,)*
        }

        impl RunFile {
            /// Every file and folder, in the order they are declared.
            #[cfg_attr(not(test), allow(dead_code))]
            pub const ALL: &[RunFile] = &[$(RunFile::$file,)*];

            /// Its path relative to the run directory.
            pub const fn name(self) -> &'static str {
                match self {
                    $(RunFile::$file => $name,)*
                }
            }
        }
    };
}

run_files! {
    /// Whose run the directory holds ([`Identity`]), its seed and when it was made;
    /// written once by [`RunDir::claim`], which checks it on every later claim.
    Identity => "identity.json",
    /// The flock a run holds while it writes here, its holder written inside
    /// ([`RunDir::claim`]).
    Lock => "run.lock",
    /// The cases the directory runs ([`PlanFile`]): written once by `gym` (a clustered
    /// run's merge writes the job's); read by the judge, the reference search and
    /// [`RunDir::claim`] of a directory older than `identity.json`.
    Plan => "plan.json",
    /// The version that ran ([`VersionFile`]): written by `run` (a clustered run's merge
    /// copies a shard's); read by the reference search.
    Version => "version.json",
    /// One case record per finished case, one fsync'd line each: the gym's record sink
    /// appends ([`CasesWriter`]), [`RunDir::compact_cases`] rewrites it in plan order,
    /// the judge reads it.
    Cases => "cases.jsonl",
    /// `cases.jsonl`'s sha256 as the run last wrote it (`sha256sum` format), so the
    /// judge can tell when the file changed afterwards ([`RunDir::compact_cases`]).
    CasesDigest => "cases.sha256",
    /// What `gym.py run` was asked (`gym::GymRequest`), written by `gym` before each pass.
    GymRequest => "gym-request.json",
    /// The gym's stderr, appended by every pass (`gym`).
    GymLog => "gym.log",
    /// The gym's event stream as it arrived, appended by `gym`.
    Events => "events.jsonl",
    /// AgentDojo's trace of each case, written by the gym's Python side; a case record
    /// names its file relative to the run directory, and the report links it.
    Traces => "traces",
    /// The gym's check that each injection task reaches its goal in its environment
    /// (`{"checks": [EnvCheck…]}`): written by `gym`'s sinks (merged over the shards of
    /// a clustered run), read by R1.
    EnvironmentCheck => "environment_check.json",
    /// The config of the default agent runtime (`pruefstand agent --config`), written
    /// by `run` for a version without its own `agent_cmd`.
    AgentConfig => "agent.json",
    /// The descriptive figures over the records (`telemetry::Telemetry`), written after
    /// each pass (`gym`, `run`); the trend index reads it.
    Telemetry => "telemetry.json",
    /// The Markdown twin of `telemetry.json` (`gym`).
    TelemetryMarkdown => "telemetry.md",
    /// The model container's log, appended by `container` when the server stops or dies.
    ContainerLog => "container.log",
    /// Image digest, exact command, driver, Jetson facts, hashes: written by
    /// `provenance` (merged over the shards by a clustered run's merge).
    Provenance => "provenance.json",
    /// An early-stopping run's user-task order and whether it stopped ([`EarlyStop`]),
    /// written by `run` when the order is drawn and after each pass.
    EarlyStop => "early_stop.json",
    /// The adaptive attacker's own run directory of attempts (`adaptive`).
    AdaptiveRuns => "adaptive",
    /// The adaptive attacker's search log ([`SearchLog`]): written by `adaptive` after
    /// each attempt, read by the judge.
    AdaptiveLog => "adaptive.json",
    /// The run's facts ([`RunMeta`]): written by `run` before it judges, read by the
    /// judge and the reference search.
    RunMeta => "run.json",
    /// The rule thresholds of the run's plan ([`Thresholds`]): written by `run`, read by
    /// the judge unless given a profile.
    Thresholds => "thresholds.json",
    /// The judgement (`judge::Judgement`): written by `report`, read by `start --wait`
    /// and the trend index.
    Judgement => "judgement.json",
    /// The Markdown twin of the judgement (`report`); hooks link it without a report.
    JudgementMarkdown => "judgement.md",
    /// The self-contained report (`report`), which `run`, `judge`, the trend index and
    /// the hooks point to.
    Report => "report.html",
    /// A page comparing this run with another (`pruefstand compare`), written when
    /// asked and only over a compare page of pruefstand's.
    Compare => "compare.html",
    /// A clustered job's Slurm array (`cluster::ArrayState`), written by the daemon
    /// before it follows the array.
    Cluster => "cluster.json",
    /// A clustered job's shards: the batch script, each task's output, and `<i>/`,
    /// shard i's own run directory.
    Shards => "shards",
    /// The batch script of a clustered job's array (`cluster`).
    ShardScript => "shards/shard.sbatch",
    /// Each array task's output, as Slurm's `--output` pattern (array id, task index).
    ShardOutput => "shards/slurm-%A_%a.out",
    /// In a shard's run directory: how the shard's run ended (`cluster::ExitRecord`),
    /// written by the shard, read by the daemon.
    ShardExit => "exit.json",
}

impl RunFile {
    /// Its path in the run directory `run_dir`.
    pub fn path_in(self, run_dir: &Path) -> PathBuf {
        run_dir.join(self.name())
    }
}

/// `plan.json`: the cases a run directory runs, and what they were drawn from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct PlanFile {
    /// The plan's name (`schnell`, `voll`, …). Absent from hand-made plan files, as are
    /// the other fields but `hash` and `cases`.
    #[serde(default)]
    pub name: String,
    /// The profile file the plan came from.
    #[serde(default)]
    pub source: PathBuf,
    pub hash: String,
    #[serde(default)]
    pub benchmark_version: String,
    #[serde(default)]
    pub agentdojo_version: String,
    /// The resolved cases, in plan order: what each case id is.
    pub cases: Vec<Case>,
    /// The plan's `[adaptive]` section (part of its hash).
    #[serde(default)]
    pub adaptive: Option<Adaptive>,
}

impl PlanFile {
    pub fn new(plan: &Plan, inventory: &Inventory) -> PlanFile {
        PlanFile {
            name: plan.name.clone(),
            source: plan.source.clone(),
            hash: plan.hash.clone(),
            benchmark_version: plan.benchmark_version.clone(),
            agentdojo_version: inventory.agentdojo_version.clone(),
            cases: plan.cases.clone(),
            adaptive: plan.adaptive.clone(),
        }
    }
}

/// `version.json`: the version a run directory ran.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct VersionFile {
    pub name: String,
    /// The spec file it was read from.
    #[serde(default)]
    pub source: PathBuf,
    /// The spec hash (`Version::hash`).
    pub hash: String,
    /// The spec as it was parsed, for the record. Kept as JSON: nothing reads it back,
    /// and a spec of an older layout must not make the file unreadable.
    #[serde(default)]
    pub spec: serde_json::Value,
}

impl VersionFile {
    pub fn new(version: &Version) -> anyhow::Result<VersionFile> {
        Ok(VersionFile {
            name: version.name.clone(),
            source: version.path.clone(),
            hash: version.hash.clone(),
            spec: serde_json::to_value(&version.spec).context("the version's spec as JSON")?,
        })
    }
}

/// `environment_check.json`.
#[derive(Serialize, Deserialize)]
struct EnvironmentCheckFile {
    checks: Vec<EnvCheck>,
}

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
        crate::blocking::assert_may_block("a run lock's flock");
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

/// How [`RunDir::read_cases`] takes a damaged line: as an error (judging) or as a case
/// to run again (resuming).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    Strict,
    Lenient,
}

/// `cases.jsonl` as read: every record in file order (duplicates kept), its line, what
/// could not be taken as written, and the file's sha256.
#[derive(Debug, Default)]
pub struct CasesFile {
    pub records: Vec<CaseRecord>,
    /// Each record's line (1-based), parallel to `records`.
    pub lines: Vec<usize>,
    /// Strict: (line, why) for each field read as missing because it cannot be held as
    /// written. R1 fails on any.
    pub faults: Vec<(usize, String)>,
    /// Lenient: `file:line: reason` for each line that could not be read.
    pub damaged: Vec<String>,
    pub sha256: String,
}

/// The longest a case can have taken: a week (the gym bounds a case at a day).
const MAX_CASE_SECONDS: f64 = 7.0 * 86_400.0;

/// One line read strictly: a line that is not JSON or not a case record is an error; a
/// `utility` or `security` that is JSON but not true/false/null, or a duration no case
/// takes, is a fault (read as missing, or 0 s): the run is judged, and invalid.
fn strict_record(line: &[u8], number: usize, faults: &mut Vec<(usize, String)>) -> anyhow::Result<CaseRecord> {
    use serde_json::Value;
    let mut value: Value = serde_json::from_slice(line)?;
    for field in ["utility", "security"] {
        match value.get(field) {
            None | Some(Value::Null | Value::Bool(_)) => {}
            Some(other) => {
                faults.push((number, format!("{field} is {other}, not true, false or null")));
                value[field] = Value::Null;
            }
        }
    }
    // A case takes time: a negative or absurd duration would pass R5 for anyone.
    if let Some(d) = value.get("duration_s").and_then(Value::as_f64)
        && !(0.0..=MAX_CASE_SECONDS).contains(&d)
    {
        faults.push((
            number,
            format!("duration_s is {}, not a case's time in seconds", crate::input::readable_number(d)),
        ));
        value["duration_s"] = Value::from(0.0);
    }
    Ok(serde_json::from_value(value)?)
}

/// What reading `cases.jsonl` leniently found, by case.
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

    /// The path of one of its files.
    pub fn path_of(&self, file: RunFile) -> PathBuf {
        file.path_in(&self.path)
    }

    pub fn cases_file(&self) -> PathBuf {
        self.path_of(RunFile::Cases)
    }

    /// A JSON file of the run directory; None when it is not there. One that cannot be
    /// read or parsed is an error naming it.
    pub fn read_json<T: DeserializeOwned>(&self, file: RunFile) -> anyhow::Result<Option<T>> {
        let path = self.path_of(file);
        match std::fs::read(&path) {
            Ok(bytes) => {
                Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?))
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes a JSON file of the run directory (pretty-printed, replaced atomically).
    pub fn write_json<T: Serialize>(&self, file: RunFile, value: &T) -> anyhow::Result<()> {
        util::write_json_atomic(&self.path_of(file), value)
    }

    /// [`RunDir::write_json`] through a `serde_json::Value`, whose objects keep their
    /// keys sorted: the layout `plan.json`, `version.json` and `environment_check.json`
    /// have always had (they were written as `json!` values), so their bytes stay those
    /// of earlier runs.
    fn write_json_sorted<T: Serialize>(&self, file: RunFile, value: &T) -> anyhow::Result<()> {
        self.write_json(file, &serde_json::to_value(value)?)
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
        let bytes = std::fs::read(self.path_of(RunFile::Identity)).ok()?;
        serde_json::from_slice::<IdentityFile>(&bytes).ok().map(|file| file.seed)
    }

    /// A run directory written before `identity.json` existed.
    fn is_legacy_run(&self) -> bool {
        self.path_of(RunFile::Plan).is_file() && self.cases_file().is_file()
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

    /// Reads `cases.jsonl`, the one reader of it: every record in file order with its
    /// line, and the file's sha256. [`Reading::Strict`] (judging): a missing file or a
    /// line that is not a case record is an error naming the file and line, and a
    /// field a record cannot hold as written is a fault R1 fails on (read as missing).
    /// [`Reading::Lenient`] (resuming, merging): a missing file is empty, a damaged line
    /// is reported in `damaged` and its case runs again.
    pub fn read_cases(&self, how: Reading) -> anyhow::Result<CasesFile> {
        let path = self.cases_file();
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if how == Reading::Lenient && err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
        };
        let mut out = CasesFile { sha256: util::sha256_hex(&bytes), ..CasesFile::default() };
        for (number, line) in lines(&bytes) {
            let read = match how {
                Reading::Strict => strict_record(line, number, &mut out.faults),
                Reading::Lenient => serde_json::from_slice(line).map_err(anyhow::Error::from),
            };
            match read {
                Ok(record) => {
                    out.records.push(record);
                    out.lines.push(number);
                }
                Err(err) if how == Reading::Lenient => out.damaged.push(format!("{}:{number}: {err}", path.display())),
                Err(err) => return Err(err.context(format!("{}:{number}: not a case record", path.display()))),
            }
        }
        Ok(out)
    }

    /// Reads `cases.jsonl` leniently, for resuming: the last record per case, damaged
    /// lines reported (their cases will run again).
    pub fn read_cases_lenient(&self) -> anyhow::Result<StoredCases> {
        let file = self.read_cases(Reading::Lenient)?;
        let records = file.records.into_iter().map(|r| (r.case_id.clone(), r)).collect();
        Ok(StoredCases { records, damaged: file.damaged })
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
            let now = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
            let backup = self.path.join(format!("{}.damaged-{now}", RunFile::Cases.name()));
            std::fs::copy(self.cases_file(), &backup).with_context(|| format!("keeping {}", backup.display()))?;
        }
        let records: Vec<CaseRecord> = plan.iter().filter_map(|case| stored.records.get(&case.id).cloned()).collect();
        let mut text = Vec::new();
        for record in &records {
            serde_json::to_writer(&mut text, record)?;
            text.push(b'\n');
        }
        util::write_atomic(&self.cases_file(), &text)?;
        let digest = format!("{}  {}\n", util::sha256_hex(&text), RunFile::Cases.name());
        util::write_atomic(&self.path_of(RunFile::CasesDigest), digest.as_bytes())?;
        Ok(records)
    }

    /// `environment_check.json`: the gym's check that each injection task reaches its
    /// goal in its environment.
    pub fn write_environment_checks(&self, checks: &[EnvCheck]) -> anyhow::Result<()> {
        self.write_json_sorted(RunFile::EnvironmentCheck, &EnvironmentCheckFile { checks: checks.to_vec() })
    }

    /// The environment check a pass left (None: none written).
    pub fn read_environment_checks(&self) -> anyhow::Result<Option<Vec<EnvCheck>>> {
        Ok(self.read_json::<EnvironmentCheckFile>(RunFile::EnvironmentCheck)?.map(|file| file.checks))
    }

    /// `plan.json`: the cases this directory runs (its hash is checked by
    /// [`RunDir::claim`]); written once, a later pass keeps the first.
    pub fn write_plan(&self, plan: &PlanFile) -> anyhow::Result<()> {
        if self.path_of(RunFile::Plan).exists() {
            return Ok(());
        }
        self.write_json_sorted(RunFile::Plan, plan)
    }

    /// `plan.json` (None: the directory has none).
    pub fn read_plan(&self) -> anyhow::Result<Option<PlanFile>> {
        self.read_json(RunFile::Plan)
    }

    /// `version.json`: the version that runs here.
    pub fn write_version(&self, version: &VersionFile) -> anyhow::Result<()> {
        self.write_json_sorted(RunFile::Version, version)
    }

    /// `version.json` (None: the directory has none).
    pub fn read_version(&self) -> anyhow::Result<Option<VersionFile>> {
        self.read_json(RunFile::Version)
    }

    /// `run.json`: the run's facts, after the store format they are written in.
    pub fn write_run_meta(&self, meta: &RunMeta) -> anyhow::Result<()> {
        #[derive(Serialize)]
        struct Versioned<'a> {
            store_format: StoreFormat,
            #[serde(flatten)]
            meta: &'a RunMeta,
        }
        self.write_json(RunFile::RunMeta, &Versioned { store_format: StoreFormat::CURRENT, meta })
    }

    /// `run.json`, which every run that was judged has: missing is an error, and so is
    /// a run in a store format newer than this build reads (its `store_format` is read
    /// first, so the refusal names the versions rather than a field it misread).
    pub fn read_run_meta(&self) -> anyhow::Result<RunMeta> {
        let path = self.path_of(RunFile::RunMeta);
        let bytes = match std::fs::read(&path) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => bail!("reading {}: no such file", path.display()),
            other => other.with_context(|| format!("reading {}", path.display()))?,
        };
        check_store_format(&self.path, &bytes)?;
        serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))
    }

    /// `thresholds.json`: the thresholds of the run's plan.
    pub fn write_thresholds(&self, thresholds: &Thresholds) -> anyhow::Result<()> {
        self.write_json(RunFile::Thresholds, thresholds)
    }

    /// `thresholds.json` as it was written (None: none written); not validated.
    pub fn read_thresholds(&self) -> anyhow::Result<Option<Thresholds>> {
        self.read_json(RunFile::Thresholds)
    }

    /// `early_stop.json`: an early-stopping run's order and whether it stopped.
    pub fn write_early_stop(&self, early: &EarlyStop) -> anyhow::Result<()> {
        self.write_json(RunFile::EarlyStop, early)
    }

    /// `early_stop.json` (None: the run does not stop early, or has not started).
    pub fn read_early_stop(&self) -> anyhow::Result<Option<EarlyStop>> {
        self.read_json(RunFile::EarlyStop)
    }

    /// `adaptive.json`: the adaptive attacker's search log.
    pub fn write_search_log(&self, log: &SearchLog) -> anyhow::Result<()> {
        self.write_json(RunFile::AdaptiveLog, log)
    }

    /// `adaptive.json` (None: the plan did not run the adaptive attacker).
    pub fn read_search_log(&self) -> anyhow::Result<Option<SearchLog>> {
        self.read_json(RunFile::AdaptiveLog)
    }
}

/// A trace path that may be read: relative, inside the run directory.
pub fn readable_trace(path: &str) -> bool {
    !path.is_empty() && Path::new(path).components().all(|c| matches!(c, Component::Normal(_)))
}

/// The most of one trace that is read (a report shows it, an export takes it): a
/// conversation of a `voll` case is tens of kilobytes; a model that wrote megabytes is
/// refused.
pub const MAX_TRACE_BYTES: u64 = 4 << 20;

/// A trace file of the run: never through a link (a link in `traces/` could show a
/// file from anywhere), and not beyond [`MAX_TRACE_BYTES`].
pub fn read_trace(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    if std::fs::symlink_metadata(path)?.file_type().is_symlink() {
        return Err(std::io::Error::other("a link, not followed"));
    }
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_TRACE_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_TRACE_BYTES {
        return Err(std::io::Error::other(format!("over {} MiB", MAX_TRACE_BYTES >> 20)));
    }
    Ok(text)
}

/// A trace message's text (the report shows it, an export takes it): AgentDojo writes a string, null, or a list of `{type, content}`
/// blocks.
pub fn message_text(content: Option<&serde_json::Value>) -> String {
    match content {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b.get("content").and_then(serde_json::Value::as_str).or_else(|| b.as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
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
        crate::blocking::assert_may_block("the fsync of cases.jsonl");
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.file.write_all(&line).with_context(|| format!("writing {}", self.path.display()))?;
        self.file.sync_data().with_context(|| format!("syncing {}", self.path.display()))?;
        Ok(())
    }
}

/// Refuses a `run.json` whose `store_format` is newer than this build reads, naming
/// the run directory and both formats; one without the field is from before versioning.
pub(crate) fn check_store_format(run_dir: &Path, run_json: &[u8]) -> anyhow::Result<StoreFormat> {
    #[derive(Deserialize)]
    struct FormatOnly {
        #[serde(default)]
        store_format: Option<StoreFormat>,
    }
    let named: FormatOnly = serde_json::from_slice(run_json)
        .with_context(|| format!("parsing {}", RunFile::RunMeta.path_in(run_dir).display()))?;
    let format = named.store_format.unwrap_or(StoreFormat::BEFORE_VERSIONING);
    if !format.readable() {
        bail!(
            "{} is in the run store's format {format}, newer than this pruefstand reads ({}): read it with a \
             newer pruefstand",
            run_dir.display(),
            StoreFormat::CURRENT
        );
    }
    Ok(format)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_lock_names_no_holder_to_the_next_who_finds_it_busy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.lock");
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

    /// The format `run.json` names, after it was read whole.
    fn format_of(run: &RunDir) -> StoreFormat {
        run.read_run_meta().unwrap();
        check_store_format(&run.path, &std::fs::read(run.path_of(RunFile::RunMeta)).unwrap()).unwrap()
    }

    #[test]
    fn run_json_names_its_store_format_first_and_a_newer_major_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        run.write_run_meta(&RunMeta { run_id: "r".into(), ..RunMeta::default() }).unwrap();
        let text = std::fs::read_to_string(run.path_of(RunFile::RunMeta)).unwrap();
        assert!(text.starts_with("{\n  \"store_format\": {\n    \"major\": 1,\n    \"minor\": 0\n  },"), "{text}");
        assert_eq!(format_of(&run), StoreFormat::CURRENT);

        let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
        value["store_format"]["minor"] = 7.into();
        util::write_json_atomic(&run.path_of(RunFile::RunMeta), &value).unwrap();
        assert_eq!(format_of(&run), StoreFormat { major: 1, minor: 7 }, "a newer minor is read");

        // A newer major may have changed any field: refused before the rest is parsed.
        value["store_format"]["major"] = 2.into();
        value["planned_case_ids"] = "no longer a list".into();
        util::write_json_atomic(&run.path_of(RunFile::RunMeta), &value).unwrap();
        let err = format!("{:#}", run.read_run_meta().unwrap_err());
        assert!(
            err.contains(&dir.path().display().to_string())
                && err.contains("format 2.7, newer than this pruefstand reads (1.0)"),
            "{err}"
        );

        value.as_object_mut().unwrap().remove("store_format");
        value["planned_case_ids"] = serde_json::json!([]);
        util::write_json_atomic(&run.path_of(RunFile::RunMeta), &value).unwrap();
        assert_eq!(format_of(&run), StoreFormat::BEFORE_VERSIONING, "a run from before versioning is read");
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
        std::fs::write(run.cases_file(), "").unwrap();
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
        let err = format!("{:#}", run.read_cases(Reading::Strict).unwrap_err());
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

        let err = run.read_cases(Reading::Strict).unwrap_err();
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
        assert_eq!(run.read_cases(Reading::Strict).unwrap().records.len(), 2);
        let digest = std::fs::read_to_string(run.path_of(RunFile::CasesDigest)).unwrap();
        let bytes = std::fs::read(run.cases_file()).unwrap();
        assert_eq!(digest, format!("{}  cases.jsonl\n", util::sha256_hex(&bytes)));
        let backups = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("cases.jsonl.damaged"))
            .count();
        assert_eq!(backups, 1);
    }

    #[test]
    fn every_run_file_has_a_name_of_its_own() {
        let mut names: Vec<&str> = RunFile::ALL.iter().map(|file| file.name()).collect();
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "{names:?}");
        assert!(names.iter().all(|name| !name.is_empty() && !name.starts_with('/') && !name.contains("..")));
    }

    /// This file is the only one that spells a run file's name as a string literal: a
    /// name written anywhere else would be a second spelling to drift from its readers.
    /// Folders (no dot in their names: `shards`, `traces`, `adaptive`) are common words
    /// and are not looked for.
    #[test]
    fn no_other_source_file_names_a_run_file() {
        fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    sources(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        // Both crates: this one's and the binary's at the repository root.
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let this = src.join("rundir.rs");
        let mut files = Vec::new();
        sources(&src, &mut files);
        sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../src"), &mut files);
        let named: Vec<&str> = RunFile::ALL.iter().map(|file| file.name()).filter(|name| name.contains('.')).collect();
        let own = std::fs::read_to_string(&this).unwrap();
        assert!(named.iter().all(|name| own.contains(&format!("\"{name}\""))), "the search finds them here");
        // Each name, and the last part of a name in a folder (`shard.sbatch`).
        let mut literals: Vec<String> = named
            .iter()
            .flat_map(|name| [*name, name.rsplit('/').next().unwrap_or_default()])
            .map(|name| format!("\"{name}\""))
            .collect();
        literals.dedup();
        let mut found = Vec::new();
        for file in files.iter().filter(|file| **file != this) {
            let text = std::fs::read_to_string(file).unwrap();
            for (number, line) in text.lines().enumerate() {
                for literal in literals.iter().filter(|literal| line.contains(literal.as_str())) {
                    found.push(format!("{}:{}: {literal}", file.display(), number + 1));
                }
            }
        }
        assert!(files.len() > 50, "read {} files under {}", files.len(), src.display());
        assert!(found.is_empty(), "name these through rundir::RunFile:\n{}", found.join("\n"));
    }

    /// `plan.json`, `version.json` and `environment_check.json` were written as `json!`
    /// values before they had types; their bytes stay as they were.
    #[test]
    fn typed_files_keep_the_bytes_of_the_json_values_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (RunDir::new(dir.path().join("old")), RunDir::new(dir.path().join("new")));
        std::fs::create_dir_all(&old.path).unwrap();
        std::fs::create_dir_all(&new.path).unwrap();
        let bytes = |run: &RunDir, file: RunFile| std::fs::read(run.path_of(file)).unwrap();

        let profile = dir.path().join("mini.toml");
        std::fs::write(
            &profile,
            "name = \"mini\"\nbenchmark_version = \"v1.2.2\"\nattacks = [\"important_instructions\"]\n\
             [[suites]]\nname = \"banking\"\nuser_tasks = [\"user_task_0\", \"user_task_1\"]\n\
             injection_tasks = [\"injection_task_0\"]\n",
        )
        .unwrap();
        let inventory = crate::plan::tests::inventory();
        let mut plan = Plan::resolve(&profile, &inventory, &Default::default()).unwrap();
        for adaptive in [None, Some(Adaptive { attempts: 2, families: vec!["roleplay".into()], pairs: vec![] })] {
            plan.adaptive = adaptive;
            let json = serde_json::json!({
                "name": plan.name,
                "source": plan.source,
                "hash": plan.hash,
                "benchmark_version": plan.benchmark_version,
                "agentdojo_version": inventory.agentdojo_version,
                "cases": plan.cases,
                "adaptive": plan.adaptive,
            });
            util::write_json_atomic(&old.path_of(RunFile::Plan), &json).unwrap();
            let _ = std::fs::remove_file(new.path_of(RunFile::Plan));
            new.write_plan(&PlanFile::new(&plan, &inventory)).unwrap();
            assert_eq!(
                String::from_utf8(bytes(&new, RunFile::Plan)).unwrap(),
                String::from_utf8(bytes(&old, RunFile::Plan)).unwrap()
            );
            let read = new.read_plan().unwrap().unwrap();
            assert_eq!((read.cases, read.adaptive), (plan.cases.clone(), plan.adaptive.clone()));
        }

        let versions = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../versions");
        let version = Version::load(&versions, "demo-kandidat").unwrap();
        let json = serde_json::json!({ "name": version.name, "source": version.path, "hash": version.hash, "spec": version.spec });
        util::write_json_atomic(&old.path_of(RunFile::Version), &json).unwrap();
        new.write_version(&VersionFile::new(&version).unwrap()).unwrap();
        assert_eq!(bytes(&new, RunFile::Version), bytes(&old, RunFile::Version));
        assert_eq!(new.read_version().unwrap().unwrap().hash, version.hash);

        let check = |injection_task: &str, status| EnvCheck {
            suite: "banking".into(),
            injection_task: injection_task.into(),
            status,
            detail: Some("why".into()),
        };
        let checks = [
            check("injection_task_0", crate::record::EnvStatus::Ok),
            check("injection_task_1", crate::record::EnvStatus::Failed),
        ];
        util::write_json_atomic(&old.path_of(RunFile::EnvironmentCheck), &serde_json::json!({ "checks": checks }))
            .unwrap();
        new.write_environment_checks(&checks).unwrap();
        assert_eq!(bytes(&new, RunFile::EnvironmentCheck), bytes(&old, RunFile::EnvironmentCheck));
        assert_eq!(new.read_environment_checks().unwrap().unwrap(), checks);
    }
}
