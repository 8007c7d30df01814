//! `pruefstand shard <job> <i>/<N>`: one shard of a queued job on this node — what a
//! Slurm array task of the job runs (`cluster`). Prints the shard's exit record; exits
//! non-zero when the shard could not run.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cluster::shard;
use pruefstand_core::root::Root;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The job id.
    pub(crate) job: u64,
    /// This shard and the shard count, e.g. `3/8` (the batch script passes Slurm's
    /// `SLURM_ARRAY_TASK_ID`).
    #[arg(value_parser = shard_parser)]
    pub(crate) shard: (usize, usize),
    /// Run the job's reference version into this run directory (the reference's run,
    /// made on the cluster when R4 needs one) instead of the job's version.
    #[arg(long, value_name = "RUN_DIR")]
    pub(crate) reference: Option<PathBuf>,
}

fn shard_parser(text: &str) -> Result<(usize, usize), String> {
    shard::parse_index(text).map_err(|e| e.to_string())
}

pub(crate) async fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let (index, count) = args.shard;
    let record = shard::run(&root, args.job, index, count, args.reference.as_deref()).await?;
    outln!("{}", serde_json::to_string(&record)?);
    if let Some(error) = &record.error {
        tracing::error!("shard {index}/{count} of job {}: {error}", args.job);
        return Ok(ExitCode::from(pruefstand_core::util::EXIT_COULD_NOT_RUN));
    }
    Ok(ExitCode::SUCCESS)
}
