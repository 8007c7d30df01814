//! Loading a stored run for judgement: `run.json`, `cases.jsonl`,
//! `environment_check.json`, thresholds and the reference run — and the one path that
//! judges a run directory and writes its reports, shared by `run` and `judge`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use super::{EnvCheck, JudgeInput, Judgement, ReferenceRun, RunMeta, Thresholds};
use crate::report;
use crate::rundir::RunDir;

/// Loads, judges and writes the reports of one run directory; refreshes the index when
/// a reports folder is given or found. Returns the judgement and its input.
pub fn rejudge(
    run_dir: &Path,
    profile: Option<&Path>,
    reference: Option<&Path>,
    reports_dir: Option<&Path>,
) -> anyhow::Result<(Judgement, JudgeInput)> {
    let input = load_input(run_dir, profile, reference)?;
    let judgement = super::judge(&input);
    report::write_run_report(run_dir, &judgement, &input)?;
    if let Some(reports) = reports_dir.map(Path::to_path_buf).or_else(|| find_reports_dir(run_dir)) {
        report::write_index(&reports).with_context(|| format!("refreshing the index in {}", reports.display()))?;
    }
    Ok((judgement, input))
}

fn find_reports_dir(run_dir: &Path) -> Option<PathBuf> {
    let abs = std::path::absolute(run_dir).ok()?;
    abs.ancestors()
        .skip(1)
        .take(3)
        .find(|d| d.file_name().is_some_and(|n| n == "reports") || d.join("index.html").is_file())
        .map(Path::to_path_buf)
}

/// Everything `judge` needs from a run directory.
pub fn load_input(run_dir: &Path, profile: Option<&Path>, reference: Option<&Path>) -> anyhow::Result<JudgeInput> {
    let meta = read_run_meta(run_dir)?;
    let records = RunDir::new(run_dir).read_cases_strict()?;
    let checks = read_environment_checks(&run_dir.join("environment_check.json"))?;
    let thresholds = match profile {
        Some(p) => read_profile_thresholds(p)?,
        None => read_thresholds_json(&run_dir.join("thresholds.json"))?,
    };
    let reference_dir =
        reference.map(Path::to_path_buf).or_else(|| meta.reference_run_dir.as_ref().map(|r| run_dir.join(r)));
    let reference = match reference_dir {
        Some(dir) => {
            Some(read_reference(&dir).with_context(|| format!("reading the reference run {}", dir.display()))?)
        }
        None => None,
    };
    Ok(JudgeInput { run: meta, environment_checks: checks, records, reference, thresholds })
}

