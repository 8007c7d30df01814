//! `pruefstand compare RUN_A RUN_B [RUN_C …]`: one self-contained page of runs side by
//! side — what differs between their versions and plans, their figures with the rules'
//! bounds, R4's pairing of B against A, and every changed case with both conversations;
//! with three runs or more an overview first, then each further run against the first.
//! Each RUN is a run directory, a version name, `job:N` or `latest` (`cmd::runs`).
//! Reads the run directories, judges the first and each further run against each other
//! (`judge::judge_against_each_other`, nothing written there but the page) and writes
//! the page with `report::write_compare`.

use std::path::PathBuf;
use std::process::ExitCode;

use pruefstand_judge as judge;
use pruefstand_report as report;
use pruefstand_store::LockError;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The runs, two or more: the first is the reference (shown left and first), each
    /// further one a candidate compared with it. Each is a run directory, a version
    /// name (its newest finished run under reports/), job:N (job N's run) or latest.
    #[arg(value_name = "RUN", num_args = 2.., required = true)]
    pub(crate) runs: Vec<PathBuf>,
    /// Where to write the page (a file, or a folder to hold compare.html). Default:
    /// the last run's compare.html. Never written over a file that is not a compare page.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    // Each word resolved first: an error names the one that names no run.
    let dirs = crate::cmd::runs::resolve(root.as_deref(), &args.runs)?;
    let runs = report::compare_dirs(&dirs)?;
    // A run still writing its directory holds run.lock: comparing it now would read
    // half a run (and write beside a run that is not done).
    let mut locks = Vec::new();
    for run in &runs {
        match run.lock_if_written(None) {
            Ok(None) => {}
            Ok(Some(lock)) => locks.push(lock),
            Err(LockError::Busy { holder }) => anyhow::bail!(
                "{} is being written by {}: compare it when that run has ended",
                run.path().display(),
                holder.trim()
            ),
            Err(LockError::Failed(err)) => return Err(err),
        }
    }
    let judged = runs[1..].iter().map(|b| judge::judge_against_each_other(&runs[0], b)).collect::<Result<_, _>>()?;
    let page = report::write_compare(&runs, judged, args.out.as_deref())?;
    outln!("{}", page.display());
    Ok(ExitCode::SUCCESS)
}
