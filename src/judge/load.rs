//! Loading a stored run for judgement: `run.json`, `cases.jsonl`,
//! `environment_check.json`, thresholds and the reference run.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

use super::{EnvCheck, JudgeInput, ReferenceRun, RunMeta, Thresholds};
use crate::rundir::RunDir;

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
    use crate::judge::tests::write_run_dir;

    #[test]
    fn corrupt_and_missing_inputs_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let input = crate::judge::tests::schnell(0);
        write_run_dir(&dir, &input, None);
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
