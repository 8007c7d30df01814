//! `traces/`: AgentDojo's trace of each case, written by the gym's Python side, and
//! read here for everyone who shows or takes a conversation (the report, the compare
//! page, the export, the adaptive attacker's feedback): one door, [`RunDir::trace`], by
//! the case's record, so that every reader refuses the same paths and links.

use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use super::{RunDir, RunFile};
use pruefstand_core::case::CaseRecord;

/// The most of one trace that is read (a report shows it, an export takes it): a
/// conversation of a `voll` case is tens of kilobytes; a model that wrote megabytes is
/// refused.
const MAX_TRACE_BYTES: u64 = 4 << 20;

/// Why a case's trace was not read. Each reader says it in its own words (the report
/// shows it beside the case, the export counts the case as skipped or refuses the run).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The record names no trace.
    #[error("no trace recorded")]
    NotRecorded,
    /// The record names a path that is not inside the run directory (absolute, `..`).
    #[error("trace path {0} refused (not inside the run directory)")]
    Outside(String),
    /// A folder on the way to it is a link (a copied run's `traces/` pointing at
    /// another run's): never followed.
    #[error("{} is a link, never followed", .0.display())]
    LinkedFolder(PathBuf),
    /// The file could not be read: missing, a link itself, over the size limit.
    #[error("{0}")]
    Unreadable(std::io::Error),
    /// It is not JSON.
    #[error("{0}")]
    NotJson(serde_json::Error),
}

impl RunDir {
    /// The trace of a case this run recorded, as JSON: the file its record names,
    /// relative to the run directory, read never through a link (neither the file nor a
    /// folder on its way: a link could show a file from anywhere, or another run's) and
    /// not beyond 4 MiB.
    pub fn trace(&self, record: &CaseRecord) -> Result<Value, TraceError> {
        let relative = record.trace.as_deref().ok_or(TraceError::NotRecorded)?;
        if !readable(relative) {
            return Err(TraceError::Outside(relative.to_string()));
        }
        let path = self.path.join(relative);
        if let Some(folder) =
            path.ancestors().skip(1).take_while(|folder| *folder != self.path).find(|folder| is_link(folder))
        {
            return Err(TraceError::LinkedFolder(folder.to_path_buf()));
        }
        let text = read_trace(&path).map_err(TraceError::Unreadable)?;
        serde_json::from_str(&text).map_err(TraceError::NotJson)
    }

    /// Whether its `traces/` folder is a link: an export refuses such a run outright
    /// (a copied run's link would put another run's conversations under its verdicts).
    /// Its path, for the refusal, is [`RunDir::shown`]`(`[`RunFile::Traces`]`)`.
    pub fn traces_are_linked(&self) -> bool {
        is_link(&self.path_of(RunFile::Traces))
    }
}

fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_symlink())
}

/// A trace path that may be read: relative, inside the run directory.
fn readable(path: &str) -> bool {
    !path.is_empty() && Path::new(path).components().all(|c| matches!(c, Component::Normal(_)))
}

/// A trace file of the run: never through a link (a link in `traces/` could show a
/// file from anywhere), and not beyond [`MAX_TRACE_BYTES`].
fn read_trace(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    if is_link(path) {
        return Err(std::io::Error::other("a link, not followed"));
    }
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_TRACE_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_TRACE_BYTES {
        return Err(std::io::Error::other(format!("over {} MiB", MAX_TRACE_BYTES >> 20)));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_inside_the_run_directory_are_read() {
        assert!(readable("traces/a/b.json"));
        assert!(!readable("../x.json") && !readable("/etc/passwd") && !readable("traces/../../x") && !readable(""));
    }

    #[test]
    fn a_trace_is_read_by_its_case_never_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let run = RunDir::new(tmp.path().join("run"));
        std::fs::create_dir_all(run.path_of(RunFile::Traces).join("banking")).unwrap();
        let mut record = crate::tests::record("c", true);
        assert!(matches!(run.trace(&record), Err(TraceError::NotRecorded)));
        record.trace = Some("../elsewhere.json".into());
        assert!(matches!(run.trace(&record), Err(TraceError::Outside(_))));

        record.trace = Some("traces/banking/c.json".into());
        assert!(matches!(run.trace(&record), Err(TraceError::Unreadable(_))), "missing");
        std::fs::write(run.path_of(RunFile::Traces).join("banking/c.json"), "{\"messages\": []}").unwrap();
        assert_eq!(run.trace(&record).unwrap(), serde_json::json!({"messages": []}));
        std::fs::write(run.path_of(RunFile::Traces).join("banking/c.json"), "{not json").unwrap();
        assert!(matches!(run.trace(&record), Err(TraceError::NotJson(_))));

        // A file outside, reached through a linked file or a linked folder, is not read.
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("c.json"), "{}").unwrap();
        std::fs::remove_file(run.path_of(RunFile::Traces).join("banking/c.json")).unwrap();
        std::os::unix::fs::symlink(outside.join("c.json"), run.path_of(RunFile::Traces).join("banking/c.json"))
            .unwrap();
        let err = run.trace(&record).unwrap_err();
        assert!(matches!(err, TraceError::Unreadable(_)) && err.to_string() == "a link, not followed", "{err}");
        std::fs::remove_dir_all(run.path_of(RunFile::Traces)).unwrap();
        assert!(!run.traces_are_linked());
        std::os::unix::fs::symlink(&outside, run.path_of(RunFile::Traces)).unwrap();
        std::fs::create_dir_all(outside.join("banking")).unwrap();
        std::fs::write(outside.join("banking/c.json"), "{}").unwrap();
        assert!(run.traces_are_linked());
        assert!(matches!(run.trace(&record), Err(TraceError::LinkedFolder(f)) if f == run.path_of(RunFile::Traces)));
    }
}
