//! The names of a run directory's files: [`RunFile`] lists every file and folder a run
//! writes, with what it holds and who writes it. The names are the store's alone
//! ([`RunFile::name`] and [`RunFile::path_in`] are private to it): everyone else asks
//! the store for what a file holds, and names a file only as a [`RunFile`] (a
//! document's file, a file in a message, a link from a page).

use std::path::{Path, PathBuf};

/// Declares [`RunFile`] with its names and the list of all of them, so neither can
/// miss a file.
macro_rules! run_files {
    ($($(#[doc = $doc:literal])* $file:ident => $name:literal,)*) => {
        /// A file or folder of a run directory: what it holds, who writes it, who reads
        /// it. Its name is the store's ([`RunFile::name`], relative to the run directory).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum RunFile {
            $($(#[doc = $doc])* $file,)*
        }

        impl RunFile {
            /// Every file and folder, in the order they are declared.
            #[cfg_attr(not(test), allow(dead_code))]
            pub(crate) const ALL: &[RunFile] = &[$(RunFile::$file,)*];

            /// Its path relative to the run directory: the store's alone.
            pub(crate) const fn name(self) -> &'static str {
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

    /// The files and folders the gym's Python side writes itself, with their names (all
    /// else reaches pruefstand as events, and pruefstand writes it): the gym is told
    /// these names by its contract (`constants.json`), so the Python spells none of them.
    pub fn written_by_the_gym() -> Vec<(RunFile, &'static str)> {
        [RunFile::Traces].into_iter().map(|file| (file, file.name())).collect()
    }

    /// Its link from a page that reaches the run directory as `run_href` ("" from a page
    /// in it, else a relative link ending in '/'): a URL in a page (a report links its
    /// compare page, a compare page each run's report), never a path to open.
    pub fn href(self, run_href: &str) -> String {
        format!("{run_href}{}", self.name())
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

    /// This file is the only one that spells a run file's name as a string literal, and
    /// the store the only crate that turns a [`RunFile`] into a path: a name written
    /// anywhere else would be a second spelling to drift from its readers, and a path
    /// built elsewhere a reader beside the store's. Outside the store no source file
    /// may hold a run file's name in quotes (or at the end of a quoted path, or the
    /// fixed start of a pattern's: `"slurm-`), a `RunFile::X.name()` call, or a
    /// `.join(` of a `RunFile`. Folders (no dot in their names: `shards`, `traces`,
    /// `adaptive`) are common words and are not looked for.
    #[test]
    fn no_other_source_file_names_a_run_file() {
        fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
            let Ok(entries) = std::fs::read_dir(dir) else { return };
            for entry in entries {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    sources(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        // Every crate's sources (crates/*/src) and the binary's at the repository root.
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let src = manifest.join("src");
        // Compared canonical: this crate's folder is read as `crates/store/../store/src`.
        let (this, store) = (src.join("files.rs").canonicalize().unwrap(), src.canonicalize().unwrap());
        let mut files = Vec::new();
        for entry in std::fs::read_dir(manifest.join("..")).unwrap() {
            sources(&entry.unwrap().path().join("src"), &mut files);
        }
        sources(&manifest.join("../../src"), &mut files);
        let named: Vec<&str> = RunFile::ALL.iter().map(|file| file.name()).filter(|name| name.contains('.')).collect();
        let own = std::fs::read_to_string(&this).unwrap();
        assert!(named.iter().all(|name| own.contains(&format!("\"{name}\""))), "the search finds them here");
        let mut found = Vec::new();
        for file in &files {
            let canonical = file.canonicalize().unwrap();
            if canonical == this {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            let outside = !canonical.starts_with(&store);
            for (number, line) in text.lines().enumerate() {
                let at = format!("{}:{}", file.display(), number + 1);
                found.extend(named_in(line, &named).into_iter().map(|why| format!("{at}: {why}")));
                if outside {
                    found.extend(path_built_in(line).into_iter().map(|why| format!("{at}: {why}")));
                }
            }
        }
        assert!(files.len() > 50, "read {} files under {}", files.len(), src.display());
        assert!(found.is_empty(), "ask pruefstand_store::RunDir for these:\n{}", found.join("\n"));
    }

    /// A run file's name spelled in `line`: quoted whole (`"cases.jsonl"`, the last part
    /// of a name in a folder: `"shard.sbatch"`), the fixed start of a pattern's name
    /// (`"slurm-`), or ending a quoted path that is joined or opened (`.join("a/b/
    /// report.html")`, `fs::write("…/judgement.json", …)`; a link a page is expected to
    /// hold is a URL, not a path).
    fn named_in(line: &str, named: &[&str]) -> Vec<String> {
        let mut spellings: Vec<String> = Vec::new();
        let opened = line.contains(".join(") || line.contains("fs::");
        for name in named {
            let last = name.rsplit('/').next().unwrap_or_default();
            spellings.extend([format!("\"{name}\""), format!("\"{last}\"")]);
            if opened {
                spellings.push(format!("/{last}\""));
            }
            if let Some((start, _)) = last.split_once('%') {
                spellings.push(format!("\"{start}"));
            }
        }
        spellings.sort();
        spellings.dedup();
        spellings.into_iter().filter(|spelling| line.contains(spelling.as_str())).collect()
    }

    /// A run file turned into a path or a name in `line`: `RunFile::X.name()`, or a
    /// `.join(` whose argument names a `RunFile`.
    fn path_built_in(line: &str) -> Vec<String> {
        let mut found = Vec::new();
        for (at, _) in line.match_indices("RunFile::") {
            let rest = &line[at + "RunFile::".len()..];
            let variant = rest.split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap_or_default();
            if rest[variant.len()..].starts_with(".name()") {
                found.push(format!("RunFile::{variant}.name()"));
            }
        }
        if line.match_indices(".join(").any(|(at, _)| argument(&line[at + ".join(".len()..]).contains("RunFile::")) {
            found.push("a .join( of a RunFile".to_string());
        }
        found
    }

    /// The argument of a call whose `(` just ended: up to its closing parenthesis, or
    /// the rest of the line when it goes on below.
    fn argument(after: &str) -> &str {
        let mut depth = 1;
        for (at, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 1 => return &after[..at],
                ')' => depth -= 1,
                _ => {}
            }
        }
        after
    }

    /// The guard's own searches find what they look for (and nothing in a plain line).
    #[test]
    fn the_guard_finds_each_spelling_of_a_run_file() {
        let named = ["cases.jsonl", "shards/shard.sbatch", "shards/slurm-%A_%a.out"];
        for line in [
            r#"dir.join("cases.jsonl")"#,
            r#"std::fs::read(format!("{}/cases.jsonl", dir))"#,
            r#"reports.join("v/plan/run/cases.jsonl")"#,
            r#"let script = "shard.sbatch";"#,
            r#"name.strip_prefix("slurm-")"#,
        ] {
            assert!(!named_in(line, &named).is_empty(), "{line}");
        }
        assert!(named_in("// cases.jsonl is appended", &named).is_empty());
        assert!(named_in(r#"assert!(html.contains(r"href="v1/p/r0/cases.jsonl""));"#, &named).is_empty(), "a URL");
        for line in [
            "let name = RunFile::Cases.name();",
            "dir.join(pruefstand_store::RunFile::Judgement.name())",
            "dir.join(RunFile::Cases.path_in(x))",
        ] {
            assert!(!path_built_in(line).is_empty(), "{line}");
        }
        assert!(path_built_in("run.shown(RunFile::Cases)").is_empty());
        assert!(path_built_in(r#"RunDir::new(dir.join("x")).test_file(RunFile::Cases)"#).is_empty());
        assert!(path_built_in("const FILE: RunFile = RunFile::Judgement;").is_empty());
    }
}
