//! `cases.jsonl`: one fsync'd line per finished case, appended while a run goes on, so
//! a crash at any point loses at most the case in flight; reading it back tolerates a
//! truncated last line. The store is its one reader and writer: appending
//! ([`CasesWriter`]), reading whole ([`RunDir::read_cases`]) or from an offset,
//! counting, compacting, and dropping records under the run's lock. It does not
//! decide what to run: `gym` does.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};

use super::{RunDir, RunFile};
use pruefstand_core::case::{Case, CaseRecord};
use pruefstand_core::util;

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
            format!("duration_s is {}, not a case's time in seconds", pruefstand_core::input::readable_number(d)),
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
    /// Reads `cases.jsonl`, the one reader of it: every record in file order with its
    /// line, and the file's sha256. [`Reading::Strict`] (judging): a missing file or a
    /// line that is not a case record is an error naming the file and line, and a
    /// field a record cannot hold as written is a fault R1 fails on (read as missing).
    /// [`Reading::Lenient`] (resuming, merging): a missing file is empty, a damaged line
    /// is reported in `damaged` and its case runs again.
    pub fn read_cases(&self, how: Reading) -> anyhow::Result<CasesFile> {
        let path = self.path_of(RunFile::Cases);
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
        let path = self.path_of(RunFile::Cases);
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
            std::fs::copy(self.path_of(RunFile::Cases), &backup)
                .with_context(|| format!("keeping {}", backup.display()))?;
        }
        let records: Vec<CaseRecord> = plan.iter().filter_map(|case| stored.records.get(&case.id).cloned()).collect();
        let mut text = Vec::new();
        for record in &records {
            serde_json::to_writer(&mut text, record)?;
            text.push(b'\n');
        }
        util::write_atomic(&self.path_of(RunFile::Cases), &text)?;
        let digest = format!("{}  {}\n", util::sha256_hex(&text), RunFile::Cases.name());
        util::write_atomic(&self.path_of(RunFile::CasesDigest), digest.as_bytes())?;
        Ok(records)
    }
}

/// `cases.jsonl` read on from an offset ([`RunDir::read_cases_from`]).
#[derive(Debug, Default)]
pub struct CasesTail {
    /// The records of the whole lines after the offset; a line that is not a case
    /// record is skipped.
    pub records: Vec<CaseRecord>,
    /// Where the next read goes on: after the last whole line (a line still being
    /// written is read whole next time).
    pub next_offset: u64,
    /// The file was shorter than the offset (rewritten, or another run's): it was read
    /// from its start, and what was counted before is void.
    pub restarted: bool,
}

/// The doors to `cases.jsonl` for those who follow a run rather than judge it.
impl RunDir {
    /// Makes an empty `cases.jsonl` where there is none: a run cut short before its
    /// first case is judged on its (empty) records.
    pub fn ensure_cases(&self) -> anyhow::Result<()> {
        let path = self.path_of(RunFile::Cases);
        if !path.exists() {
            util::write_atomic(&path, b"")?;
        }
        Ok(())
    }

    /// The bytes `cases.jsonl` holds now (0: none yet).
    pub fn cases_len(&self) -> u64 {
        std::fs::metadata(self.path_of(RunFile::Cases)).map_or(0, |m| m.len())
    }

