//! What a finished training leaves: the adapter moved into place beside its training
//! manifest (`training.json`: the exports with their sha256 and sources, the rows used,
//! the hyperparameters and seed, the base model's hash, the image, the loss per step,
//! the time), and the new version's spec (`versions/<new>.toml`): the base version's
//! spec with `[adapter]` naming the adapter and the exports it was trained on, and the
//! base version as its reference. Each written atomically, the spec last, so no spec
//! ever names an adapter that is not there.
//!
//! Overwrites only its own: a spec file that is there and was not written by `train`
//! for the same adapter is an error naming it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::checks::Export;
use super::request::{Hyper, TrainingDir};
use pruefstand_core::spec::{ServedFileKind, Version};
use pruefstand_core::util;
use pruefstand_report::export::{Format, SourceRef};

/// The first words of every spec `train` writes: what may be replaced by it.
pub(super) const SPEC_MARK: &str = "# Written by `pruefstand train`";

/// `training.json`, beside the adapter.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct TrainingManifest {
    /// The version the adapter became.
    pub(crate) version: String,
    pub(crate) base_version: String,
    pub(crate) base_spec_hash: String,
    /// The training's id (its folder's name): a hash of what was asked.
    pub(crate) training: String,
    pub(crate) kind: Format,
    pub(crate) exports: Vec<ExportRef>,
    /// The rows the exports hold, and those the trainer used.
    pub(crate) rows: usize,
    pub(crate) rows_used: u64,
    pub(crate) hyperparameters: Hyper,
    pub(crate) seed: u64,
    pub(crate) base_model: BaseModel,
    pub(crate) image: ImageRef,
    /// sha256 over the trainer's files as this binary embeds them.
    pub(crate) trainer_sha256: String,
    /// The steps trained, and the loss after each, from step 1.
    pub(crate) steps: usize,
    /// Null where the loss was not finite.
    pub(crate) losses: Vec<Option<f64>>,
    /// Each step's seconds as the trainer measured them (a step run again after a
    /// restart counts once, its last time).
    pub(crate) step_seconds: Vec<f64>,
    /// The trainer's starts (more than one: it was resumed from a checkpoint).
    pub(crate) attempts: usize,
    /// The last attempt's wall time, container start to exit.
    pub(crate) wall_s: f64,
    pub(crate) adapter: AdapterRef,
    pub(crate) finished_at: String,
    pub(crate) written_by: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct ExportRef {
    pub(crate) path: PathBuf,
    pub(crate) sha256: String,
    pub(crate) format: Format,
    pub(crate) rows: usize,
    pub(crate) families: BTreeMap<String, usize>,
    pub(crate) sources: Vec<SourceRef>,
}

