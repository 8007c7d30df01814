//! `pruefstand export --format dpo|sft RUN… --out FILE`: hands runs back as
//! training data (docs/training.md) — JSON lines at FILE and `FILE.manifest.json`
//! beside it (counts, refused held-out families, sources with their `run.json` hashes,
//! the export's sha256). The rows and what is refused are `export`'s; this reads the
//! command line (a RUN is a folder, a version name, `job:N` or `latest`: `cmd::runs`),
//! keeps runs that are still being written out, and says what was written. An export
//! that wrote no row says why on stderr and exits [`EXIT_EMPTY`] (1).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use pruefstand_report::export::{self, Format};
use pruefstand_store::{LockError, RunDir, RunLock};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FormatArg {
    /// Preference pairs: prompt up to the injected tool result, chosen (resisted),
    /// rejected (followed).
    Dpo,
    /// Whole conversations that kept utility and resisted.
    Sft,
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// What the rows are.
    #[arg(long, value_enum)]
    pub(crate) format: FormatArg,
    /// The runs to read: each a run directory (it holds run.json, version.json,
    /// cases.jsonl and traces/), a version name (its newest finished run under
    /// reports/), job:N (job N's run) or latest. A DPO pair takes its two sides from two
    /// of them.
    #[arg(value_name = "RUN", required = true)]
    pub(crate) run_dirs: Vec<PathBuf>,
    /// The export file (JSON lines); its manifest is written beside it as
    /// FILE.manifest.json.
    #[arg(long)]
    pub(crate) out: PathBuf,
}

pub(crate) fn main(root: Option<PathBuf>, mut args: Args) -> anyhow::Result<ExitCode> {
    args.run_dirs = crate::cmd::runs::resolve(root.as_deref(), &args.run_dirs)?;
    // A run still writing its directory holds run.lock: its records are not all there.
    // A run given twice is refused before any lock: the second would wait for our own.
    let mut seen = std::collections::BTreeSet::new();
    for dir in &args.run_dirs {
        anyhow::ensure!(
            seen.insert(dir.canonicalize().unwrap_or_else(|_| dir.clone())),
            "{}: given twice",
            dir.display()
        );
    }
    let runs = args.run_dirs.iter().map(RunDir::open).collect::<anyhow::Result<Vec<_>>>()?;
    let mut locks = Vec::new();
    for run in &runs {
        locks.extend(take_lock(run)?);
    }
    let format = match args.format {
        FormatArg::Dpo => Format::Dpo,
        FormatArg::Sft => Format::Sft,
    };
    let manifest = export::write(format, &runs, &args.out)?;
    let refused: usize = manifest.refused_held_out.values().sum();
    let skipped: usize = manifest.skipped.values().sum();
    outln!("{} {} row(s) → {}", manifest.rows, format.as_str(), args.out.display());
    for (family, n) in &manifest.families {
        outln!("  {family}: {n} row(s)");
    }
    if manifest.clean_rows > 0 {
        outln!("  clean: {} row(s)", manifest.clean_rows);
    }
    for (family, n) in &manifest.refused_held_out {
        outln!("  refused (held out): {family}: {n}");
    }
    if skipped > 0 {
        let why: Vec<String> = manifest.skipped.iter().map(|(why, n)| format!("{why}: {n}")).collect();
        outln!("  skipped: {skipped} ({})", why.join("; "));
    }
    outln!("manifest: {} ({refused} refused)", export::manifest_path(&args.out).display());
    if manifest.rows == 0 {
        tracing::warn!("{}", why_empty(format, args.run_dirs.len()));
        return Ok(ExitCode::from(EXIT_EMPTY));
    }
    Ok(ExitCode::SUCCESS)
}

/// The exit status of an export that wrote no row (its file and manifest are there):
/// not 0, so that `export … && train …` stops; not 2, which says the command could not
/// run.
const EXIT_EMPTY: u8 = 1;

/// Why an export came out empty, and what to pass instead.
fn why_empty(format: Format, runs: usize) -> String {
    match format {
        Format::Dpo if runs < 2 => format!(
            "no DPO pair: a pair is one attacked case from two runs, one that resisted it and one that followed \
             it, and {runs} run was given; pass two or more runs of the same plan, e.g. the reference and the \
             candidate: `pruefstand export --format dpo demo-baseline demo-kandidat --out FILE` (a RUN is {})",
            crate::cmd::runs::WORDS
        ),
        Format::Dpo => "no DPO pair: no attacked case that one of these runs resisted was followed in another (or \
                        every such case is of a held-out family; the manifest counts what was skipped and \
                        refused); pass a run that followed injections beside one that resisted them"
            .to_string(),
        Format::Sft => "no SFT row: no conversation of these runs both kept utility and resisted (the manifest \
                        counts what was skipped and refused)"
            .to_string(),
    }
}

/// How an export names itself in a run's lock while it reads: another export's hold
/// is waited for (they read a run for a second or two), a run's is refused.
const HOLDER: &str = "pruefstand export";

/// How long an export waits for another export reading the same run.
const EXPORT_WAIT: Duration = Duration::from_secs(60);

/// The run's lock, taken for reading it (None: no run wrote there); an error naming
/// the run when a run holds it.
fn take_lock(run: &RunDir) -> anyhow::Result<Option<RunLock>> {
    let holder = format!("{HOLDER} (pid {})", std::process::id());
    let started = Instant::now();
    loop {
        match run.lock_if_written(Some(&holder)) {
            Ok(lock) => return Ok(lock),
            // (A holder not yet written reads "another process": the moment another
            // export took it.)
            Err(LockError::Busy { holder })
                if (holder.trim().starts_with(HOLDER) || holder == "another process")
                    && started.elapsed() < EXPORT_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(LockError::Busy { holder }) => anyhow::bail!(
                "{} is being written by {}: export it when that run has ended",
                run.path().display(),
                holder.trim()
            ),
            Err(LockError::Failed(err)) => return Err(err),
        }
    }
}
