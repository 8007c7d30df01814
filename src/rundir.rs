//! A run directory and the files in it: `cases.jsonl` (the durable record of finished
//! cases), `plan.json`, `events.jsonl`, and the paths of everything else a run writes.
//!
//! `cases.jsonl` is append-only while a run goes on, one fsync'd line per case, so a
//! crash at any point loses at most the case in flight; reading it back tolerates a
//! truncated last line. It does not decide what to run: `gym` does.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::case::{Case, CaseRecord};
use crate::util;

pub struct RunDir {
    pub path: PathBuf,
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

    /// Creates the folder (user-only: traces can hold model outputs).
    pub fn create(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.path)
            .with_context(|| format!("creating run directory {}", self.path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o700))?;
        Ok(())
    }

    /// Reads `cases.jsonl` leniently, for resuming: damaged lines are reported, and
    /// their cases will run again.
    pub fn read_cases_lenient(&self) -> anyhow::Result<StoredCases> {
        let path = self.cases_file();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
        };
        let mut stored = StoredCases { records: BTreeMap::new(), damaged: Vec::new() };
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<CaseRecord>(line) {
                Ok(record) => {
                    stored.records.insert(record.case_id.clone(), record);
                }
                Err(err) => stored.damaged.push(format!("{}:{}: {err}", path.display(), index + 1)),
            }
        }
        Ok(stored)
    }

    /// Reads `cases.jsonl` strictly, for judging: any damaged line is an error naming
    /// the file and line.
    pub fn read_cases_strict(&self) -> anyhow::Result<Vec<CaseRecord>> {
        let path = self.cases_file();
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut records = Vec::new();
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let record: CaseRecord = serde_json::from_str(line)
                .with_context(|| format!("{}:{}: not a case record", path.display(), index + 1))?;
            records.push(record);
        }
        Ok(records)
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

    /// Refuses to mix runs: a run directory belongs to one case list.
    pub fn claim_plan(&self, plan_json: &serde_json::Value, hash: &str) -> anyhow::Result<()> {
        let path = self.file("plan.json");
        if let Ok(text) = std::fs::read_to_string(&path) {
            let existing: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
            let existing_hash = existing.get("hash").and_then(|h| h.as_str()).unwrap_or("");
            if existing_hash != hash {
                bail!(
                    "{} holds a run of another case list (plan hash {}…, requested {}…); choose another --out",
                    self.path.display(),
                    &existing_hash.get(..12).unwrap_or(existing_hash),
                    &hash[..12]
                );
            }
            return Ok(());
        }
        util::write_json_atomic(&path, plan_json)
    }
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
