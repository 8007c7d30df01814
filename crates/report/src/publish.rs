//! Publishing a judged run, shared by `run` and `judge` after `judge::judge_dir`: its
//! reports in the run directory and the trend index of the reports folder it lies in.
//! Writes only; the judgement comes in made.

use std::path::{Path, PathBuf};

use super::index::{INDEX_FILE, index_is_ours};
use super::{write_index, write_run_report};
use pruefstand_judge::Judged;
use pruefstand_store::RunDir;

/// Writes the reports of a judged run into its run directory and refreshes the index
/// when a reports folder is given or found.
pub fn write(run: &RunDir, judged: &Judged, reports_dir: Option<&Path>) -> anyhow::Result<()> {
    write_run_report(run, judged)?;
    if let Some(reports) = reports_dir.map(Path::to_path_buf).or_else(|| find_reports_dir(run.path())) {
        // The run's own reports stand; an index that cannot be written is said, not fatal.
        if let Err(err) = write_index(&reports) {
            tracing::warn!("index not refreshed: {err:#}");
        }
    }
    Ok(())
}

/// The nearest of the run directory's three parents that is a reports folder of
/// pruefstand's: named `reports`, or holding an index it wrote — never a folder whose
/// `index.html` is someone else's.
pub(crate) fn find_reports_dir(run_dir: &Path) -> Option<PathBuf> {
    let abs = std::path::absolute(run_dir).ok()?;
    abs.ancestors()
        .skip(1)
        .take(3)
        .find(|d| {
            let named = d.file_name().is_some_and(|n| n == "reports");
            let has_index = d.join(INDEX_FILE).is_file();
            (named || has_index) && index_is_ours(d)
        })
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_core::record::Verdict;
    use pruefstand_judge::tests::write_run_dir;
    use pruefstand_store::RunFile;

    /// What `run` and `judge` do: judge the directory, then publish.
    fn rejudge(
        run: &RunDir,
        profile: Option<&Path>,
        reference: Option<&RunDir>,
    ) -> anyhow::Result<(pruefstand_judge::Judgement, pruefstand_judge::JudgeInput)> {
        let judged = pruefstand_judge::judge_dir(run, profile, reference)?;
        write(run, &judged, None)?;
        Ok((judged.judgement, judged.input))
    }

    #[test]
    fn rejudges_a_stored_run_with_reference_and_index() {
        let tmp = tempfile::tempdir().unwrap();
        let reports = tmp.path().join("reports");
        let mut base = pruefstand_judge::tests::schnell(0);
        base.run.run_id = "run-0".into();
        let ref_dir = reports.join("base/schnell/run-0");
        write_run_dir(&ref_dir, &base, None);
        let mut cand = pruefstand_judge::tests::schnell(0);
        cand.run.run_id = "run-1".into();
        for r in cand.records.iter_mut().filter(|r| r.kind != pruefstand_core::case::CaseKind::InjectionGoal).take(40) {
            r.utility = Some(false);
        }
        let run = RunDir::new(reports.join("cand/schnell/run-1"));
        write_run_dir(run.path(), &cand, Some("../../../base/schnell/run-0"));
        let cases_before = std::fs::read(run.test_file(RunFile::Cases)).unwrap();

        let (j, _) = rejudge(&run, None, None).unwrap();
        assert_eq!(j.verdict, Verdict::Rejected);
        assert_eq!(j.reference_run_id.as_deref(), Some("run-0"));
        for f in [RunFile::Judgement, RunFile::JudgementMarkdown, RunFile::Report] {
            assert!(run.test_file(f).is_file(), "{f:?}");
        }
        assert!(RunDir::is_judged_run(run.path()));
        assert!(reports.join(INDEX_FILE).is_file(), "found the reports folder by name");
        assert_eq!(std::fs::read(run.test_file(RunFile::Cases)).unwrap(), cases_before);

        // A profile overrides thresholds.json; an explicit reference overrides run.json.
        let profile = tmp.path().join("p.toml");
        std::fs::write(
            &profile,
            "name = \"x\"\nbenchmark_version = \"v1.2.2\"\nattacks = []\nsuites = []\n[rules.R3]\nutility_min = 0.0\nutility_under_attack_min = 0.0\n[rules.R4]\nmargin = 0.9\n",
        )
        .unwrap();
        let (j, input) = rejudge(&run, Some(&profile), Some(&RunDir::new(&ref_dir))).unwrap();
        assert_eq!(input.thresholds.r4.margin, 0.9);
        assert_eq!(j.verdict, Verdict::Approved, "{:?}", j.rules);
    }
}
