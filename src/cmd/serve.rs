//! `pruefstand serve`: the read-only web view of this bench root (the live queue and
//! progress, the reports and the trend index) on 127.0.0.1 until SIGINT or SIGTERM.
//! A non-loopback address needs `--allow-remote` as well: there is no login.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use pruefstand_core::root::Root;

const DEFAULT_LISTEN: &str = "127.0.0.1:8470";

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Address and port to listen on (port 0: any free port; the address is printed).
    #[arg(long, default_value = DEFAULT_LISTEN, value_name = "HOST:PORT")]
    pub(crate) listen: String,
    /// Listen on an address other machines can reach. There is no authentication:
    /// put the view behind your own proxy with a login instead (docs/serve.md).
    #[arg(long)]
    pub(crate) allow_remote: bool,
    /// Connections open at once; one more is answered 503 (busy) and closed.
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) max_connections: u16,
}

pub(crate) async fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let addr = resolve(&args.listen)?;
    if !addr.ip().is_loopback() {
        anyhow::ensure!(
            args.allow_remote,
            "--listen {addr} is not a loopback address, and this view has no authentication: anyone who reaches \
             it reads every report. Keep it on 127.0.0.1 behind your own proxy with a login (docs/serve.md), or \
             pass --allow-remote if you mean it"
        );
        tracing::warn!("serving on {addr} without authentication: anyone who can reach it reads every report");
    }
    // Caught from here on: a SIGTERM right after the address is printed must not kill.
    let stop = stop_signals()?;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr()?;
    let host = match local {
        SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
        SocketAddr::V4(v4) => v4.to_string(),
    };
    outln!("http://{host}/");
    tracing::info!("serving {} read-only on http://{host}/ (Ctrl-C ends it)", root.path.display());
    crate::serve::serve(&root, listener, args.max_connections.into(), async {
        let signal = stop.await;
        tracing::info!("{signal}: shutting down");
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

fn resolve(listen: &str) -> anyhow::Result<SocketAddr> {
    listen
        .to_socket_addrs()
        .with_context(|| format!("--listen {listen}: expected HOST:PORT"))?
        .next()
        .with_context(|| format!("--listen {listen} resolves to no address"))
}

/// SIGTERM and SIGINT handlers, installed now (not when the future is first polled, as
/// `tokio::signal::ctrl_c` is): the future completes with the first one's name.
fn stop_signals() -> anyhow::Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}
