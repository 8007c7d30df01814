//! `pruefstand init [DIR]`: makes a new bench root from the examples the Debian package
//! installs under `/usr/share/pruefstand/` (found beside the binary: `../share/pruefstand`
//! from its folder), or from `--from DIR` — a checkout of the repository works too.
//! Without `DIR` the root is `--root` (or `PRUEFSTAND_ROOT`) if given, else
//! `~/pruefstand`, the one the packaged systemd units use.
//!
//! It never overwrites: a folder that already holds a config, `versions/`, `profiles/`
//! or `reports/` is refused before anything is written (`root::create`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use pruefstand_core::root;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The new bench root (default: --root or $PRUEFSTAND_ROOT if set, else
    /// ~/pruefstand, where the packaged units look).
    pub(crate) dir: Option<PathBuf>,
    /// Where the examples are: a folder with pruefstand.toml, versions/ and profiles/
    /// (default: ../share/pruefstand beside this binary, /usr/share/pruefstand when
    /// installed by the package).
    #[arg(long)]
    pub(crate) from: Option<PathBuf>,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let dir = match args.dir.or(root) {
        Some(dir) => dir,
        None => {
            PathBuf::from(std::env::var_os("HOME").context("HOME is not set: name the folder")?).join(root::HOME_ROOT)
        }
    };
    let from = match args.from {
        Some(from) => from,
        None => {
            let bin = std::env::current_exe().and_then(|p| p.canonicalize()).context("finding this binary")?;
            // /usr/bin/pruefstand → /usr/share/pruefstand (likewise under /usr/local).
            let prefix = bin.parent().and_then(|bin_dir| bin_dir.parent()).unwrap_or(std::path::Path::new("/"));
            let from = prefix.join("share/pruefstand");
            anyhow::ensure!(
                from.is_dir(),
                "no examples at {} ({} was not installed by the package): pass --from DIR, e.g. a checkout of pruefstand",
                from.display(),
                bin.display()
            );
            from
        }
    };
    let written = root::create(&dir, &from)?;
    tracing::info!("{} files from {}", written.len(), from.display());
    outln!("{}", dir.display());
    tracing::info!(
        "next:\n  cd {}\n  pruefstand check demo-kandidat\n  pruefstand run demo-kandidat --plan schnell",
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
