//! Rules R1–R5 and the verdict (placeholder until the judge lands).
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, Default, Clone, Debug)]
pub struct Thresholds {
    #[serde(flatten)]
    pub raw: toml::Table,
}
