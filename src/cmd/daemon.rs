//! `pruefstand daemon`: run the queue of this bench root (normally under systemd:
//! `units/pruefstand.service`).

use std::path::PathBuf;
use std::process::ExitCode;

use pruefstand_core::root::Root;

#[derive(clap::Args)]
pub(crate) struct Args {}

pub(crate) async fn main(root: Option<PathBuf>, _args: Args) -> anyhow::Result<ExitCode> {
    crate::daemon::main(Root::find(root)?).await
}
