//! Loading a stored run for judgement: `run.json`, `cases.jsonl` (with each record's
//! line and the file's sha256), `plan.json`, `environment_check.json`, thresholds and
//! the reference run. Everything the judge needs to know about the files ends up in
//! the [`JudgeInput`], so judging stays a pure function of it.

use std::path::Path;

use anyhow::Context;

use super::{JudgeInput, ReferenceRun, RunMeta, Thresholds};
use pruefstand_core::case::Case;
use pruefstand_core::plan::Adaptive;
use pruefstand_core::record::SearchLog;
use pruefstand_store::{CasesFile, Reading, RunDir, RunFile};

/// `cases.jsonl` read strictly ([`RunDir::read_cases`]).
fn read_cases(run_dir: &Path) -> anyhow::Result<CasesFile> {
    RunDir::open(run_dir)?.read_cases(Reading::Strict)
}

/// The sha256 the run recorded when it wrote `cases.jsonl` (`cases.sha256`, in
/// `sha256sum` format); None when the file is missing (a run cut short, an older run).
pub(crate) fn read_recorded_sha256(run_dir: &Path) -> anyhow::Result<Option<String>> {
    RunDir::open(run_dir)?.recorded_cases_sha256()
}

/// Why a run's `cases.jsonl` cannot be taken as the file its run wrote: its sha256
/// differs from the one in `cases.sha256`, or that digest is missing (a run writes it
/// before it is judged, so only a deleted digest or a run from before digests lacks
/// it). None: the file is as its run left it. Candidate and reference are checked
/// alike.
pub(crate) fn untrusted_cases(file: &str, now: &str, recorded: Option<&str>) -> Option<String> {
    match recorded {
        None => Some(format!(
            "{} has no {} beside it: whether it changed since its run wrote it cannot be checked",
            file,
            RunFile::CasesDigest.name()
        )),
        Some(recorded) if recorded != now => Some(format!(
            "{} changed since its run wrote it (its sha256 differs from {})",
            file,
            RunFile::CasesDigest.name()
        )),
        Some(_) => None,
    }
}

/// `plan.json`'s resolved cases and `[adaptive]` section; None when the run directory
/// has no `plan.json`.
pub(crate) fn read_plan_cases(run_dir: &Path) -> anyhow::Result<Option<(Vec<Case>, Option<Adaptive>)>> {
    Ok(RunDir::open(run_dir)?.read_plan()?.map(|plan| (plan.cases, plan.adaptive)))
}

/// Everything `judge` needs from a run directory.
pub(crate) fn load_input(
    run_dir: &Path,
    profile: Option<&Path>,
    reference: Option<&Path>,
) -> anyhow::Result<JudgeInput> {
    let meta = read_run_meta(run_dir)?;
    let cases = read_cases(run_dir)?;
    let recorded_cases_sha256 = read_recorded_sha256(run_dir)?;
    let (plan_cases, plan_adaptive) = read_plan_cases(run_dir)?.map_or((None, None), |(c, a)| (Some(c), a));
    // A missing environment check means "not checked" (R1 notes it).
    let checks = RunDir::open(run_dir)?.read_environment_checks()?.unwrap_or_default();
    let thresholds = match profile {
        Some(p) => read_profile_thresholds(p)?,
        None => read_thresholds_json(run_dir)?,
    };
    let reference_dir =
        reference.map(Path::to_path_buf).or_else(|| meta.reference_run_dir.as_ref().map(|r| run_dir.join(r)));
    let reference = match reference_dir {
        Some(dir) => {
            Some(read_reference(&dir).with_context(|| format!("reading the reference run {}", dir.display()))?)
        }
        None => None,
    };
    Ok(JudgeInput {
        run: meta,
        environment_checks: checks,
        records: cases.records,
        record_lines: cases.lines,
        record_faults: cases.faults,
        plan_cases,
        cases_untrusted: untrusted_cases(
            &RunDir::new(run_dir).shown(RunFile::Cases),
            &cases.sha256,
            recorded_cases_sha256.as_deref(),
        ),
        cases_sha256: Some(cases.sha256),
        recorded_cases_sha256,
        reference,
        thresholds,
        adaptive: read_adaptive(run_dir)?,
        plan_adaptive,
    })
}

