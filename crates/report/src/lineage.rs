//! A trained adapter's lineage, read and checked link by link when a run of its version
//! is recorded: adapter → training manifest (`training.json` beside the adapter folder,
//! written by `pruefstand train`) → the exports it names → the runs they were made
//! from. Each link is pinned by a sha256 the link before it recorded; one that no longer
//! matches, or is gone, is named in `Lineage::broken` and R1 fails on it. Not here: what
//! the training wrote (the binary's `train::output`), or judging (`pruefstand_judge`).
//!
//! `training.json` is read through [`ManifestView`], the fields the lineage needs; the
//! binary's test keeps the view readable from what `train` writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::export::SourceRef;
use pruefstand_core::files;
use pruefstand_core::record::{Lineage, LineageExport, LineageSource};
use pruefstand_core::util;
use pruefstand_store::RunDir;

/// The training manifest's name beside the adapter folder.
pub const MANIFEST: &str = "training.json";

/// What the lineage reads of `training.json`.
#[derive(Deserialize)]
pub(crate) struct ManifestView {
    pub version: String,
    pub base_version: String,
    pub kind: String,
    pub steps: usize,
    pub seed: u64,
    pub base_model: BaseModelView,
    pub exports: Vec<ExportView>,
    pub adapter: AdapterView,
}

#[derive(Deserialize)]
pub(crate) struct BaseModelView {
    pub sha256: String,
}

#[derive(Deserialize)]
pub(crate) struct ExportView {
    pub path: PathBuf,
    pub sha256: String,
    pub rows: usize,
    pub families: BTreeMap<String, usize>,
    pub sources: Vec<SourceRef>,
}

#[derive(Deserialize)]
pub(crate) struct AdapterView {
    pub sha256: BTreeMap<String, String>,
}

