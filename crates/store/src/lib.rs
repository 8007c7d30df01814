//! The run store: a run directory and the files in it, behind one door. [`RunFile`]
//! names every file and folder a run writes (`files.rs`), and only this crate turns a
//! name into a path: everyone else asks a [`RunDir`] for what a file holds. The JSON
//! documents whose types sit above the store are read and written typed here
//! ([`PlanFile`], [`VersionFile`], `run.json`'s `RunMeta`, …); the owner of any other
//! document declares its file once ([`RunDocument`]) and reads and writes it with
//! [`RunDir::read`] and [`RunDir::write`], so no caller can pick an arbitrary file for
//! an arbitrary type.
//!
//! `cases.jsonl` (`cases.rs`) is the store's alone: appended one fsync'd line per case,
//! read whole or from an offset, counted, compacted, and pruned under the run's lock.
//! A run directory knows whose it is and who writes it now (`claim.rs`: `identity.json`,
//! `run.lock`), and in which store format it was written (`format.rs`): a reader opens
//! a run with [`RunDir::open`], which refuses one newer than this build reads; a run
//! being written is [`RunDir::claim`]ed.
//!
//! A few doors hand out a path, each for a process outside our code that must be given
//! one (the gym's request and traces, Slurm's script and output, Docker's log) or for
//! a writer that streams itself (the gym's log and events, the HTML pages); each says
//! why it exists.

// The bench lock, kept in the store it guards.
pub mod benchlock;

mod cases;
mod claim;
mod files;
mod format;
mod traces;

pub use cases::{CasesFile, CasesTail, CasesWriter, Reading, StoredCases};
pub use claim::{Claimed, Identity, LockError, RunLock};
pub use files::RunFile;
pub use traces::TraceError;

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use pruefstand_core::case::Case;
use pruefstand_core::inventory::Inventory;
use pruefstand_core::plan::{Adaptive, Plan};
use pruefstand_core::record::{EarlyStop, EnvCheck, SearchLog};
use pruefstand_core::settings::thresholds::Thresholds;
use pruefstand_core::spec::Version;
use pruefstand_core::util;

/// A JSON document of a run directory whose type lives outside the store: its owner
/// names its file once, here, and reads and writes it with [`RunDir::read`] and
/// [`RunDir::write`].
///
/// Reading needs `Deserialize`, writing `Serialize`: a document only written (the gym's
/// request, the telemetry, whose readers read a view of their own) need not be
/// readable, and a reader's view of a file (the judgement of any age the judge crate
/// reads back) cannot be written over it.
pub trait RunDocument {
    /// The file it is stored in.
    const FILE: RunFile;
}

impl RunDocument for pruefstand_core::record::FoundFamily {
    const FILE: RunFile = RunFile::FoundFamily;
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

/// `provenance.json`'s and `telemetry.json`'s types sit below the store (in the core),
/// which declares their files.
impl RunDocument for pruefstand_core::record::Provenance {
    const FILE: RunFile = RunFile::Provenance;
}

impl RunDocument for pruefstand_core::telemetry::Telemetry {
    const FILE: RunFile = RunFile::Telemetry;
}

/// `environment_check.json`.
#[derive(Serialize, Deserialize)]
struct EnvironmentCheckFile {
    checks: Vec<EnvCheck>,
}

/// A run directory: an opaque handle, its path kept inside. Callers ask it for what its
/// files hold ([`RunDir::read`], [`RunDir::read_cases`], [`RunDir::trace`], …), never for
/// a file's path; the few doors that hand one out say why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// A run directory being written (its writer has claimed it, or is a part of a run
    /// that has: the gym, the model server's watch), or named where nothing of it is
    /// read (a link to it). A reader uses [`RunDir::open`].
    pub fn new(path: impl Into<PathBuf>) -> RunDir {
        RunDir { path: path.into() }
    }

