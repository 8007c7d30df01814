//! The run store's format: `run.json` names it first, and a run in a format newer than
//! this build reads is refused on every open ([`RunDir::open`]) before anything else of
//! it is read.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::{RunDir, RunFile};
use pruefstand_core::record::{RunMeta, StoreFormat};

impl RunDir {
    /// Opens a run directory for reading: a run in a store format newer than this build
    /// reads is refused here, before any of its files is read. One without `run.json`
    /// (a run still going, or cut short before its end) opens; what it lacks is said by
    /// the reader that needs it.
    pub fn open(path: impl Into<PathBuf>) -> anyhow::Result<RunDir> {
        let dir = RunDir::new(path);
        let run_json = dir.path_of(RunFile::RunMeta);
        match std::fs::read(&run_json) {
            Ok(bytes) => {
                check_store_format(&dir.path, &bytes)?;
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(err).with_context(|| format!("reading {}", run_json.display())),
        }
        Ok(dir)
    }

    /// `run.json`: the run's facts, after the store format they are written in.
    pub fn write_run_meta(&self, meta: &RunMeta) -> anyhow::Result<()> {
        #[derive(Serialize)]
        struct Versioned<'a> {
            store_format: StoreFormat,
            #[serde(flatten)]
            meta: &'a RunMeta,
        }
        self.write_json(RunFile::RunMeta, &Versioned { store_format: StoreFormat::CURRENT, meta })
    }

    /// `run.json`, which every run that was judged has: missing is an error, and so is
    /// a run in a store format newer than this build reads (its `store_format` is read
    /// first, so the refusal names the versions rather than a field it misread).
    pub fn read_run_meta(&self) -> anyhow::Result<RunMeta> {
        Ok(self.read_run_meta_hashed()?.0)
    }

    /// `run.json` when the run has written it (None: a run still going, or cut short
    /// before its end); otherwise as [`RunDir::read_run_meta`].
    pub fn read_run_meta_if_written(&self) -> anyhow::Result<Option<RunMeta>> {
        if !self.path_of(RunFile::RunMeta).exists() {
            return Ok(None);
        }
        self.read_run_meta().map(Some)
    }

    /// The sha256 of `run.json` as it lies there now, read as a regular file (never
    /// through a link) and not parsed: an adapter's lineage checks that an export's
    /// source run still has the `run.json` the export took.
    pub fn run_meta_sha256(&self) -> anyhow::Result<String> {
        pruefstand_core::files::sha256_regular(&self.path_of(RunFile::RunMeta))
    }

    /// [`RunDir::read_run_meta`], with the sha256 of the bytes it was read from (an
    /// export names the `run.json` it took).
    pub fn read_run_meta_hashed(&self) -> anyhow::Result<(RunMeta, String)> {
        let path = self.path_of(RunFile::RunMeta);
        let bytes = match std::fs::read(&path) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => bail!("reading {}: no such file", path.display()),
            other => other.with_context(|| format!("reading {}", path.display()))?,
        };
        check_store_format(&self.path, &bytes)?;
        let meta = serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))?;
        Ok((meta, pruefstand_core::util::sha256_hex(&bytes)))
    }
}

/// Refuses a `run.json` whose `store_format` is newer than this build reads, naming
/// the run directory and both formats; one without the field is from before versioning.
fn check_store_format(run_dir: &Path, run_json: &[u8]) -> anyhow::Result<StoreFormat> {
    #[derive(Deserialize)]
    struct FormatOnly {
        #[serde(default)]
        store_format: Option<StoreFormat>,
    }
    let named: FormatOnly = serde_json::from_slice(run_json)
        .with_context(|| format!("parsing {}", RunFile::RunMeta.path_in(run_dir).display()))?;
    let format = named.store_format.unwrap_or(StoreFormat::BEFORE_VERSIONING);
    if !format.readable() {
        bail!(
            "{} is in the run store's format {format}, newer than this pruefstand reads ({}): read it with a \
             newer pruefstand",
            run_dir.display(),
            StoreFormat::CURRENT
        );
    }
    Ok(format)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_core::util;

    /// The format `run.json` names, after it was read whole.
    fn format_of(run: &RunDir) -> StoreFormat {
        run.read_run_meta().unwrap();
        check_store_format(&run.path, &std::fs::read(run.path_of(RunFile::RunMeta)).unwrap()).unwrap()
    }

    #[test]
    fn run_json_names_its_store_format_first_and_a_newer_major_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        run.write_run_meta(&RunMeta { run_id: "r".into(), ..RunMeta::default() }).unwrap();
        let text = std::fs::read_to_string(run.path_of(RunFile::RunMeta)).unwrap();
        assert!(text.starts_with("{\n  \"store_format\": {\n    \"major\": 1,\n    \"minor\": 0\n  },"), "{text}");
        assert_eq!(format_of(&run), StoreFormat::CURRENT);

        let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
        value["store_format"]["minor"] = 7.into();
        util::write_json_atomic(&run.path_of(RunFile::RunMeta), &value).unwrap();
        assert_eq!(format_of(&run), StoreFormat { major: 1, minor: 7 }, "a newer minor is read");

        // A newer major may have changed any field: refused before the rest is parsed.
        value["store_format"]["major"] = 2.into();
        value["planned_case_ids"] = "no longer a list".into();
        util::write_json_atomic(&run.path_of(RunFile::RunMeta), &value).unwrap();
        let err = format!("{:#}", run.read_run_meta().unwrap_err());
        assert!(
            err.contains(&dir.path().display().to_string())
                && err.contains("format 2.7, newer than this pruefstand reads (1.0)"),
            "{err}"
        );

        value.as_object_mut().unwrap().remove("store_format");
        value["planned_case_ids"] = serde_json::json!([]);
        util::write_json_atomic(&run.path_of(RunFile::RunMeta), &value).unwrap();
        assert_eq!(format_of(&run), StoreFormat::BEFORE_VERSIONING, "a run from before versioning is read");
    }

    #[test]
    fn a_run_in_a_newer_store_format_is_refused_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        assert!(RunDir::open(dir.path()).is_ok(), "a run without run.json yet opens");
        run.write_run_meta(&RunMeta { run_id: "r".into(), ..RunMeta::default() }).unwrap();
        assert!(RunDir::open(dir.path()).is_ok());
        let mut value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.path_of(RunFile::RunMeta)).unwrap()).unwrap();
        value["store_format"]["major"] = 2.into();
        util::write_json_atomic(&run.path_of(RunFile::RunMeta), &value).unwrap();
        let refused = |err: anyhow::Error| {
            let err = format!("{err:#}");
            assert!(err.contains("newer than this pruefstand reads"), "{err}");
        };
        refused(RunDir::open(dir.path()).unwrap_err());
        refused(run.read_run_meta().unwrap_err());
        // (The judge's and the export's refusals, which open the run so, are tested
        // with them.)
    }
}