/// `adaptive.json`, when the plan ran the adaptive attacker.
fn read_adaptive(run_dir: &Path) -> anyhow::Result<Option<SearchLog>> {
    RunDir::open(run_dir)?.read_search_log()
}

pub fn read_run_meta(run_dir: &Path) -> anyhow::Result<RunMeta> {
    RunDir::new(run_dir).read_run_meta()
}

/// The `[rules]` of a profile file (the whole profile is checked).
pub(crate) fn read_profile_thresholds(path: &Path) -> anyhow::Result<Thresholds> {
    Ok(pruefstand_core::plan::Profile::load(path)?.0.rules)
}

/// `thresholds.json` as `run` writes it (the [`Thresholds`] JSON); missing → defaults.
pub(crate) fn read_thresholds_json(run_dir: &Path) -> anyhow::Result<Thresholds> {
    let run = RunDir::open(run_dir)?;
    let t = run.read_thresholds()?.unwrap_or_else(|| {
        tracing::warn!("{} missing: judging with the default thresholds", run.shown(RunFile::Thresholds));
        Thresholds::default()
    });
    t.validate().with_context(|| format!("in {}", run.shown(RunFile::Thresholds)))?;
    Ok(t)
}

fn read_reference(dir: &Path) -> anyhow::Result<ReferenceRun> {
    let meta = read_run_meta(dir)?;
    let cases = read_cases(dir)?;
    // Checked like the candidate's own file: a reference edited after its run would
    // decide R4 for whoever edited it.
    let untrusted =
        untrusted_cases(&RunDir::new(dir).shown(RunFile::Cases), &cases.sha256, read_recorded_sha256(dir)?.as_deref());
    Ok(ReferenceRun {
        run_id: meta.run_id,
        version: meta.version,
        plan_hash: meta.plan_hash,
        benchmark_version: meta.benchmark_version,
        records: cases.records,
        cases_sha256: Some(cases.sha256),
        untrusted,
        dir: Some(dir.to_path_buf()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::write_run_dir;

    #[test]
    fn corrupt_and_missing_inputs_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let input = crate::tests::schnell(0);
        write_run_dir(&dir, &input, None);
        std::fs::remove_file(dir.join(RunFile::CasesDigest.name())).unwrap(); // an older run's
        let path = dir.join(RunFile::Cases.name());
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"case_id\": truncated\n");
        std::fs::write(&path, text).unwrap();
        let err = format!("{:#}", load_input(&dir, None, None).unwrap_err());
        assert!(err.contains("cases.jsonl:94"), "{err}");

        std::fs::remove_file(&path).unwrap();
        let err = format!("{:#}", load_input(&dir, None, None).unwrap_err());
        assert!(err.contains(RunFile::Cases.name()), "{err}");

        let bad = tmp.path().join("bad.toml");
        std::fs::write(&bad, "[rules.R2]\nasr_maxx = 0.1\n").unwrap();
        let err = format!("{:#}", read_profile_thresholds(&bad).unwrap_err());
        assert!(err.contains("bad.toml") && err.contains("asr_maxx"), "{err}");
    }

    #[test]
    fn lines_faults_digests_and_the_plan_reach_the_judge() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let input = crate::tests::schnell(0);
        write_run_dir(&dir, &input, None);
        std::fs::remove_file(dir.join(RunFile::CasesDigest.name())).unwrap(); // an older run's
        let path = dir.join(RunFile::Cases.name());
        // A blank line first (line numbers count it), and one security that is not a bool.
        let text = std::fs::read_to_string(&path).unwrap();
        let edited = String::from("\n") + &text.replacen("\"security\":false", "\"security\":\"no\"", 1);
        std::fs::write(&path, &edited).unwrap();
        let loaded = load_input(&dir, None, None).unwrap();
        assert_eq!(loaded.record_lines[0], 2);
        assert_eq!(loaded.records.len(), input.records.len());
        let (line, what) = &loaded.record_faults[0];
        assert_eq!(what, "security is \"no\", not true, false or null");
        assert_eq!(edited.lines().nth(line - 1).map(|l| l.contains("\"no\"")), Some(true));
        assert_eq!(loaded.cases_sha256.as_deref(), Some(pruefstand_core::util::sha256_hex(edited.as_bytes()).as_str()));
        assert_eq!((loaded.recorded_cases_sha256.as_deref(), loaded.plan_cases.as_ref()), (None, None));
        let j = crate::judge(&loaded);
        assert!(
            j.rules[0].reason.contains(&format!("first: cases.jsonl:{line}: security is")),
            "{}",
            j.rules[0].reason
        );

        // cases.sha256 as the run writes it, and plan.json's cases.
        let digest = format!("{}  {}\n", pruefstand_core::util::sha256_hex(b"other"), RunFile::Cases.name());
        std::fs::write(dir.join(RunFile::CasesDigest.name()), digest).unwrap();
        let cases: Vec<Case> =
            input.records.iter().map(|r| super::super::checks::case_from_id(&r.case_id).unwrap()).collect();
        let plan = serde_json::json!({"hash": "abc", "cases": cases});
        std::fs::write(dir.join(RunFile::Plan.name()), plan.to_string()).unwrap();
        let loaded = load_input(&dir, None, None).unwrap();
        assert_eq!(loaded.recorded_cases_sha256, Some(pruefstand_core::util::sha256_hex(b"other")));
        assert_eq!((&loaded.plan_cases, &loaded.plan_adaptive), (&Some(cases), &None));
        assert!(loaded.cases_untrusted.unwrap().contains("changed since its run wrote it"));
    }

    #[test]
    fn a_candidate_whose_digest_was_deleted_is_untrusted_like_a_reference() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        write_run_dir(&dir, &crate::tests::schnell(0), None);
        assert_eq!(load_input(&dir, None, None).unwrap().cases_untrusted, None, "as its run left it");
        std::fs::remove_file(dir.join(RunFile::CasesDigest.name())).unwrap();
        let why = load_input(&dir, None, None).unwrap().cases_untrusted.unwrap();
        assert!(why.contains("has no cases.sha256") && why.contains("cannot be checked"), "{why}");
    }

    #[test]
    fn a_reference_whose_records_changed_or_lack_their_digest_is_untrusted() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ref");
        write_run_dir(&dir, &crate::tests::schnell(0), None);
        assert_eq!(read_reference(&dir).unwrap().untrusted, None, "as its run left it");
        let path = dir.join(RunFile::Cases.name());
        let text = std::fs::read_to_string(&path).unwrap().replace("\"security\":false", "\"security\":true");
        std::fs::write(&path, text).unwrap();
        let why = read_reference(&dir).unwrap().untrusted.unwrap();
        assert!(why.contains("cases.jsonl changed since its run wrote it"), "{why}");
        std::fs::remove_file(dir.join(RunFile::CasesDigest.name())).unwrap();
        let why = read_reference(&dir).unwrap().untrusted.unwrap();
        assert!(why.contains("has no cases.sha256"), "{why}");
    }

    /// A run directory whose `run.json` names store format 2.0.
    fn newer_store_format(dir: &std::path::Path) {
        let meta = serde_json::json!({"store_format": {"major": 2, "minor": 0}, "run_id": "r"});
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(pruefstand_store::RunFile::RunMeta.name()), meta.to_string()).unwrap();
    }

    #[test]
    fn a_candidate_or_reference_in_a_newer_store_format_is_refused_before_its_records_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        newer_store_format(tmp.path());
        for err in [load_input(tmp.path(), None, None).unwrap_err(), read_reference(tmp.path()).unwrap_err()] {
            assert!(format!("{err:#}").contains("format 2.0, newer than this pruefstand reads"), "{err:#}");
        }
    }
}
