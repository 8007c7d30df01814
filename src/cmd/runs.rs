//! Which run directory a command-line word names, for the commands that read finished
//! runs (`compare`, `export`, `judge`, `show`): a path, `latest`, `job:N`, or a version name.
//!
//! - A word containing `/`, or naming a folder that exists (relative to the working
//!   directory), is that folder — what these commands always took.
//! - `latest`: the newest finished run under the root's `reports/`, of any version.
//! - `job:N`: the run directory of job N in the root's queue (`pruefstand queue`
//!   lists them). Not `#N`: a shell takes a word starting with `#` for a comment.
//! - Any other word is a version name: its newest finished run under
//!   `reports/<name>/`, on any plan.
//!
//! "Finished" is a run with a `judgement.json`; "newest" is by the time it started, as
//! the trend index orders runs. Each word that was not a path is said on stderr with
//! the folder it became, so a comparison never rests on a guess nobody saw.
//!
//! Not here: reading or locking the runs (the commands').

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use pruefstand_core::input::quoted;
use pruefstand_core::queue::Queue;
use pruefstand_core::root::Root;

/// What a run word may be, for a command's `--help` and its errors.
pub(super) const WORDS: &str =
    "a run directory, a version name (its newest finished run under reports/), job:N (job N's run) or latest";

/// The run directory each word names, in order; an error names the word that names
/// none. The root is found only when a word needs it.
pub(crate) fn resolve(root: Option<&Path>, words: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut found: Option<Root> = None;
    let mut dirs = Vec::with_capacity(words.len());
    for word in words {
        let text = word.to_string_lossy();
        if is_path(word) {
            dirs.push(word.clone());
            continue;
        }
        if found.is_none() {
            let root = Root::find(root.map(Path::to_path_buf))
                .with_context(|| format!("{}: a name needs a bench root to look it up in", quoted(&text)))?;
            found = Some(root);
        }
        let root = found.as_ref().expect("found above");
        let (dir, how) = named(root, &text)?;
        tracing::info!("{}: {} ({how})", text, dir.display());
        dirs.push(dir);
    }
    Ok(dirs)
}

/// A word with a `/` in it, or a folder that is there: taken as given.
fn is_path(word: &Path) -> bool {
    word.to_string_lossy().contains('/') || word.is_dir()
}

/// The run a word that is not a path names, and how it was found.
fn named(root: &Root, word: &str) -> anyhow::Result<(PathBuf, String)> {
    let reports = root.reports();
    if word == "latest" {
        let runs = finished_runs(&reports, 2)?;
        return match newest(runs) {
            Some(dir) => Ok((dir, "the newest finished run".into())),
            None => bail!("\"latest\": no finished run under {} yet", reports.display()),
        };
    }
    if let Some(id) = word.strip_prefix("job:") {
        let queue = Queue::open(root)?;
        let job = queue.find(id).with_context(|| format!("{}: not a job of {}", quoted(word), root.path.display()))?;
        let dir = job.run_dir.clone().with_context(|| {
            format!("{}: job {} has no run directory yet ({})", quoted(word), job.id, job.state.as_str())
        })?;
        anyhow::ensure!(
            dir.is_dir(),
            "{}: job {}'s run directory {} is not there (removed?)",
            quoted(word),
            job.id,
            dir.display()
        );
        return Ok((dir, format!("job {}, {} on {}", job.id, job.version, job.plan)));
    }
    if pruefstand_core::input::check_name(word).is_err() || !reports.join(word).is_dir() {
        let cwd = std::env::current_dir().map_or_else(|_| "?".into(), |d| d.display().to_string());
        bail!(
            "{}: no such run: not a folder (relative to {cwd}), and no version of that name has runs under {}; \
             name {WORDS}",
            quoted(word),
            reports.display()
        );
    }
    match newest(finished_runs(&reports.join(word), 1)?) {
        Some(dir) => Ok((dir, format!("the newest finished run of {word}"))),
        None => bail!(
            "{}: version {word} has no finished run under {} (a run with a judgement.json)",
            quoted(word),
            reports.join(word).display()
        ),
    }
}

/// The newest finished run of `version` on the plan named `plan`, if any.
pub(crate) fn newest_on_plan(root: &Root, version: &str, plan: &str) -> anyhow::Result<Option<PathBuf>> {
    Ok(newest(finished_runs(&root.reports().join(version).join(plan), 0)?))
}

/// The folders `depth + 1` levels below `dir` that hold a judgement, with when each
/// started: runs are `reports/<version>/<plan>/<run>`, so 2 below `reports/` and 1
/// below a version's folder.
fn finished_runs(dir: &Path, depth: usize) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut level = vec![dir.to_path_buf()];
    for _ in 0..=depth {
        let mut next = Vec::new();
        for folder in &level {
            let entries = match std::fs::read_dir(folder) {
                Ok(entries) => entries,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err).with_context(|| format!("listing {}", folder.display())),
            };
            next.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
        level = next;
    }
    Ok(level.into_iter().filter_map(|run| Some((started(&run)?, run))).collect())
}

/// When a finished run started (its judgement's `started_at`, else when it was
/// judged): RFC 3339, which sorts as text. None: no readable judgement.
fn started(run: &Path) -> Option<String> {
    let judgement = pruefstand_judge::StoredJudgement::read(&pruefstand_store::RunDir::new(run)).ok()??;
    Some(judgement.started().unwrap_or_default().to_string())
}

/// The newest of `runs` (by start, then by folder name).
fn newest(mut runs: Vec<(String, PathBuf)>) -> Option<PathBuf> {
    runs.sort();
    runs.pop().map(|(_, dir)| dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(root: &Path, rel: &str, started_at: &str) -> PathBuf {
        let dir = root.join(rel);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            pruefstand_store::RunDir::new(&dir).test_file(pruefstand_store::RunFile::Judgement),
            format!("{{\"started_at\": \"{started_at}\"}}"),
        )
        .unwrap();
        dir
    }

    #[test]
    fn the_newest_finished_run_is_by_start_not_by_folder_name() {
        let dir = tempfile::tempdir().unwrap();
        let reports = dir.path();
        run(reports, "a/schnell/20260101T000000Z-aaa", "2026-01-01T00:00:00Z");
        let newer = run(reports, "a/nacht/my-own-name", "2026-01-02T00:00:00Z");
        // Started later, never judged: not finished.
        std::fs::create_dir_all(reports.join("a/schnell/20260103T000000Z-ccc")).unwrap();
        run(reports, "b/schnell/20251231T000000Z-bbb", "2025-12-31T00:00:00Z");
        assert_eq!(newest(finished_runs(&reports.join("a"), 1).unwrap()), Some(newer.clone()));
        assert_eq!(newest(finished_runs(reports, 2).unwrap()), Some(newer));
        assert_eq!(newest(finished_runs(&reports.join("nobody"), 1).unwrap()), None);
    }
}
