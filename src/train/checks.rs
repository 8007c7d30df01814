//! What `pruefstand train` refuses before the trainer starts, every reason at once: a
//! base version the trainer cannot start from, an export its manifest no longer vouches
//! for (sha256), exports of the other format than the kind trained, no rows, an export
//! holding a family the gate's plan holds out (the same guard R1 and `check --plan`
//! apply to `trained_on_exports`: `pruefstand_judge::contamination`), and rows from
//! runs of another base model. The trainer refuses the rest (a row that does not
//! render with the served template, a token the server would not give) before its
//! first step.
//!
//! Reads exports, their manifests and the source runs' `version.json`; starts nothing.

use std::path::{Path, PathBuf};

use anyhow::Context;

use pruefstand_core::plan::Profile;
use pruefstand_core::record::TrainedExport;
use pruefstand_core::spec::{Backend, Version};
use pruefstand_judge::contamination;
use pruefstand_report::export::{Format, Manifest, manifest_path};

/// An export as checked: where it is (absolute), its sha256 and its manifest.
#[derive(Clone, Debug)]
pub(crate) struct Export {
    pub(crate) path: PathBuf,
    pub(crate) sha256: String,
    pub(crate) manifest: Manifest,
}

/// What passed: the exports and the kind trained.
#[derive(Clone, Debug)]
pub(crate) struct Checked {
    pub(crate) exports: Vec<Export>,
    pub(crate) kind: Format,
}

impl Checked {
    pub(crate) fn rows(&self) -> usize {
        self.exports.iter().map(|e| e.manifest.rows).sum()
    }
}

/// Why the training was refused: every reason found, one a line.
#[derive(Debug, thiserror::Error)]
#[error("refused before the first step:\n  {}", .reasons.join("\n  "))]
pub(crate) struct Refused {
    pub(crate) reasons: Vec<String>,
}

/// The base version as a trainer's starting point: a model served from Docker out of a
/// folder of weights, with no adapter of its own (a LoRA is trained on the base
/// weights, and one version serves one adapter).
pub(crate) fn base_usable(base: &Version) -> Result<PathBuf, Refused> {
    let spec = base.path.display();
    let model = &base.spec.model;
    let mut reasons = Vec::new();
    if *model.backend.get_ref() != Backend::Docker {
        reasons.push(format!(
            "{spec}: version {} is not served from Docker (model.backend): the trainer runs in the model's image",
            base.name
        ));
    }
    if model.path.is_none() {
        reasons.push(format!("{spec}: version {} names no model folder (model.path) to train on", base.name));
    }
    if let Some(adapter) = &base.spec.adapter {
        reasons.push(format!(
            "{spec}: version {} serves the adapter {} already: train from the version of its base model",
            base.name, adapter.name
        ));
    }
    match (reasons.is_empty(), &model.path) {
        (true, Some(path)) => Ok(path.clone()),
        _ => Err(Refused { reasons }),
    }
}

/// Checks the exports against the base version and the gate's plan (`plan_name`,
/// `plan`). `kind`: the kind asked for, or none to take the exports' format. Blocking:
/// it reads and hashes the exports.
pub(crate) fn check(
    base: &Version,
    model_path: &Path,
    exports: &[PathBuf],
    kind: Option<Format>,
    plan_name: &str,
    plan: &Profile,
) -> Result<Checked, Refused> {
    pruefstand_core::blocking::assert_may_block("checking exports");
    let mut reasons = Vec::new();
    let mut read = Vec::new();
    for path in exports {
        match read_export(path) {
            Ok(export) => read.push(export),
            Err(why) => reasons.push(why),
        }
    }
    let formats: std::collections::BTreeSet<&str> = read.iter().map(|e| e.manifest.format.as_str()).collect();
    let kind = match kind {
        Some(kind) => {
            for export in read.iter().filter(|e| e.manifest.format != kind) {
                reasons.push(format!(
                    "export {} holds {} rows: --kind {} trains on {} exports",
                    export.path.display(),
                    export.manifest.format.as_str(),
                    kind.as_str(),
                    kind.as_str()
                ));
            }
            kind
        }
        None if formats.len() > 1 => {
            reasons.push(format!(
                "the exports mix formats ({}): give --kind and exports of that format",
                formats.into_iter().collect::<Vec<_>>().join(", ")
            ));
            Format::Dpo
        }
        None => read.first().map_or(Format::Dpo, |e| e.manifest.format),
    };
    let rows: usize = read.iter().map(|e| e.manifest.rows).sum();
    if rows == 0 && !read.is_empty() {
        let names: Vec<String> = read.iter().map(|e| e.path.display().to_string()).collect();
        reasons.push(format!("no rows: the export(s) {} hold none (their manifests say 0 rows)", names.join(", ")));
    }
    reasons.extend(held_out(base, &read, plan_name, plan));
    for export in &read {
        reasons.extend(other_base_model(base, model_path, export));
    }
    if reasons.is_empty() { Ok(Checked { exports: read, kind }) } else { Err(Refused { reasons }) }
}

