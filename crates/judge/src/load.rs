//! Loading a stored run for judgement: `run.json`, `cases.jsonl` (with each record's
//! line and the file's sha256), `plan.json`, `environment_check.json`, thresholds and
//! the reference run, each through its door of the store. Everything the judge needs
//! to know about the files ends up in the [`JudgeInput`], so judging stays a pure
//! function of it.

use std::path::Path;

use anyhow::Context;

use super::{JudgeInput, ReferenceRun, Thresholds};
use pruefstand_store::{Reading, RunDir, RunFile};

/// Everything `judge` needs from a run directory. `run.json` is read first: a run in a
/// store format newer than this build reads is refused before anything else of it.
pub(crate) fn load_input(
    run: &RunDir,
    profile: Option<&Path>,
    reference: Option<&RunDir>,
) -> anyhow::Result<JudgeInput> {
    let meta = run.read_run_meta()?;
    let cases = run.read_cases(Reading::Strict)?;
    let recorded_cases_sha256 = run.recorded_cases_sha256()?;
    let (plan_cases, plan_adaptive) = run.read_plan()?.map_or((None, None), |plan| (Some(plan.cases), plan.adaptive));
    // A missing environment check means "not checked" (R1 notes it).
    let checks = run.read_environment_checks()?.unwrap_or_default();
    let thresholds = match profile {
        Some(p) => read_profile_thresholds(p)?,
        None => read_thresholds_json(run)?,
    };
    let reading = |dir: &Path| format!("reading the reference run {}", dir.display());
    let reference = match (reference, &meta.reference_run_dir) {
        (Some(reference), _) => Some(read_reference(reference).with_context(|| reading(reference.path()))?),
        // The reference `run.json` names: a path relative to the run directory.
        (None, Some(relative)) => {
            let dir = run.path().join(relative);
            Some(RunDir::open(&dir).and_then(|reference| read_reference(&reference)).with_context(|| reading(&dir))?)
        }
        (None, None) => None,
    };
    Ok(JudgeInput {
        run: meta,
        environment_checks: checks,
        records: cases.records,
        record_lines: cases.lines,
        record_faults: cases.faults,
        plan_cases,
        cases_untrusted: run.cases_untrusted(&cases.sha256, recorded_cases_sha256.as_deref()),
        cases_sha256: Some(cases.sha256),
        recorded_cases_sha256,
        reference,
        thresholds,
        // `adaptive.json`, when the plan ran the adaptive attacker.
        adaptive: run.read_search_log()?,
        plan_adaptive,
    })
}

/// The `[rules]` of a profile file (the whole profile is checked).
pub(crate) fn read_profile_thresholds(path: &Path) -> anyhow::Result<Thresholds> {
    Ok(pruefstand_core::plan::Profile::load(path)?.0.rules)
}

/// `thresholds.json` as `run` writes it (the [`Thresholds`] JSON); missing → defaults.
fn read_thresholds_json(run: &RunDir) -> anyhow::Result<Thresholds> {
    let t = run.read_thresholds()?.unwrap_or_else(|| {
        tracing::warn!("{} missing: judging with the default thresholds", run.shown(RunFile::Thresholds));
        Thresholds::default()
    });
    t.validate().with_context(|| format!("in {}", run.shown(RunFile::Thresholds)))?;
    Ok(t)
}

