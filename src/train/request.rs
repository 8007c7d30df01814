//! What a training is asked, and where its files lie: the hyperparameters, the
//! `request.json` the trainer reads (scripts/pruefstand_train, its contract in
//! docs/training.md), and the training's durable folder under the bench root.
//!
//! Plain data and paths; deciding whether to train is `checks`', running the trainer
//! `trainer`'s.

use std::path::{Path, PathBuf};

use serde::Serialize;

use pruefstand_report::export::Format;

/// Where the trainer's container sees its files. The model folder is mounted where the
/// model server sees it (`container::Setup`), and so is a spec's chat template.
pub(super) const REQUEST: &str = "/work/request.json";
const EXPORTS: &str = "/work/exports";
pub(super) const OUT: &str = "/work/out";
pub(super) const CHECKPOINTS: &str = "/work/checkpoints";
/// The trainer's package (`pruefstand_train`) is mounted under this folder, which is
/// the container's `PYTHONPATH`.
pub(super) const CODE: &str = "/opt/pruefstand-train";
/// The model folder inside the container (as the model server mounts it).
pub(super) const MODEL: &str = "/model";

/// The trainer's event lines in a training's folder ([`TrainingDir::events`]).
pub(crate) const EVENTS: &str = "trainer-events.jsonl";

/// The training manifest in a training's folder ([`TrainingDir::manifest`]).
pub(crate) const MANIFEST: &str = "training.json";

/// The trainer's knobs, as `request.json` names them.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub(crate) struct Hyper {
    pub(crate) steps: u32,
    pub(crate) learning_rate: f64,
    pub(crate) lora_r: u32,
    pub(crate) lora_alpha: u32,
    pub(crate) max_length: u32,
    pub(crate) beta: f64,
    pub(crate) batch_size: u32,
}

/// `request.json`, field for field the contract's; every path as the container sees
/// it.
#[derive(Clone, Debug, Serialize)]
pub(super) struct TrainerRequest {
    pub(crate) kind: Format,
    pub(crate) base_model: String,
    pub(crate) base_model_name: String,
    pub(crate) chat_template: Option<String>,
    pub(crate) rows: Vec<String>,
    pub(crate) tokenize_url: Option<String>,
    pub(crate) served_model: String,
    pub(crate) out: String,
    pub(crate) checkpoints: String,
    pub(crate) seed: u64,
    #[serde(flatten)]
    pub(crate) hyper: Hyper,
}

/// The export at `index` inside the container.
pub(super) fn export_in_container(index: usize) -> String {
    format!("{EXPORTS}/{index}.jsonl")
}

/// A training's folder, `reports/<new version>/training/<id>/`: durable, so a killed
/// training started again with the same command finds its checkpoints. The id is a
/// hash of what was asked (base spec, exports, kind, hyperparameters, seed).
#[derive(Clone, Debug)]
pub(crate) struct TrainingDir {
    pub(crate) path: PathBuf,
    /// The version the adapter becomes.
    pub(crate) version: String,
    pub(crate) id: String,
}

impl TrainingDir {
    pub(crate) fn new(reports: &Path, version: &str, id: &str) -> TrainingDir {
        TrainingDir {
            path: reports.join(version).join("training").join(id),
            version: version.to_string(),
            id: id.to_string(),
        }
    }
    /// The request the trainer reads (mounted read-only).
    pub(crate) fn request(&self) -> PathBuf {
        self.path.join("request.json")
    }
    /// TRL's checkpoints, one a step: what a restart resumes from.
    pub(super) fn checkpoints(&self) -> PathBuf {
        self.path.join("checkpoints")
    }
    /// Where the trainer writes the adapter (`out/adapter`, renamed into place by it).
    pub(crate) fn out(&self) -> PathBuf {
        self.path.join("out")
    }
    /// The finished adapter, beside the manifest: what the new version serves.
    pub(crate) fn adapter(&self) -> PathBuf {
        self.path.join("adapter")
    }
    /// The training manifest.
    pub(crate) fn manifest(&self) -> PathBuf {
        self.path.join(MANIFEST)
    }
    /// Every event line the trainer printed, across attempts.
    pub(crate) fn events(&self) -> PathBuf {
        self.path.join(EVENTS)
    }
    /// The trainer's stderr, across attempts.
    pub(crate) fn log(&self) -> PathBuf {
        self.path.join("trainer.log")
    }
    /// The trainer's package as this binary embeds it, written out for the mount.
    pub(crate) fn code(&self) -> PathBuf {
        self.path.join("trainer")
    }
}

/// The training's id: the first 16 hex digits of a hash over what was asked. The same
/// command gives the same id, and so finds its checkpoints again.
pub(super) fn training_id(base_spec_hash: &str, kind: Format, exports: &[String], hyper: &Hyper, seed: u64) -> String {
    let asked = serde_json::json!({
        "base": base_spec_hash, "kind": kind, "exports": exports, "hyper": hyper, "seed": seed,
    });
    pruefstand_core::util::sha256_hex(asked.to_string().as_bytes())[..16].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hyper() -> Hyper {
        Hyper { steps: 2, learning_rate: 5e-5, lora_r: 8, lora_alpha: 16, max_length: 256, beta: 0.1, batch_size: 1 }
    }

    #[test]
    fn the_request_has_the_contracts_fields_flat() {
        let request = TrainerRequest {
            kind: Format::Dpo,
            base_model: MODEL.into(),
            base_model_name: "smollm2".into(),
            chat_template: None,
            rows: vec![export_in_container(0)],
            tokenize_url: Some("http://127.0.0.1:1/tokenize".into()),
            served_model: "smollm2".into(),
            out: OUT.into(),
            checkpoints: CHECKPOINTS.into(),
            seed: 0,
            hyper: hyper(),
        };
        let value = serde_json::to_value(&request).unwrap();
        let mut keys: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "base_model",
                "base_model_name",
                "batch_size",
                "beta",
                "chat_template",
                "checkpoints",
                "kind",
                "learning_rate",
                "lora_alpha",
                "lora_r",
                "max_length",
                "out",
                "rows",
                "seed",
                "served_model",
                "steps",
                "tokenize_url"
            ]
        );
        assert_eq!(value["kind"], "dpo");
        assert_eq!(value["rows"][0], "/work/exports/0.jsonl");
        assert!(value["chat_template"].is_null());
    }

    #[test]
    fn the_id_follows_every_input_and_nothing_else() {
        let exports = vec!["ab".to_string()];
        let id = training_id("h", Format::Sft, &exports, &hyper(), 0);
        assert_eq!(id, training_id("h", Format::Sft, &exports, &hyper(), 0));
        assert_eq!(id.len(), 16);
        assert_ne!(id, training_id("h", Format::Dpo, &exports, &hyper(), 0));
        assert_ne!(id, training_id("h", Format::Sft, &exports, &hyper(), 1));
        assert_ne!(id, training_id("g", Format::Sft, &exports, &hyper(), 0));
        assert_ne!(id, training_id("h", Format::Sft, &["cd".to_string()], &hyper(), 0));
        let more = Hyper { steps: 3, ..hyper() };
        assert_ne!(id, training_id("h", Format::Sft, &exports, &more, 0));
    }
}
