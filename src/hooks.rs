//! Completion hooks (stub, being written): chat webhooks and exec hooks fired when a
//! job ends.

use serde::Deserialize;

/// One `[[hooks]]` entry of pruefstand.toml.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {}
