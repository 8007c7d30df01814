//! Every configuration type, in one place: `pruefstand.toml` (paths, the guards, the
//! hooks, `[cluster]`), a version's defence layers (`defence`), the simulated model's `[sim]` table
//! (`sim`), a profile's rule thresholds (`thresholds`), and a URL that may carry
//! credentials (`url`). Types and their validation
//! only: reading the files and acting on them belongs to `root`, `spec`, `plan`, the
//! guards, the hooks and the judge.

pub mod cluster;
pub mod defence;
pub mod sim;
pub mod thresholds;
pub mod url;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// `pruefstand.toml`.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub paths: Paths,
    #[serde(default)]
    pub guard: GuardConfig,
    #[serde(default)]
    pub hooks: Vec<HookConfig>,
    #[serde(default)]
    pub run: RunConfig,
    #[serde(default)]
    pub cluster: cluster::ClusterConfig,
}

/// `[run]`: how runs use this machine.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The most cases in flight at once, whatever the model server has room for: each
    /// holds a gym thread and an agent process, memory the model server does not get on
    /// a machine whose GPU shares it.
    #[serde(default = "default_max_in_flight", deserialize_with = "in_flight_bound")]
    pub max_in_flight: usize,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig { max_in_flight: default_max_in_flight() }
    }
}

fn default_max_in_flight() -> usize {
    256
}

/// The most cases in flight, however it is asked for — a plan's `jobs`, `--jobs`,
/// `[run] max_in_flight`, the gym's request: the one source of the bound (the gym reads
/// it from the request schema, `gym::schemas`). Each case holds a gym thread and an
/// agent process; a server batches a few hundred requests at most.
pub const MAX_IN_FLIGHT: usize = 4096;

/// The one check of a count of cases in flight; `field` names where it was given.
pub fn check_in_flight(field: &str, value: usize) -> Result<usize, String> {
    match (1..=MAX_IN_FLIGHT).contains(&value) {
        true => Ok(value),
        false => Err(format!("{field} = {value} is not in [1, {MAX_IN_FLIGHT}]")),
    }
}

/// [`check_in_flight`] on a deserialized count.
pub(crate) fn in_flight_field<'de, D: Deserializer<'de>>(d: D, field: &str) -> Result<usize, D::Error> {
    let value = <usize as Deserialize>::deserialize(d)?;
    check_in_flight(field, value).map_err(serde::de::Error::custom)
}

fn in_flight_bound<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    in_flight_field(d, "max_in_flight")
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Paths {
    /// Where runs land, relative to the root unless absolute.
    #[serde(default = "default_reports")]
    pub reports: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths { reports: default_reports() }
    }
}

fn default_reports() -> PathBuf {
    PathBuf::from("reports")
}

/// `[guard]` of pruefstand.toml.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct GuardConfig {
    #[serde(default)]
    pub gpu: GpuConfig,
    #[serde(default)]
    pub units: UnitsConfig,
}

/// What to do when a source cannot be read at all (no NVML, a bus not reachable).
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Unavailable {
    /// Jobs wait; the status says why.
    #[default]
    Block,
    /// Jobs run without this check (noted in the status; R1 says "not observed").
    Ignore,
}

/// `[guard.gpu]`.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    /// When NVML cannot be loaded or sees no GPU.
    #[serde(default)]
    pub nvml: Unavailable,
    /// The NVML library; default `libnvidia-ml.so.1` from the loader's path.
    #[serde(default)]
    pub library: Option<PathBuf>,
    /// Highest GPU utilization (percent) that still counts as idle.
    #[serde(default = "default_utilization_max", deserialize_with = "percent")]
    pub utilization_max: u32,
    /// Consecutive clear samples needed before a job starts.
    #[serde(default = "default_samples", deserialize_with = "at_least_one")]
    pub samples: u32,
    /// Seconds between samples (while waiting and while a run is watched).
    #[serde(default = "default_interval_s", deserialize_with = "positive_seconds")]
    pub interval_s: f64,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            nvml: Unavailable::Block,
            library: None,
            utilization_max: default_utilization_max(),
            samples: default_samples(),
            interval_s: default_interval_s(),
        }
    }
}

impl GpuConfig {
    pub fn interval(&self) -> Duration {
        Duration::from_secs_f64(self.interval_s)
    }
}

/// `[guard.units]`: unit name patterns (systemd globs, e.g. `training@*.service`).
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct UnitsConfig {
    /// On the user's (session) bus: the user manager the daemon itself runs under.
    #[serde(default)]
    pub user: Vec<String>,
    /// On the system bus.
    #[serde(default)]
    pub system: Vec<String>,
    /// When a bus with patterns cannot be reached.
    #[serde(default)]
    pub unreachable: Unavailable,
}

fn default_utilization_max() -> u32 {
    10
}
fn default_samples() -> u32 {
    3
}
fn default_interval_s() -> f64 {
    5.0
}