/// The lineage of the adapter in `adapter_dir`, for a version that names `exports`
/// (its `trained_on_exports`, resolved); None when no training manifest lies beside
/// the adapter (an adapter trained elsewhere has no lineage to check). Blocking.
pub fn lineage(adapter_dir: &Path, exports: &[PathBuf]) -> Option<Lineage> {
    pruefstand_core::blocking::assert_may_block("reading a training's lineage");
    let manifest_path = adapter_dir.parent()?.join(MANIFEST);
    if !manifest_path.exists() {
        return None;
    }
    let mut lineage = Lineage {
        adapter: adapter_dir.display().to_string(),
        manifest: manifest_path.display().to_string(),
        ..Lineage::default()
    };
    let bytes = match files::read_regular(&manifest_path, 16 << 20, "a training manifest") {
        Ok(bytes) => bytes,
        Err(e) => {
            lineage.broken.push(format!("training manifest {}: {e:#}", manifest_path.display()));
            return Some(lineage);
        }
    };
    lineage.manifest_sha256 = util::sha256_hex(&bytes);
    let manifest: ManifestView = match serde_json::from_slice(&bytes) {
        Ok(m) => m,
        Err(e) => {
            lineage.broken.push(format!("training manifest {}: not one of `train`'s: {e}", manifest_path.display()));
            return Some(lineage);
        }
    };
    lineage.version = manifest.version.clone();
    lineage.base_version = manifest.base_version.clone();
    lineage.kind = manifest.kind.clone();
    lineage.steps = manifest.steps;
    lineage.seed = manifest.seed;
    lineage.base_model_sha256 = manifest.base_model.sha256.clone();
    // Link 1: the adapter is the one the training made.
    for (file, pinned) in &manifest.adapter.sha256 {
        let path = adapter_dir.join(file);
        match files::sha256_regular(&path) {
            Ok(now) if now == *pinned => {}
            Ok(now) => lineage.broken.push(format!(
                "adapter file {}: sha256 {}…, the training manifest says {}…",
                path.display(),
                &now[..12],
                short(pinned)
            )),
            Err(_) => lineage.broken.push(format!("adapter file {} is gone", path.display())),
        }
    }
    // Link 2: the exports the training read, as the manifest pinned them, and the
    // version names the same ones.
    let mut families = std::collections::BTreeSet::new();
    for export in &manifest.exports {
        families.extend(export.families.iter().filter(|(_, n)| **n > 0).map(|(f, _)| f.clone()));
        match files::sha256_regular(&export.path) {
            Ok(now) if now == export.sha256 => {}
            Ok(now) => lineage.broken.push(format!(
                "export {}: sha256 {}…, the training manifest says {}…",
                export.path.display(),
                &now[..12],
                short(&export.sha256)
            )),
            Err(_) => lineage.broken.push(format!("export {} is gone", export.path.display())),
        }
        // Link 3: the runs each export was made from.
        for source in &export.sources {
            match RunDir::new(&source.run_dir).run_meta_sha256() {
                Ok(now) if now == source.run_json_sha256 => {}
                Ok(_) => lineage.broken.push(format!(
                    "source run {} of export {}: its run.json changed since the export",
                    source.run_dir.display(),
                    export.path.display()
                )),
                Err(_) => lineage.broken.push(format!(
                    "source run {} of export {} is gone",
                    source.run_dir.display(),
                    export.path.display()
                )),
            }
        }
        lineage.exports.push(LineageExport {
            path: export.path.display().to_string(),
            sha256: export.sha256.clone(),
            rows: export.rows,
            families: export.families.keys().cloned().collect(),
            sources: export
                .sources
                .iter()
                .map(|s| LineageSource {
                    run_dir: s.run_dir.display().to_string(),
                    run_id: s.run.clone(),
                    version: s.version.clone(),
                })
                .collect(),
        });
    }
    let same = |a: &Path, b: &Path| {
        a == b || (a.canonicalize().ok().is_some() && a.canonicalize().ok() == b.canonicalize().ok())
    };
    for named in exports {
        if !manifest.exports.iter().any(|e| same(&e.path, named)) {
            lineage.broken.push(format!(
                "the version names export {}, which its training manifest does not list",
                named.display()
            ));
        }
    }
    lineage.trained_families = families.into_iter().collect();
    Some(lineage)
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_store::RunFile;

    /// A training folder as `train` leaves it: adapter/, training.json naming one export
    /// made from one run.
    fn trained(dir: &Path) -> (PathBuf, PathBuf) {
        let adapter = dir.join("training/abc/adapter");
        std::fs::create_dir_all(&adapter).unwrap();
        std::fs::write(adapter.join("adapter_model.safetensors"), b"weights").unwrap();
        let run = dir.join("reports/base/plan/r1");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(RunDir::new(&run).test_file(RunFile::RunMeta), b"{}").unwrap();
        let export = dir.join("exports/dpo.jsonl");
        std::fs::create_dir_all(export.parent().unwrap()).unwrap();
        std::fs::write(&export, b"{}\n").unwrap();
        let manifest = serde_json::json!({
            "version": "base-dpo", "base_version": "base", "kind": "dpo", "steps": 2, "seed": 0,
            "base_model": {"sha256": "m"},
            "exports": [{"path": export, "sha256": util::sha256_hex(b"{}\n"), "rows": 1,
                "families": {"important_instructions": 1, "roleplay": 0},
                "sources": [{"run_dir": run, "run": "r1", "version": "base", "spec_hash": "s", "plan": "p",
                    "plan_hash": "h", "run_json_sha256": util::sha256_hex(b"{}")}]}],
            "adapter": {"sha256": {"adapter_model.safetensors": util::sha256_hex(b"weights")}},
        });
        std::fs::write(dir.join("training/abc").join(MANIFEST), manifest.to_string()).unwrap();
        (adapter, export)
    }

    #[test]
    fn an_intact_chain_has_no_broken_link_and_each_changed_link_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (adapter, export) = trained(dir.path());
        let intact = lineage(&adapter, std::slice::from_ref(&export)).unwrap();
        assert!(intact.broken.is_empty(), "{:?}", intact.broken);
        assert_eq!(intact.trained_families, vec!["important_instructions".to_string()]);
        assert_eq!(intact.exports[0].sources[0].run_id, "r1");

        std::fs::write(adapter.join("adapter_model.safetensors"), b"other").unwrap();
        let run = RunDir::new(dir.path().join("reports/base/plan/r1"));
        std::fs::write(run.test_file(RunFile::RunMeta), b"{\"x\":1}").unwrap();
        let other = dir.path().join("exports/other.jsonl");
        let broken = lineage(&adapter, &[export, other]).unwrap().broken;
        assert_eq!(broken.len(), 3, "{broken:?}");
        assert!(broken[0].starts_with("adapter file") && broken[0].contains("adapter_model.safetensors"));
        assert!(broken[1].contains("its run.json changed since the export"));
        assert!(broken[2].contains("other.jsonl, which its training manifest does not list"));
        // No manifest beside it: an adapter trained elsewhere has no lineage to check.
        assert!(lineage(&dir.path().join("elsewhere/adapter"), &[]).is_none());
    }
}