pub fn read_run_meta(run_dir: &Path) -> anyhow::Result<RunMeta> {
    let path = run_dir.join("run.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// `{"checks":[EnvCheck…]}`; a missing file means "not checked" (R1 notes it).
pub fn read_environment_checks(path: &Path) -> anyhow::Result<Vec<EnvCheck>> {
    #[derive(Deserialize)]
    struct File {
        checks: Vec<EnvCheck>,
    }
    match std::fs::read_to_string(path) {
        Ok(text) => {
            Ok(serde_json::from_str::<File>(&text).with_context(|| format!("parsing {}", path.display()))?.checks)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The `[rules]` of a profile file (the whole profile is checked).
pub fn read_profile_thresholds(path: &Path) -> anyhow::Result<Thresholds> {
    Ok(crate::plan::Profile::load(path)?.0.rules)
}

/// `thresholds.json` as `run` writes it (the [`Thresholds`] JSON); missing → defaults.
pub fn read_thresholds_json(path: &Path) -> anyhow::Result<Thresholds> {
    let t: Thresholds = match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!("{} missing: judging with the default thresholds", path.display());
            Thresholds::default()
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    t.validate().with_context(|| format!("in {}", path.display()))?;
    Ok(t)
}

fn read_reference(dir: &Path) -> anyhow::Result<ReferenceRun> {
    let meta = read_run_meta(dir)?;
    Ok(ReferenceRun { run_id: meta.run_id, version: meta.version, records: RunDir::new(dir).read_cases_strict()? })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::Verdict;
    use crate::judge::{JudgeInput, RunMeta};

    /// Writes a run directory from a constructed input, as `run` would.
    fn write_run(dir: &Path, input: &JudgeInput, reference_run_dir: Option<&str>) {
        std::fs::create_dir_all(dir).unwrap();
        let r = &input.run;
        let meta = RunMeta { reference_run_dir: reference_run_dir.map(PathBuf::from), ..r.clone() };
        std::fs::write(dir.join("run.json"), serde_json::to_string_pretty(&meta).unwrap()).unwrap();
        let lines: Vec<String> = input.records.iter().map(|c| serde_json::to_string(c).unwrap()).collect();
        std::fs::write(dir.join("cases.jsonl"), lines.join("\n") + "\n").unwrap();
        std::fs::write(
            dir.join("environment_check.json"),
            serde_json::json!({"checks": input.environment_checks}).to_string(),
        )
        .unwrap();
        std::fs::write(dir.join("thresholds.json"), serde_json::to_string(&input.thresholds).unwrap()).unwrap();
    }

    #[test]
    fn rejudges_a_stored_run_with_reference_and_index() {
        let tmp = tempfile::tempdir().unwrap();
        let reports = tmp.path().join("reports");
        let mut base = crate::judge::tests::schnell(0);
        base.run.run_id = "run-0".into();
        let ref_dir = reports.join("base/schnell/run-0");
        write_run(&ref_dir, &base, None);
        let mut cand = crate::judge::tests::schnell(0);
        cand.run.run_id = "run-1".into();
        for r in cand.records.iter_mut().filter(|r| r.kind != crate::case::CaseKind::InjectionGoal).take(40) {
            r.utility = Some(false);
        }
        let run_dir = reports.join("cand/schnell/run-1");
        write_run(&run_dir, &cand, Some("../../../base/schnell/run-0"));
        let cases_before = std::fs::read(run_dir.join("cases.jsonl")).unwrap();

        let (j, _) = rejudge(&run_dir, None, None, None).unwrap();
        assert_eq!(j.verdict, Verdict::Rejected);
        assert_eq!(j.reference_run_id.as_deref(), Some("run-0"));
        for f in ["judgement.json", "judgement.md", "report.html"] {
            assert!(run_dir.join(f).is_file(), "{f}");
        }
        assert!(reports.join("index.html").is_file(), "found the reports folder by name");
        assert_eq!(std::fs::read(run_dir.join("cases.jsonl")).unwrap(), cases_before);

        // A profile overrides thresholds.json; an explicit reference overrides run.json.
        let profile = tmp.path().join("p.toml");
        std::fs::write(
            &profile,
            "name = \"x\"\nbenchmark_version = \"v1.2.2\"\nattacks = []\nsuites = []\n[rules.R3]\nutility_min = 0.0\nutility_under_attack_min = 0.0\n[rules.R4]\nmargin = 0.9\n",
        )
        .unwrap();
        let (j, input) = rejudge(&run_dir, Some(&profile), Some(&ref_dir), None).unwrap();
        assert_eq!(input.thresholds.r4.margin, 0.9);
        assert_eq!(j.verdict, Verdict::Approved, "{:?}", j.rules);
    }

    #[test]
    fn corrupt_and_missing_inputs_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let input = crate::judge::tests::schnell(0);
        write_run(&dir, &input, None);
        let path = dir.join("cases.jsonl");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"case_id\": truncated\n");
        std::fs::write(&path, text).unwrap();
        let err = format!("{:#}", load_input(&dir, None, None).unwrap_err());
        assert!(err.contains("cases.jsonl:94"), "{err}");

        std::fs::remove_file(&path).unwrap();
        let err = format!("{:#}", load_input(&dir, None, None).unwrap_err());
        assert!(err.contains("cases.jsonl"), "{err}");

        let bad = tmp.path().join("bad.toml");
        std::fs::write(&bad, "[rules.R2]\nasr_maxx = 0.1\n").unwrap();
        let err = format!("{:#}", read_profile_thresholds(&bad).unwrap_err());
        assert!(err.contains("bad.toml") && err.contains("asr_maxx"), "{err}");
    }
}
