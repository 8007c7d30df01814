//! The names of a run directory's files: [`RunFile`] lists every file and folder a run
//! writes, with what it holds and who writes it. Only the store turns a name into a
//! path ([`RunFile::path_in`] is private to it): everyone else asks the store for what
//! a file holds.

use std::path::{Path, PathBuf};

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
    /// Whose run the directory holds ([`Identity`](super::Identity)), its seed and when it
    /// was made; written once by [`RunDir::claim`](super::RunDir::claim), which checks it
    /// on every later claim.
    Identity => "identity.json",
    /// The flock a run holds while it writes here, its holder written inside
    /// ([`RunDir::claim`](super::RunDir::claim)).
    Lock => "run.lock",
    /// The cases the directory runs ([`PlanFile`](super::PlanFile)): written once by `gym`
    /// (a clustered run's merge writes the job's); read by the judge, the reference search
    /// and [`RunDir::claim`](super::RunDir::claim) of a directory older than
    /// `identity.json`.
    Plan => "plan.json",
    /// The version that ran ([`VersionFile`](super::VersionFile)): written by `run` (a
    /// clustered run's merge copies a shard's); read by the reference search.
    Version => "version.json",
    /// One case record per finished case, one fsync'd line each: the gym's record sink
    /// appends ([`CasesWriter`](super::CasesWriter)),
    /// [`RunDir::compact_cases`](super::RunDir::compact_cases) rewrites it in plan order,
    /// the judge reads it.
    Cases => "cases.jsonl",
    /// `cases.jsonl`'s sha256 as the run last wrote it (`sha256sum` format), so the judge
    /// can tell when the file changed afterwards
    /// ([`RunDir::compact_cases`](super::RunDir::compact_cases)).
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
    /// An early-stopping run's user-task order and whether it stopped
    /// ([`EarlyStop`](pruefstand_core::record::EarlyStop)), written by `run` when the order is drawn
    /// and after each pass.
    EarlyStop => "early_stop.json",
    /// The adaptive attacker's own run directory of attempts (`adaptive`).
    AdaptiveRuns => "adaptive",
    /// The adaptive attacker's search log ([`SearchLog`](pruefstand_core::record::SearchLog)):
    /// written by `adaptive` after each attempt, read by the judge.
    AdaptiveLog => "adaptive.json",
    /// The attacker's frozen templates as a family a plan can name
    /// ([`FoundFamily`](pruefstand_core::record::FoundFamily)): written by `adaptive` after the
    /// search when an attacker model wrote them.
    FoundFamily => "found-family.json",
    /// The run's facts ([`RunMeta`](pruefstand_core::record::RunMeta)): written by `run` before it
    /// judges, read by the judge and the reference search.
    RunMeta => "run.json",
    /// The rule thresholds of the run's plan
    /// ([`Thresholds`](pruefstand_core::settings::thresholds::Thresholds)): written by `run`, read by
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
    pub(super) fn path_in(self, run_dir: &Path) -> PathBuf {
        run_dir.join(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // Every crate's sources (crates/*/src) and the binary's at the repository root.
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        // Compared canonical: this crate's folder is read as `crates/store/../store/src`.
        let this = src.join("files.rs").canonicalize().unwrap();
        let mut files = Vec::new();
        for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("..")).unwrap() {
            sources(&entry.unwrap().path().join("src"), &mut files);
        }
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
        for file in files.iter().filter(|file| file.canonicalize().unwrap() != this) {
            let text = std::fs::read_to_string(file).unwrap();
            for (number, line) in text.lines().enumerate() {
                for literal in literals.iter().filter(|literal| line.contains(literal.as_str())) {
                    found.push(format!("{}:{}: {literal}", file.display(), number + 1));
                }
            }
        }
        assert!(files.len() > 50, "read {} files under {}", files.len(), src.display());
        assert!(found.is_empty(), "name these through pruefstand_store::RunFile:\n{}", found.join("\n"));
    }
}