fn read_reference(dir: &RunDir) -> anyhow::Result<ReferenceRun> {
    let meta = dir.read_run_meta()?;
    let cases = dir.read_cases(Reading::Strict)?;
    // Checked like the candidate's own file: a reference edited after its run would
    // decide R4 for whoever edited it.
    let untrusted = dir.cases_untrusted(&cases.sha256, dir.recorded_cases_sha256()?.as_deref());
    Ok(ReferenceRun {
        run_id: meta.run_id,
        version: meta.version,
        plan_hash: meta.plan_hash,
        benchmark_version: meta.benchmark_version,
        records: cases.records,
        cases_sha256: Some(cases.sha256),
        untrusted,
        dir: Some(dir.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::write_run_dir;
    use pruefstand_core::case::Case;

    #[test]
    fn corrupt_and_missing_inputs_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::new(tmp.path().join("run"));
        let input = crate::tests::schnell(0);
        write_run_dir(dir.path(), &input, None);
        std::fs::remove_file(dir.test_file(RunFile::CasesDigest)).unwrap(); // an older run's
        let path = dir.test_file(RunFile::Cases);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"case_id\": truncated\n");
        std::fs::write(&path, text).unwrap();
        let err = format!("{:#}", load_input(&dir, None, None).unwrap_err());
        assert!(err.contains("cases.jsonl:94"), "{err}");

        std::fs::remove_file(&path).unwrap();
        let err = format!("{:#}", load_input(&dir, None, None).unwrap_err());
        assert!(err.contains(&dir.shown(RunFile::Cases)), "{err}");

        let bad = tmp.path().join("bad.toml");
        std::fs::write(&bad, "[rules.R2]\nasr_maxx = 0.1\n").unwrap();
        let err = format!("{:#}", read_profile_thresholds(&bad).unwrap_err());
        assert!(err.contains("bad.toml") && err.contains("asr_maxx"), "{err}");
    }

    #[test]
    fn lines_faults_digests_and_the_plan_reach_the_judge() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::new(tmp.path().join("run"));
        let input = crate::tests::schnell(0);
        write_run_dir(dir.path(), &input, None);
        std::fs::remove_file(dir.test_file(RunFile::CasesDigest)).unwrap(); // an older run's
        let path = dir.test_file(RunFile::Cases);
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
        let digest = format!("{}  cases.jsonl\n", pruefstand_core::util::sha256_hex(b"other"));
        std::fs::write(dir.test_file(RunFile::CasesDigest), digest).unwrap();
        let cases: Vec<Case> = input.records.iter().map(|r| crate::checks::case_from_id(&r.case_id).unwrap()).collect();
        let plan = serde_json::json!({"hash": "abc", "cases": cases});
        std::fs::write(dir.test_file(RunFile::Plan), plan.to_string()).unwrap();
        let loaded = load_input(&dir, None, None).unwrap();
        assert_eq!(loaded.recorded_cases_sha256, Some(pruefstand_core::util::sha256_hex(b"other")));
        assert_eq!((&loaded.plan_cases, &loaded.plan_adaptive), (&Some(cases), &None));
        assert!(loaded.cases_untrusted.unwrap().contains("changed since its run wrote it"));
    }

    #[test]
    fn a_candidate_whose_digest_was_deleted_is_untrusted_like_a_reference() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::new(tmp.path().join("run"));
        write_run_dir(dir.path(), &crate::tests::schnell(0), None);
        assert_eq!(load_input(&dir, None, None).unwrap().cases_untrusted, None, "as its run left it");
        std::fs::remove_file(dir.test_file(RunFile::CasesDigest)).unwrap();
        let why = load_input(&dir, None, None).unwrap().cases_untrusted.unwrap();
        assert!(why.contains("has no cases.sha256") && why.contains("cannot be checked"), "{why}");
    }

    #[test]
    fn a_reference_whose_records_changed_or_lack_their_digest_is_untrusted() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::new(tmp.path().join("ref"));
        write_run_dir(dir.path(), &crate::tests::schnell(0), None);
        assert_eq!(read_reference(&dir).unwrap().untrusted, None, "as its run left it");
        let path = dir.test_file(RunFile::Cases);
        let text = std::fs::read_to_string(&path).unwrap().replace("\"security\":false", "\"security\":true");
        std::fs::write(&path, text).unwrap();
        let why = read_reference(&dir).unwrap().untrusted.unwrap();
        assert!(why.contains("cases.jsonl changed since its run wrote it"), "{why}");
        std::fs::remove_file(dir.test_file(RunFile::CasesDigest)).unwrap();
        let why = read_reference(&dir).unwrap().untrusted.unwrap();
        assert!(why.contains("has no cases.sha256"), "{why}");
    }

    /// A run directory whose `run.json` names store format 2.0.
    fn newer_store_format(dir: &RunDir) {
        let meta = serde_json::json!({"store_format": {"major": 2, "minor": 0}, "run_id": "r"});
        std::fs::create_dir_all(dir.path()).unwrap();
        std::fs::write(dir.test_file(RunFile::RunMeta), meta.to_string()).unwrap();
    }

    #[test]
    fn a_candidate_or_reference_in_a_newer_store_format_is_refused_before_its_records_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::new(tmp.path());
        newer_store_format(&dir);
        for err in [load_input(&dir, None, None).unwrap_err(), read_reference(&dir).unwrap_err()] {
            assert!(format!("{err:#}").contains("format 2.0, newer than this pruefstand reads"), "{err:#}");
        }
    }
}