/// An export and its manifest, or why the manifest does not vouch for it.
fn read_export(path: &Path) -> Result<Export, String> {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let sha256 = pruefstand_core::files::sha256_regular(&path).map_err(|e| format!("export {e:#}"))?;
    let manifest_file = manifest_path(&path);
    let manifest: Manifest = pruefstand_core::files::read_regular(
        &manifest_file,
        pruefstand_core::files::MAX_MANIFEST_BYTES,
        "an export's manifest",
    )
    .and_then(|bytes| serde_json::from_slice(&bytes).context("not an export's manifest"))
    .map_err(|e| {
        format!(
            "export {}: no manifest vouches for it ({}: {e:#}); export it again with `pruefstand export`",
            path.display(),
            manifest_file.display()
        )
    })?;
    if manifest.sha256 != sha256 {
        return Err(format!(
            "export {}: its manifest no longer vouches for it: the file's sha256 is {sha256}, {} says {} (changed \
             since it was exported; export it again)",
            path.display(),
            manifest_file.display(),
            manifest.sha256
        ));
    }
    Ok(Export { path, sha256, manifest })
}

/// The held-out guard, as R1 and `check --plan` apply it to a version trained on these
/// exports: the plan's held-out families less those the version declares `trained_on`.
fn held_out(base: &Version, exports: &[Export], plan_name: &str, plan: &Profile) -> Vec<String> {
    let held_out: Vec<String> = plan.held_out.iter().map(|f| f.get_ref().clone()).collect();
    let trained_on: Vec<String> = base.spec.trained_on.iter().map(|f| f.get_ref().clone()).collect();
    let held_out = contamination::held_out_for(&held_out, &trained_on);
    let trained: Vec<TrainedExport> = exports
        .iter()
        .map(|e| TrainedExport {
            path: e.path.display().to_string(),
            sha256: e.sha256.clone(),
            families: e.manifest.families.iter().filter(|(_, n)| **n > 0).map(|(f, _)| f.clone()).collect(),
            online: false,
        })
        .collect();
    contamination::clashes(&held_out, &trained)
        .iter()
        .map(|clash| {
            format!(
                "plan {plan_name} holds out the family {}, and export {} holds rows of it: a version trained on it \
                 would be judged on a family it saw (train on an export without it, or judge on a plan that does \
                 not hold it out: --plan)",
                clash.family, clash.export
            )
        })
        .collect()
}

/// The source runs of `export` whose version's model is not the base's weights folder.
fn other_base_model(base: &Version, model_path: &Path, export: &Export) -> Vec<String> {
    let ours = same_folder_key(model_path);
    let mut reasons = Vec::new();
    for source in &export.manifest.sources {
        let version = match pruefstand_store::RunDir::new(&source.run_dir).read_version() {
            Ok(Some(version)) => version,
            Ok(None) => {
                reasons.push(format!(
                    "export {}: its source run {} has no version.json: whose model made its rows is unknown",
                    export.path.display(),
                    source.run_dir.display()
                ));
                continue;
            }
            Err(e) => {
                reasons.push(format!(
                    "export {}: source run {}: {e:#}",
                    export.path.display(),
                    source.run_dir.display()
                ));
                continue;
            }
        };
        let model = &version.spec["model"];
        let backend = model["backend"].as_str().unwrap_or("?");
        let theirs = model["path"].as_str().filter(|_| backend == "docker").map(|p| same_folder_key(Path::new(p)));
        if theirs.as_ref() != Some(&ours) {
            let what = match model["path"].as_str() {
                Some(path) if backend == "docker" => format!("the model in {path}"),
                _ => format!("a {backend} model ({})", model["served_name"].as_str().unwrap_or("?")),
            };
            reasons.push(format!(
                "export {}: rows from another base model: its source run {} is of version {}, served by {what}, not \
                 {}'s model in {}",
                export.path.display(),
                source.run,
                version.name,
                base.name,
                model_path.display()
            ));
        }
    }
    reasons
}

/// A folder as compared: its canonical path where it exists (a `current` link and its
/// target are one model), else as written.
fn same_folder_key(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}
