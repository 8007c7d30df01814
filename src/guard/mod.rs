//! Guards (stub, being written): the GPU idle window (NVML) and busy systemd units
//! (D-Bus) that must both be clear before a job starts.

use serde::Deserialize;

/// `[guard]` of pruefstand.toml.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct GuardConfig {}
