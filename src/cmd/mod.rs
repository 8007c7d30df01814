//! One file per command: argument parsing and the command's top-level flow. The work
//! itself lives in the domain modules.

pub mod agent;
pub mod cancel;
pub mod check;
pub mod clean;
pub mod completions;
pub mod daemon;
pub mod gym;
pub mod install_units;
pub mod judge;
pub mod log;
pub mod pause;
pub mod priority;
pub mod queue;
pub mod restart;
pub mod run;
pub mod serve;
pub mod setup;
pub mod shard;
pub mod sim_serve;
pub mod start;
pub mod status;
pub mod study;

/// `--jobs`: at least one case in flight, and no more than a plan may ask for.
pub fn jobs_parser() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=crate::plan::JOBS_MAX as u64)
}

/// A name that becomes a folder under `reports/`.
pub fn name_parser(text: &str) -> Result<String, String> {
    crate::util::check_name(text)?;
    Ok(text.to_string())
}