fn percent<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u32::deserialize(d)?;
    if v > 100 {
        return Err(serde::de::Error::custom(format!("utilization_max is a percentage (0–100), not {v}")));
    }
    Ok(v)
}

fn at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u32::deserialize(d)?;
    // A day of one-second samples is already more than any idle window needs.
    if !(1..=86_400).contains(&v) {
        return Err(serde::de::Error::custom(format!("samples = {v} is not in [1, 86400]")));
    }
    Ok(v)
}

/// Upper bound: a day; anything more is a typo (milliseconds?) and would stall jobs.
fn positive_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    crate::input::bounded(d, "interval_s", (0.0, 86_400.0, true), "a number of seconds")
}

/// A secret string: never printed by `Debug`.
#[derive(Deserialize, Clone)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret read from elsewhere than a settings file (an environment variable).
    pub fn new(secret: String) -> Secret {
        Secret(secret)
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Slack,
    Mattermost,
    Discord,
    Matrix,
    Ntfy,
    Json,
    Exec,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Slack => "slack",
            Kind::Mattermost => "mattermost",
            Kind::Discord => "discord",
            Kind::Matrix => "matrix",
            Kind::Ntfy => "ntfy",
            Kind::Json => "json",
            Kind::Exec => "exec",
        }
    }
}

/// One `[[hooks]]` entry of pruefstand.toml.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// Names the hook in logs (the URL never appears there).
    pub name: String,
    pub kind: Kind,
    #[serde(default, deserialize_with = "url::http_secret")]
    pub url: Option<Secret>,
    /// The variable holding the URL, for keeping it out of the file.
    #[serde(default)]
    pub url_env: Option<String>,
    /// Matrix access token; ntfy bearer token (optional).
    #[serde(default)]
    pub token: Option<Secret>,
    #[serde(default)]
    pub token_env: Option<String>,
    /// `exec`: the program and its arguments.
    #[serde(default)]
    pub argv: Vec<String>,
    /// Outcomes that fire it: approved, rejected, inconclusive, invalid, failed.
    #[serde(default)]
    pub on: Option<Vec<String>>,
    #[serde(default = "default_timeout", deserialize_with = "hook_timeout_s")]
    pub timeout_s: f64,
    #[serde(default = "default_retries", deserialize_with = "hook_retries")]
    pub retries: u32,
    #[serde(default = "default_backoff", deserialize_with = "hook_backoff_s")]
    pub backoff_s: f64,
}

/// A hook that takes minutes would hold the next job's verdict back: ten at most.
fn hook_timeout_s<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    crate::input::bounded(d, "timeout_s", (0.0, 600.0, true), "a number of seconds")
}

fn hook_backoff_s<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    crate::input::bounded(d, "backoff_s", (0.0, 600.0, false), "a number of seconds")
}

fn hook_retries<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let retries = u32::deserialize(d)?;
    if retries > 20 {
        return Err(serde::de::Error::custom(format!("retries = {retries} is more than 20")));
    }
    Ok(retries)
}

fn default_timeout() -> f64 {
    10.0
}
fn default_retries() -> u32 {
    3
}
fn default_backoff() -> f64 {
    1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<Config> {
        crate::input::parse_toml(std::path::Path::new("pruefstand.toml"), text)
    }

    #[test]
    fn max_in_flight_defaults_and_is_bounded_with_the_line_named() {
        assert_eq!(parse("").unwrap().run.max_in_flight, 256);
        assert_eq!(parse("[run]\nmax_in_flight = 48\n").unwrap().run.max_in_flight, 48);
        let err = format!("{:#}", parse("[run]\nmax_in_flight = 0\n").unwrap_err());
        assert!(err.contains("pruefstand.toml") && err.contains("max_in_flight = 0 is not in [1, 4096]"), "{err}");
        assert!(err.contains('2'), "the line: {err}");
        assert!(parse("[run]\nmax_inflight = 3\n").is_err(), "a typo is an error");
    }

    #[test]
    fn hook_numbers_are_bounded_at_their_line() {
        let hook = "[[hooks]]\nname = \"a\"\nkind = \"exec\"\nargv = [\"true\"]\n";
        for (line, message) in [
            ("timeout_s = 1e300", "timeout_s = 1e300 is not a number of seconds in (0, 600]"),
            ("timeout_s = nan", "timeout_s = NaN"),
            ("timeout_s = 0.0", "timeout_s = 0 is not"),
            ("backoff_s = -1.0", "backoff_s = -1 is not"),
            ("retries = 1000", "retries = 1000 is more than 20"),
        ] {
            let text = format!("{hook}{hook}{line}\n");
            let err = parse(&text).err().unwrap().to_string();
            assert!(err.starts_with("pruefstand.toml:9:") && err.contains(message), "{line}: {err}");
        }
    }
}
