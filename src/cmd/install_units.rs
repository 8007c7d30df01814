//! `pruefstand install-units`: writes the systemd user units of `units/` (built into
//! the binary) with this binary's path and the bench root filled in, to
//! `~/.config/systemd/user/` or `--dir`, and prints the commands that enable them.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::root::Root;

pub const UNITS: [(&str, &str); 3] = [
    ("pruefstand.service", include_str!("../../units/pruefstand.service")),
    ("pruefstand-voll@.service", include_str!("../../units/pruefstand-voll@.service")),
    ("pruefstand-voll@.timer", include_str!("../../units/pruefstand-voll@.timer")),
];

#[derive(clap::Args)]
pub struct Args {
    /// Where to write them (default: ~/.config/systemd/user).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// A unit's text with the binary and root filled in.
pub fn render(text: &str, bin: &std::path::Path, root: &std::path::Path) -> String {
    text.replace("@PRUEFSTAND_BIN@", &bin.display().to_string())
        .replace("@PRUEFSTAND_ROOT@", &root.display().to_string())
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let bin = std::env::current_exe().and_then(|p| p.canonicalize()).context("finding this binary")?;
    let dir = match args.dir {
        Some(dir) => dir,
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".config/systemd/user"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text) in UNITS {
        let path = dir.join(name);
        crate::util::write_atomic(&path, render(text, &bin, &root.path).as_bytes())?;
        outln!("{}", path.display());
    }
    tracing::info!(
        "next:\n  systemctl --user daemon-reload\n  systemctl --user enable --now pruefstand.service\n  systemctl --user enable --now pruefstand-voll@kandidat.timer   # nightly voll of a version\n  loginctl enable-linger $USER   # run without a login session"
    );
    Ok(ExitCode::SUCCESS)
}