    /// The records of the whole lines from byte `offset` on (a live view's tally reads
    /// on from where it stopped). A missing file is empty.
    pub fn read_cases_from(&self, offset: u64) -> anyhow::Result<CasesTail> {
        use std::io::{Read, Seek};
        let path = self.path_of(RunFile::Cases);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Ok(CasesTail { restarted: offset > 0, ..CasesTail::default() });
            }
            Err(err) => return Err(err).with_context(|| format!("opening {}", path.display())),
        };
        let len = file.metadata().with_context(|| format!("reading {}", path.display()))?.len();
        let restarted = len < offset;
        let start = if restarted { 0 } else { offset };
        let mut bytes = Vec::new();
        file.seek(std::io::SeekFrom::Start(start))
            .and_then(|_| file.read_to_end(&mut bytes))
            .with_context(|| format!("reading {}", path.display()))?;
        let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |end| end + 1);
        let records = lines(&bytes[..whole]).filter_map(|(_, line)| serde_json::from_slice(line).ok()).collect();
        Ok(CasesTail { records, next_offset: start + whole as u64, restarted })
    }

    /// How many records `cases.jsonl` holds (its non-blank lines; 0: none yet).
    pub fn count_cases(&self) -> usize {
        std::fs::read(self.path_of(RunFile::Cases)).map_or(0, |bytes| lines(&bytes).count())
    }

    /// The case ids recorded in the first `len` bytes of `cases.jsonl` (what was there
    /// at a moment the file was `len` bytes long).
    pub fn case_ids_within(&self, len: u64) -> std::collections::BTreeSet<String> {
        let bytes = std::fs::read(self.path_of(RunFile::Cases)).unwrap_or_default();
        let prefix = &bytes[..bytes.len().min(len as usize)];
        lines(prefix)
            .filter_map(|(_, line)| serde_json::from_slice::<CaseRecord>(line).ok())
            .map(|r| r.case_id)
            .collect()
    }

    /// The sha256 the run recorded when it wrote `cases.jsonl` (`cases.sha256`, in
    /// `sha256sum` format); None when the file is missing (a run cut short, an older
    /// run).
    pub fn recorded_cases_sha256(&self) -> anyhow::Result<Option<String>> {
        let path = self.path_of(RunFile::CasesDigest);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(text.split_whitespace().next().map(str::to_string)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Why `cases.jsonl`, whose sha256 as read is `now`, cannot be taken as the file its
    /// run wrote: it differs from the sha256 the run recorded (`recorded`, from
    /// [`RunDir::recorded_cases_sha256`]), or that record is missing (a run writes it
    /// before it is judged, so only a deleted digest or a run from before digests lacks
    /// it). None: the file is as its run left it. The judge asks it of a run and of its
    /// reference alike.
    pub fn cases_untrusted(&self, now: &str, recorded: Option<&str>) -> Option<String> {
        let (file, digest) = (self.shown(RunFile::Cases), RunFile::CasesDigest.name());
        match recorded {
            None => Some(format!(
                "{file} has no {digest} beside it: whether it changed since its run wrote it cannot be checked"
            )),
            Some(recorded) if recorded != now => {
                Some(format!("{file} changed since its run wrote it (its sha256 differs from {digest})"))
            }
            Some(_) => None,
        }
    }

    /// Keeps the records of `cases.jsonl` that `keep` accepts (and every line that is
    /// not a case record, as it was), replacing the file atomically; the number dropped.
    ///
    /// A rewrite is the one change to the file besides appending, so it runs under the
    /// run's lock: when no one holds `run.lock` it is taken for the rewrite; when this
    /// process holds it (the run that claimed the directory, whose model server's
    /// watch drops a dead server's casualties) the rewrite goes on; when another
    /// process holds it, it is refused rather than waited for, as that run appends as
    /// it pleases. The lock cannot tell this process's own appender from the caller:
    /// the caller calls between the gym's passes, when no [`CasesWriter`] is open (a
    /// writer open across the rename would append to the replaced file, and its records
    /// would be lost).
    pub fn retain_cases(&self, mut keep: impl FnMut(&CaseRecord) -> bool) -> anyhow::Result<usize> {
        let _held = self.hold_for_rewrite()?;
        let path = self.path_of(RunFile::Cases);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let mut kept = Vec::with_capacity(bytes.len());
        let mut dropped = 0;
        for (_, line) in lines(&bytes) {
            if serde_json::from_slice::<CaseRecord>(line).is_ok_and(|record| !keep(&record)) {
                dropped += 1;
            } else {
                kept.extend_from_slice(line);
                kept.push(b'\n');
            }
        }
        if dropped > 0 {
            util::write_atomic(&path, &kept)?;
        }
        Ok(dropped)
    }

    /// The run's lock for a rewrite of its cases: taken (Some) when free, None when this
    /// process holds it, an error naming the holder when another one does.
    fn hold_for_rewrite(&self) -> anyhow::Result<Option<super::RunLock>> {
        match super::RunLock::try_take(&self.path_of(RunFile::Lock)) {
            Ok(lock) => Ok(Some(lock)),
            Err(super::LockError::Busy { holder }) if holder.starts_with(&format!("pid {} ", std::process::id())) => {
                Ok(None)
            }
            Err(super::LockError::Busy { holder }) => {
                bail!("{} is being written by {}: its cases are not rewritten", self.path.display(), holder.trim())
            }
            Err(super::LockError::Failed(err)) => Err(err),
        }
    }
}

/// The non-blank lines of a JSON-lines file with their 1-based numbers, as bytes: a
/// line that is not UTF-8 is one damaged record, not an unreadable file.
fn lines(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    bytes
        .split(|b| *b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.iter().all(u8::is_ascii_whitespace))
        .map(|(index, line)| (index + 1, line))
}

pub struct CasesWriter {
    file: File,
    path: PathBuf,
}

impl CasesWriter {
    /// Appends one record and makes it durable before returning.
    pub fn append(&mut self, record: &CaseRecord) -> anyhow::Result<()> {
        pruefstand_core::blocking::assert_may_block("the fsync of cases.jsonl");
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
    use crate::tests::record;
    use std::fs::OpenOptions;

    #[test]
    fn a_record_that_is_not_utf8_is_one_damaged_line() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        run.open_cases_for_append().unwrap().append(&record("a", true)).unwrap();
        let mut file = OpenOptions::new().append(true).open(run.path_of(RunFile::Cases)).unwrap();
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
        let mut file = OpenOptions::new().append(true).open(run.path_of(RunFile::Cases)).unwrap();
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
        std::fs::OpenOptions::new()
            .append(true)
            .open(run.path_of(RunFile::Cases))
            .unwrap()
            .write_all(b"garbage\n")
            .unwrap();
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
        let bytes = std::fs::read(run.path_of(RunFile::Cases)).unwrap();
        assert_eq!(digest, format!("{}  cases.jsonl\n", util::sha256_hex(&bytes)));
        let backups = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("cases.jsonl.damaged"))
            .count();
        assert_eq!(backups, 1);
    }

    #[test]
    fn a_tail_reads_whole_lines_from_its_offset_and_starts_over_on_a_shorter_file() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        assert_eq!(run.read_cases_from(0).unwrap().records.len(), 0, "no file: nothing yet");
        run.open_cases_for_append().unwrap().append(&record("a", true)).unwrap();
        let half = serde_json::to_string(&record("b", false)).unwrap();
        let mut file = OpenOptions::new().append(true).open(run.path_of(RunFile::Cases)).unwrap();
        file.write_all(&half.as_bytes()[..10]).unwrap();
        let first = run.read_cases_from(0).unwrap();
        assert_eq!(first.records.iter().map(|r| r.case_id.as_str()).collect::<Vec<_>>(), ["a"]);
        assert!(!first.restarted);
        file.write_all(&half.as_bytes()[10..]).unwrap();
        file.write_all(b"\n").unwrap();
        let next = run.read_cases_from(first.next_offset).unwrap();
        assert_eq!(next.records.iter().map(|r| r.case_id.as_str()).collect::<Vec<_>>(), ["b"], "the half line, whole");
        assert_eq!(next.next_offset, run.cases_len());
        assert_eq!(run.count_cases(), 2);
        assert_eq!(run.case_ids_within(first.next_offset), ["a".to_string()].into());
        let again = run.read_cases_from(run.cases_len() + 100).unwrap();
        assert!(again.restarted && again.records.len() == 2, "a shorter file is read anew");
    }

    #[test]
    fn retain_rewrites_under_the_runs_lock_and_is_refused_while_another_process_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        let mut writer = run.open_cases_for_append().unwrap();
        for (id, utility) in [("a", true), ("b", false), ("c", true)] {
            writer.append(&record(id, utility)).unwrap();
        }
        drop(writer);
        // Free: taken for the rewrite, and released after it.
        assert_eq!(run.retain_cases(|r| r.case_id != "b").unwrap(), 1);
        assert_eq!(run.case_ids_within(u64::MAX), ["a".to_string(), "c".to_string()].into());
        let lock = run.path_of(RunFile::Lock);
        assert!(super::super::RunLock::try_take(&lock).is_ok(), "released after the rewrite");
        // Another process's run: refused, the file as it was.
        let other = super::super::RunLock::try_take_as(&lock, "pid 1 (pruefstand run)").unwrap();
        let before = std::fs::read(run.path_of(RunFile::Cases)).unwrap();
        let err = run.retain_cases(|_| false).unwrap_err().to_string();
        assert!(err.contains("is being written by pid 1 (pruefstand run)"), "{err}");
        assert_eq!(std::fs::read(run.path_of(RunFile::Cases)).unwrap(), before);
        drop(other);
        // This process's own claim: the rewrite goes on under it.
        let claimed = RunDir::claim(&dir.path().join("claimed"), &crate::tests::identity("v")).unwrap();
        let mut writer = claimed.dir.open_cases_for_append().unwrap();
        writer.append(&record("a", true)).unwrap();
        writer.append(&record("c", true)).unwrap();
        drop(writer);
        assert_eq!(claimed.dir.retain_cases(|r| r.case_id == "a").unwrap(), 1);
        assert_eq!(claimed.dir.count_cases(), 1);
    }
}
