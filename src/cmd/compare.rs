//! `pruefstand compare RUN_A RUN_B`: one self-contained page of two runs side by side —
//! what differs between their versions and plans, their figures with the rules' bounds,
//! R4's pairing of B against A, and every changed case with both conversations. Reads
//! the run directories, judges each against the other
//! (`judge::judge_against_each_other`, nothing written there but the page) and writes
//! the page with `report::write_compare`.

use std::path::PathBuf;
use std::process::ExitCode;

use pruefstand_judge as judge;
use pruefstand_report as report;
use pruefstand_store::{LockError, RunDir};

#[derive(clap::Args)]
pub struct Args {
    /// The first run directory: shown left, taken as the reference.
    pub run_a: PathBuf,
    /// The second run directory: shown right, taken as the candidate.
    pub run_b: PathBuf,
    /// Where to write the page (a file, or a folder to hold compare.html). Default:
    /// RUN_B/compare.html. Never written over a file that is not a compare page.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn main(args: Args) -> anyhow::Result<ExitCode> {
    // A run still writing its directory holds run.lock: comparing it now would read
    // half a run (and write beside a run that is not done).
    let mut locks = Vec::new();
    for dir in [&args.run_a, &args.run_b] {
        match RunDir::new(dir).lock_if_written(None) {
            Ok(None) => {}
            Ok(Some(lock)) => locks.push(lock),
            Err(LockError::Busy { holder }) => anyhow::bail!(
                "{} is being written by {}: compare it when that run has ended",
                dir.display(),
                holder.trim()
            ),
            Err(LockError::Failed(err)) => return Err(err),
        }
    }
    let (a, b) = report::compare_dirs(&args.run_a, &args.run_b)?;
    let judged = judge::judge_against_each_other(&a, &b)?;
    let page = report::write_compare(&a, &b, judged, args.out.as_deref())?;
    outln!("{}", page.display());
    Ok(ExitCode::SUCCESS)
}
