//! `pruefstand completions <shell>` and `pruefstand man`: shell completions and man
//! pages generated from the command-line definition itself (clap_complete,
//! clap_mangen), so they never drift from the binary. Hidden: they are for packagers
//! and the README's install lines, not for daily use.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// bash, zsh, fish, elvish or powershell.
    pub(crate) shell: clap_complete::Shell,
}

#[derive(clap::Args)]
pub(crate) struct ManArgs {
    /// Write `pruefstand.1` and one page per command (`pruefstand-run.1`, …) into this
    /// folder instead of printing the main page.
    #[arg(long)]
    pub(crate) dir: Option<PathBuf>,
}

pub(crate) fn main(args: Args, mut cli: clap::Command) -> anyhow::Result<ExitCode> {
    let name = cli.get_name().to_string();
    clap_complete::generate(args.shell, &mut cli, name, &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn man(args: ManArgs, cli: clap::Command) -> anyhow::Result<ExitCode> {
    match args.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(cli, &dir).with_context(|| format!("writing man pages to {}", dir.display()))?;
            outln!("{}", dir.display());
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cli).render(&mut page).context("rendering the man page")?;
            outln!("{}", String::from_utf8_lossy(&page).trim_end());
        }
    }
    Ok(ExitCode::SUCCESS)
}
