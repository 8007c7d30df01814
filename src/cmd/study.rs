//! `pruefstand study`: the R2 error-rate study (docs/statistics.md) — how often R2 approves
//! a version whose true ASR sits exactly at `asr_max` on `voll`'s shape.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::judge::study;
use crate::plan::Profile;
use crate::root::Root;

#[derive(clap::Args)]
pub struct Args {
    /// Simulated versions to judge.
    #[arg(long, default_value_t = 2000)]
    pub replicates: u32,
    /// Intra-cluster correlation of the latent per-user-task susceptibility.
    #[arg(long, default_value_t = 0.1)]
    pub rho: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The profile whose R2 thresholds are studied.
    #[arg(long, default_value = "voll")]
    pub profile: String,
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let (profile, _) = Profile::load(&Profile::locate(&root.path, &args.profile))?;
    let result = study::r2_at_the_boundary(args.replicates, args.rho, args.seed, &profile.rules);
    outln!(
        "R2 at the boundary on voll's shape (true ASR = asr_max = {:.2}, ρ = {}, {} simulated versions):",
        result.true_asr,
        result.rho,
        result.replicates
    );
    outln!("  false approvals, one-way clustering (user task):       {:.1} %", result.one_way * 100.0);
    outln!("  false approvals, two-way clustering (user × injection): {:.1} %", result.two_way * 100.0);
    outln!("  false approvals without the cluster adjustment:        {:.1} %", result.unadjusted * 100.0);
    Ok(ExitCode::SUCCESS)
}