impl ExportRef {
    pub(crate) fn of(export: &Export) -> ExportRef {
        ExportRef {
            path: export.path.clone(),
            sha256: export.sha256.clone(),
            format: export.manifest.format,
            rows: export.manifest.rows,
            families: export.manifest.families.clone(),
            sources: export.manifest.sources.clone(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct BaseModel {
    pub(crate) path: PathBuf,
    /// sha256 over the weights files' names and sha256s (`files`), one `name sha256` a
    /// line, sorted by name.
    pub(crate) sha256: String,
    pub(crate) files: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct ImageRef {
    pub(crate) name: String,
    pub(crate) id: String,
    /// A registry digest, else the content id.
    pub(crate) digest: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct AdapterRef {
    pub(crate) path: PathBuf,
    /// Each file's sha256, as the trainer reported and as read back here.
    pub(crate) sha256: BTreeMap<String, String>,
}

/// The files of a model folder that hold its weights.
fn is_weights(name: &str) -> bool {
    [".safetensors", ".bin", ".pt", ".pth", ".gguf"].iter().any(|ext| name.ends_with(ext))
}

/// The base model's hash: its weights files, each read as a stream. Blocking.
pub(super) fn base_model(path: &Path) -> anyhow::Result<BaseModel> {
    pruefstand_core::blocking::assert_may_block("hashing the model's weights");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(path).with_context(|| format!("reading the model folder {}", path.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_weights(&name) && entry.file_type()?.is_file() {
            files.insert(name, pruefstand_core::files::sha256_regular(&entry.path())?);
        }
    }
    if files.is_empty() {
        bail!("the model folder {} holds no weights file (*.safetensors, *.bin, …)", path.display());
    }
    let listing: String = files.iter().map(|(name, sha)| format!("{name} {sha}\n")).collect();
    Ok(BaseModel { path: path.to_path_buf(), sha256: util::sha256_hex(listing.as_bytes()), files })
}

/// The step times of every attempt, from `trainer-events.jsonl` (the last time a step was
/// reported wins), and how many times the trainer started.
pub(super) fn steps_from_events(events: &Path) -> (Vec<f64>, usize) {
    let text = std::fs::read_to_string(events).unwrap_or_default();
    let mut seconds: BTreeMap<u64, f64> = BTreeMap::new();
    let mut starts = 0;
    for line in text.lines() {
        match serde_json::from_str::<super::trainer::Event>(line) {
            Ok(super::trainer::Event::Step { step, seconds: Some(s), .. }) => {
                seconds.insert(step, s);
            }
            Ok(super::trainer::Event::Start { .. }) => starts += 1,
            _ => {}
        }
    }
    (seconds.into_values().collect(), starts)
}

/// Moves the trainer's adapter (`out/adapter`) into place (`adapter/`) after checking
/// its files against the sha256s the trainer reported. An adapter already in place
/// with the same files (a restart after the move) is kept. Blocking.
pub(super) fn install_adapter(dir: &TrainingDir, reported: &BTreeMap<String, String>) -> anyhow::Result<AdapterRef> {
    let staged = dir.out().join("adapter");
    let target = dir.adapter();
    let matches = |folder: &Path| -> anyhow::Result<bool> {
        for (name, sha) in reported {
            let file = folder.join(name);
            if pruefstand_core::files::sha256_regular(&file)? != *sha {
                return Ok(false);
            }
        }
        Ok(!reported.is_empty())
    };
    if target.is_dir() && matches(&target).unwrap_or(false) {
        return Ok(AdapterRef { path: target, sha256: reported.clone() });
    }
    if !matches(&staged).with_context(|| format!("the trainer's adapter in {}", staged.display()))? {
        bail!(
            "the trainer's adapter in {} does not hold the files it reported (sha256 {:?})",
            staged.display(),
            reported
        );
    }
    if target.exists() {
        bail!("{} exists and is not this training's adapter: left as it is", target.display());
    }
    std::fs::rename(&staged, &target)
        .with_context(|| format!("moving {} to {}", staged.display(), target.display()))?;
    sync_folder(&dir.path)?;
    Ok(AdapterRef { path: target, sha256: reported.clone() })
}

fn sync_folder(path: &Path) -> anyhow::Result<()> {
    std::fs::File::open(path).and_then(|f| f.sync_all()).with_context(|| format!("syncing {}", path.display()))
}

/// The finished adapter of an earlier run of the same training: its manifest, when the
/// adapter in place still has the files it names.
pub(crate) fn finished(dir: &TrainingDir) -> Option<TrainingManifest> {
    let manifest: TrainingManifest = serde_json::from_slice(&std::fs::read(dir.manifest()).ok()?).ok()?;
    let intact =
        manifest.adapter.sha256.iter().all(|(name, sha)| {
            pruefstand_core::files::sha256_regular(&dir.adapter().join(name)).is_ok_and(|s| s == *sha)
        });
    intact.then_some(manifest)
}

/// The new version's spec: the base's, with its reference the base, `[adapter]` the
/// trained one (served under the new version's name, `trained_on_exports` the exports
/// by absolute path), vLLM's LoRA rank limit raised to the adapter's rank where the
/// base's args set none, and the served files by absolute path (the base's spec may
/// lie in another folder). Written atomically; then loaded, as a run would.
pub(super) fn write_spec(
    versions: &Path,
    base: &Version,
    name: &str,
    manifest: &TrainingManifest,
    manifest_path: &Path,
) -> anyhow::Result<PathBuf> {
    let description = format!(
        "{} + a {} LoRA (r {}) trained {} step(s) on {} row(s) by `pruefstand train`",
        base.name,
        manifest.kind.as_str(),
        manifest.hyperparameters.lora_r,
        manifest.hyperparameters.steps,
        manifest.rows_used
    );
    let exports = manifest.exports.iter().map(|e| e.path.display().to_string()).collect();
    let spec = NewSpec {
        description,
        lora_r: manifest.hyperparameters.lora_r,
        adapter: &manifest.adapter.path,
        trained_on: ("trained_on_exports", exports),
        training: &manifest.training,
        how: "",
        manifest_path,
    };
    write_spec_of(versions, base, name, spec)
}

/// What a trained version's spec says beyond its base's ([`write_spec_of`]).
pub(super) struct NewSpec<'a> {
    pub(super) description: String,
    /// The adapter's rank: vLLM's `--max-lora-rank` where the base sets none.
    pub(super) lora_r: u32,
    pub(super) adapter: &'a Path,
    /// `[adapter]`'s record of what it trained on, which the held-out guard reads: its
    /// key (`trained_on_exports`, `trained_online`) and the files, absolute.
    pub(super) trained_on: (&'static str, Vec<String>),
    /// The training's id, in the spec's first line (the mark a rewrite is allowed by).
    pub(super) training: &'a str,
    /// After "from version B" in that line: "" or ", online".
    pub(super) how: &'static str,
    pub(super) manifest_path: &'a Path,
}

/// Writes `versions/<name>.toml` from the base's spec (see [`write_spec`]), unless a
/// spec of that name exists that another training (or a person) wrote.
pub(super) fn write_spec_of(versions: &Path, base: &Version, name: &str, new: NewSpec) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(&base.path).with_context(|| format!("reading {}", base.path.display()))?;
    let mut spec: toml::Table = toml::from_str(&text).with_context(|| format!("reading {}", base.path.display()))?;
    spec.insert("reference".into(), base.name.clone().into());
    spec.insert("description".into(), new.description.into());
    let model = spec.get_mut("model").and_then(toml::Value::as_table_mut).context("the base spec has no [model]")?;
    for kind in ServedFileKind::ALL {
        if let Some(file) = base.served_file(kind) {
            let file = std::path::absolute(&file).unwrap_or(file);
            model.insert(kind.field().into(), file.display().to_string().into());
        }
    }
    let args = model.entry("args").or_insert_with(|| toml::Value::Array(Vec::new()));
    if let Some(args) = args.as_array_mut()
        && !args.iter().any(|a| a.as_str().is_some_and(|a| a == "--max-lora-rank" || a.starts_with("--max-lora-rank=")))
    {
        args.push("--max-lora-rank".into());
        args.push(new.lora_r.to_string().into());
    }
    let mut adapter = toml::Table::new();
    adapter.insert("name".into(), name.into());
    adapter.insert("path".into(), new.adapter.display().to_string().into());
    let (key, files) = new.trained_on;
    adapter.insert(key.into(), toml::Value::Array(files.into_iter().map(Into::into).collect()));
    spec.insert("adapter".into(), adapter.into());
    let body = toml::to_string(&spec).context("writing the new spec")?;
    let mark = format!("{SPEC_MARK} (training {})", new.training);
    let text = format!(
        "{mark} from version {}{}.\n# Its training manifest: {}\n\n{body}",
        base.name,
        new.how,
        new.manifest_path.display()
    );
    let path = versions.join(format!("{name}.toml"));
    match std::fs::read_to_string(&path) {
        Ok(old) if old == text || old.starts_with(&mark) => {}
        Ok(_) => bail!(
            "{} exists and was not written by `pruefstand train` for this adapter: left as it is (choose another \
             --name)",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    util::write_atomic(&path, text.as_bytes())?;
    Version::load(versions, name).with_context(|| format!("the spec written to {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_run_again_after_a_restart_count_once() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("trainer-events.jsonl");
        let lines = [
            r#"{"event":"start","steps":3,"resumed_from":0}"#,
            r#"{"event":"step","step":1,"steps":3,"loss":0.69,"seconds":20.0}"#,
            r#"{"event":"step","step":2,"steps":3,"loss":0.6,"seconds":21.0}"#,
            "not an event",
            r#"{"event":"start","steps":3,"resumed_from":1}"#,
            r#"{"event":"step","step":2,"steps":3,"loss":0.6,"seconds":23.0}"#,
            r#"{"event":"step","step":3,"steps":3,"loss":0.5,"seconds":22.0}"#,
        ];
        std::fs::write(&events, lines.join("\n")).unwrap();
        assert_eq!(steps_from_events(&events), (vec![20.0, 23.0, 22.0], 2));
    }

    #[test]
    fn the_base_models_hash_covers_its_weights_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.safetensors"), b"weights").unwrap();
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        let a = base_model(dir.path()).unwrap();
        assert_eq!(a.files.keys().collect::<Vec<_>>(), ["model.safetensors"]);
        std::fs::write(dir.path().join("config.json"), b"{\"x\": 1}").unwrap();
        assert_eq!(base_model(dir.path()).unwrap().sha256, a.sha256);
        std::fs::write(dir.path().join("model.safetensors"), b"other weights").unwrap();
        assert_ne!(base_model(dir.path()).unwrap().sha256, a.sha256);
        std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
        assert!(base_model(dir.path()).unwrap_err().to_string().contains("no weights file"));
    }
}
