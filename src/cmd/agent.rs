//! `pruefstand agent --config FILE`: the default agent runtime the gym spawns. Speaks the
//! JSON-line protocol (docs/protocol.md §1) on stdin/stdout until EOF; logs go to stderr
//! (`PRUEFSTAND_LOG`). The model server's API key, if any, comes from
//! `PRUEFSTAND_API_KEY`. The work lives in `pruefstand_agent`.
use std::path::PathBuf;
use std::process::ExitCode;

use std::os::fd::AsFd;

use anyhow::Context;

use pruefstand_agent as agent;
use pruefstand_agent::AgentConfig;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Agent configuration (JSON: base_url, model, tool_calling, guardrail, human, …).
    #[arg(long)]
    pub(crate) config: PathBuf,
}

pub(crate) async fn main(args: Args) -> anyhow::Result<ExitCode> {
    let cfg = AgentConfig::load(&args.config)?;
    // The crate's tokio lacks `io-std`; stdin/stdout as tokio files (duplicated fds, run
    // on tokio's blocking pool) do the same job.
    let fd = |f: std::io::Result<std::os::fd::OwnedFd>, what: &str| {
        f.map(std::fs::File::from).with_context(|| format!("opening {what}"))
    };
    let stdin = fd(std::io::stdin().as_fd().try_clone_to_owned(), "stdin")?;
    let stdout = fd(std::io::stdout().as_fd().try_clone_to_owned(), "stdout")?;
    agent::serve(cfg, tokio::io::BufReader::new(tokio::fs::File::from_std(stdin)), tokio::fs::File::from_std(stdout))
        .await?;
    Ok(ExitCode::SUCCESS)
}