    /// The directory itself: to show it, to hand it to a process not ours (the gym is
    /// given it), to link it from a page or to name a run by its folder. Never to build
    /// a path to one of its files: ask the handle (the store's guard test refuses a run
    /// file's name or a join to one outside this crate).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `dir` holds a run: its `run.json` or its `cases.jsonl` (a run still
    /// going has only the latter). An export is never written into one.
    pub fn is_run(dir: &Path) -> bool {
        [RunFile::RunMeta, RunFile::Cases].iter().any(|file| file.path_in(dir).exists())
    }

    /// Whether `dir` holds a judged run: its `judgement.json` is a plain file (never a
    /// link, which could lead out of a reports folder). The trend index looks for them.
    pub fn is_judged_run(dir: &Path) -> bool {
        std::fs::symlink_metadata(RunFile::Judgement.path_in(dir)).is_ok_and(|meta| meta.is_file())
    }

    /// Whether its report (`report.html`) is there, for a page that links it.
    pub fn has_report(&self) -> bool {
        self.path_of(RunFile::Report).is_file()
    }

    /// Whether a compare page (`compare.html`) lies in it, for its report's link.
    pub fn has_compare_page(&self) -> bool {
        self.path_of(RunFile::Compare).is_file()
    }

    /// For tests of other crates, which damage a file, write one of an older or foreign
    /// layout, or compare its bytes: a file's path. Built only with the `test-support`
    /// feature, which only tests turn on.
    #[cfg(any(test, feature = "test-support"))]
    pub fn test_file(&self, file: RunFile) -> PathBuf {
        self.path_of(file)
    }

    /// Its `found-family.json` as a file a plan pins (`[[found]] file = …`), which names
    /// a family by its path; None when its campaign found none.
    pub fn found_family_file(&self) -> Option<PathBuf> {
        let path = self.path_of(RunFile::FoundFamily);
        path.is_file().then_some(path)
    }

    /// The path of one of its files: the store's alone.
    fn path_of(&self, file: RunFile) -> PathBuf {
        file.path_in(&self.path)
    }

    /// A file's path as a message shows it to a user (where the cases are kept, which
    /// file was wrong): text to read, not a path to open.
    pub fn shown(&self, file: RunFile) -> String {
        self.path_of(file).display().to_string()
    }

    /// A document of its owner's type ([`RunDocument`]); None when it is not there. One
    /// that cannot be read or parsed is an error naming it.
    pub fn read<T: RunDocument + DeserializeOwned>(&self) -> anyhow::Result<Option<T>> {
        self.read_json(T::FILE)
    }

    /// Writes a document of its owner's type ([`RunDocument`]), pretty-printed and
    /// replaced atomically.
    pub fn write<T: RunDocument + Serialize>(&self, document: &T) -> anyhow::Result<()> {
        self.write_json(T::FILE, document)
    }

    /// A JSON file of the run directory; None when it is not there. One that cannot be
    /// read or parsed is an error naming it.
    fn read_json<T: DeserializeOwned>(&self, file: RunFile) -> anyhow::Result<Option<T>> {
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
    fn write_json<T: Serialize>(&self, file: RunFile, value: &T) -> anyhow::Result<()> {
        util::write_json_atomic(&self.path_of(file), value)
    }

    /// [`RunDir::write_json`] through a `serde_json::Value`, whose objects keep their
    /// keys sorted: the layout `plan.json`, `version.json` and `environment_check.json`
    /// have always had (they were written as `json!` values), so their bytes stay those
    /// of earlier runs.
    fn write_json_sorted<T: Serialize>(&self, file: RunFile, value: &T) -> anyhow::Result<()> {
        self.write_json(file, &serde_json::to_value(value)?)
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

/// The doors that hand out a path or a handle. Each exists because a writer outside the
/// store must be given a place: a process not ours (the gym, the agent, Slurm), a
/// writer that streams (the gym's stderr and events) or renders a page itself (the
/// report, the compare page), or a reader who links a file rather than reading it.
impl RunDir {
    /// `report.html`: the report writer writes it; `run`, `judge`, `start`, the hooks
    /// and the live view link it.
    pub fn report_path(&self) -> PathBuf {
        self.path_of(RunFile::Report)
    }

    /// `judgement.md`: the report writer writes it; the hooks link it where no report
    /// was written.
    pub fn judgement_markdown_path(&self) -> PathBuf {
        self.path_of(RunFile::JudgementMarkdown)
    }

    /// `compare.html`: `pruefstand compare` writes it and checks that a file there is
    /// its own page before it writes over it.
    pub fn compare_path(&self) -> PathBuf {
        self.path_of(RunFile::Compare)
    }

    /// A page or document of a judgement under other terms than the run's own, beside
    /// the run's (`judgement-<label>.json`, `judgement-<label>.md`,
    /// `report-<label>.html` for [`RunFile::Judgement`], [`RunFile::JudgementMarkdown`],
    /// [`RunFile::Report`]): `judge` writes it. `label` is letters, digits, `.`, `_`
    /// and `-`, not starting with a dot; another is refused.
    pub fn labelled_path(&self, file: RunFile, label: &str) -> anyhow::Result<PathBuf> {
        anyhow::ensure!(
            !label.starts_with('.') && label.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
            "{label:?} cannot label a judgement's file: letters, digits, '.', '_' and '-' only"
        );
        let name = file.name();
        let (stem, extension) = name.rsplit_once('.').unwrap_or((name, ""));
        Ok(self.path.join(format!("{stem}-{label}.{extension}")))
    }

    /// `gym-request.json`: `gym.py run` is handed its path (the store writes it, as a
    /// [`RunDocument`] of the gym's).
    pub fn gym_request_path(&self) -> PathBuf {
        self.path_of(RunFile::GymRequest)
    }

    /// `gym.log`: the gym's stderr is appended there by the process itself, and an
    /// error quotes it.
    pub fn gym_log_path(&self) -> PathBuf {
        self.path_of(RunFile::GymLog)
    }

    /// `agent.json`: the default agent runtime (`pruefstand agent --config`) is handed
    /// its path (the store writes it, as a [`RunDocument`] of the agent's).
    pub fn agent_config_path(&self) -> PathBuf {
        self.path_of(RunFile::AgentConfig)
    }

    /// `events.jsonl`, opened for appending: the gym's event stream as it arrives.
    pub fn open_events_log(&self) -> anyhow::Result<std::fs::File> {
        let path = self.path_of(RunFile::Events);
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
        file.with_context(|| format!("opening {}", path.display()))
    }

    /// `telemetry.md`, the Markdown twin of the telemetry (replaced atomically).
    pub fn write_telemetry_markdown(&self, text: &str) -> anyhow::Result<()> {
        util::write_atomic(&self.path_of(RunFile::TelemetryMarkdown), text.as_bytes())
    }

    /// Appends to `container.log` the model container's log as Docker gave it.
    pub fn append_container_log(&self, text: &[u8]) -> anyhow::Result<()> {
        use std::io::Write;
        let path = self.path_of(RunFile::ContainerLog);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        file.write_all(text).with_context(|| format!("writing {}", path.display()))
    }

    /// The adaptive attacker's own run directory of attempts (`adaptive/`), made here
    /// when it is not there yet: its rounds run into it.
    pub fn adaptive_runs(&self) -> anyhow::Result<RunDir> {
        let path = self.path_of(RunFile::AdaptiveRuns);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(RunDir::new(path))
    }

    /// The adaptive attacker's run directory of attempts (`adaptive/`) when the run has
    /// one, for a reader: never made ([`RunDir::adaptive_runs`] makes it for the
    /// campaign that writes it).
    pub fn adaptive_run(&self) -> Option<RunDir> {
        let path = self.path_of(RunFile::AdaptiveRuns);
        path.is_dir().then(|| RunDir::new(path))
    }

    /// A clustered job's shards folder (`shards/`): made user-only by the cluster, and
    /// Slurm writes each task's output there.
    pub fn shards_path(&self) -> PathBuf {
        self.path_of(RunFile::Shards)
    }

    /// Shard `index`'s own run directory (`shards/<index>`).
    pub fn shard(&self, index: usize) -> RunDir {
        RunDir::new(self.shards_path().join(index.to_string()))
    }

    /// The batch script of a clustered job's array: written by the cluster, handed to
    /// `sbatch`.
    pub fn shard_script_path(&self) -> PathBuf {
        self.path_of(RunFile::ShardScript)
    }

    /// Slurm's `--output` pattern for each array task (array id, task index).
    pub fn shard_output_pattern(&self) -> PathBuf {
        self.path_of(RunFile::ShardOutput)
    }

    /// The task outputs Slurm left in `shards/` (named by [`RunDir::shard_output_pattern`]):
    /// each one's (array id, task index), in no order. An array whose tasks already ran
    /// is found by them once `squeue` has forgotten it.
    pub fn shard_outputs(&self) -> Vec<(u64, usize)> {
        let pattern = RunFile::ShardOutput.name().rsplit('/').next().unwrap_or_default();
        let (Some((prefix, rest)), Some(suffix)) = (pattern.split_once("%A"), pattern.split_once("%a").map(|s| s.1))
        else {
            return Vec::new();
        };
        let between = rest.split_once("%a").map_or("", |(between, _)| between);
        let Ok(entries) = std::fs::read_dir(self.path_of(RunFile::Shards)) else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let (array, task) = name.strip_prefix(prefix)?.strip_suffix(suffix)?.split_once(between)?;
                Some((array.parse().ok()?, task.parse().ok()?))
            })
            .collect()
    }

    /// Removes a shard's `exit.json` before the shard runs again (a requeue): its old
    /// one must not be read as the new run's end.
    pub fn remove_shard_exit(&self) -> anyhow::Result<()> {
        let path = self.path_of(RunFile::ShardExit);
        match std::fs::remove_file(&path) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                Err(err).with_context(|| format!("removing {}", path.display()))
            }
            _ => Ok(()),
        }
    }

    /// Copies `version.json` from `other` byte for byte (a clustered run's merge takes a
    /// shard's); false when `other` has none.
    pub fn copy_version_from(&self, other: &RunDir) -> anyhow::Result<bool> {
        let from = other.path_of(RunFile::Version);
        if !from.is_file() {
            return Ok(false);
        }
        std::fs::copy(&from, self.path_of(RunFile::Version)).with_context(|| format!("copying {}", from.display()))?;
        Ok(true)
    }

    /// Takes `run.lock` when the directory has one (a run wrote there): None when it has
    /// none, else the lock or who holds it. For a reader that must not read a run
    /// still being written (judge, export, compare); a writer claims the directory.
    pub fn lock_if_written(&self, holder: Option<&str>) -> Result<Option<RunLock>, LockError> {
        let path = self.path_of(RunFile::Lock);
        if !path.is_file() {
            return Ok(None);
        }
        match holder {
            Some(holder) => RunLock::try_take_as(&path, holder).map(Some),
            None => RunLock::try_take(&path).map(Some),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    use pruefstand_core::case::{Case, CaseRecord};

    pub(super) fn record(id: &str, utility: bool) -> CaseRecord {
        CaseRecord { case_id: id.into(), ..CaseRecord::of(&Case::clean("s", "u"), Some(utility), None) }
    }

    pub(super) fn identity(version: &str) -> Identity {
        Identity {
            version: version.into(),
            spec_hash: format!("{version}-spec-hash-0000"),
            plan_hash: "plan-hash-000000".into(),
            benchmark_version: "v1.2.2".into(),
        }
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
        let inventory = pruefstand_core::plan::tests::inventory();
        let mut plan = Plan::resolve(&profile, &inventory, &Default::default()).unwrap();
        for adaptive in
            [None, Some(Adaptive { attempts: 2, families: vec!["roleplay".into()], pairs: vec![], attacker: None })]
        {
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
            check("injection_task_0", pruefstand_core::record::EnvStatus::Ok),
            check("injection_task_1", pruefstand_core::record::EnvStatus::Failed),
        ];
        util::write_json_atomic(&old.path_of(RunFile::EnvironmentCheck), &serde_json::json!({ "checks": checks }))
            .unwrap();
        new.write_environment_checks(&checks).unwrap();
        assert_eq!(bytes(&new, RunFile::EnvironmentCheck), bytes(&old, RunFile::EnvironmentCheck));
        assert_eq!(new.read_environment_checks().unwrap().unwrap(), checks);
    }
}
