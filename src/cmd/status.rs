//! `pruefstand status`: what the daemon does — not running, idle, waiting for the GPU
//! and why, or running a job with cases done/total and an ETA (a job on a cluster: its
//! shards done/running/pending). Reads the state the
//! daemon publishes (`.pruefstand/daemon.json`); `--watch` follows it (inotify) with a
//! progress bar until Ctrl-C.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::cmd::start::daemon_running;
use crate::daemon::state::{self, Activity, DaemonState, Overview};
use crate::queue::Queue;
use crate::root::Root;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    pub json: bool,
    /// Follow the daemon with a progress bar.
    #[arg(long, conflicts_with = "json")]
    pub watch: bool,
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let queue = Queue::open(&root)?;
    if args.watch {
        return watch(&queue);
    }
    let overview = Overview::read(&queue, &queue.list()?)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&overview.to_json())?);
        return Ok(ExitCode::SUCCESS);
    }
    match (overview.running, &overview.published) {
        (true, Some(state)) => outln!("daemon: pid {}, since {}\n{}", state.pid, state.since, state.activity.line()),
        (true, None) => outln!("daemon: starting"),
        (false, _) => {
            outln!("daemon: not running (start it: `pruefstand daemon` or `systemctl --user start pruefstand`)")
        }
    }
    if let Some(counts) = overview.shards {
        outln!("{}", counts.line());
    }
    outln!("pending jobs: {}", overview.pending);
    if overview.paused {
        outln!("the queue is paused: no job starts until `pruefstand resume`");
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a daemon holds the lock, and its published state (stale when it does not).
fn current(queue: &Queue) -> anyhow::Result<(bool, Option<DaemonState>)> {
    Ok((daemon_running(queue)?, state::read(&queue.daemon_state_file())))
}

fn watch(queue: &Queue) -> anyhow::Result<ExitCode> {
    use notify::Watcher;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |_event| {
        let _ = tx.send(());
    })
    .context("starting inotify")?;
    watcher.watch(&queue.dir, notify::RecursiveMode::NonRecursive)?;
    let bar = indicatif::ProgressBar::new(0);
    // The bar only while a job runs: otherwise a spinner and the line, never a bar at
    // 0/0 or the last job's position.
    let running_style =
        indicatif::ProgressStyle::with_template("{spinner} {bar:40} {pos}/{len} cases  {msg}").expect("valid template");
    let other_style = indicatif::ProgressStyle::with_template("{spinner} {msg}").expect("valid template");
    // Without a terminal (a log, a pipe) the bar stays hidden: print each change as a line.
    let plain = bar.is_hidden();
    let mut last_line = String::new();
    loop {
        let (running, published) = current(queue)?;
        if plain {
            let line = match (running, &published) {
                (true, Some(state)) => state.activity.line(),
                _ => "daemon not running".to_string(),
            };
            if line != last_line {
                outln!("{line}");
                last_line = line;
            }
        }
        match (running, published.map(|s| s.activity)) {
            (true, Some(Activity::Running(p))) => {
                bar.set_style(running_style.clone());
                bar.set_length(p.total as u64);
                bar.set_position(p.done as u64);
                let eta = p.eta_s.map(|s| format!("ETA {}", state::human_secs(s))).unwrap_or_default();
                bar.set_message(format!("job {} ({} on {}) {eta}", p.job, p.version, p.plan));
            }
            (true, Some(activity)) => {
                bar.set_style(other_style.clone());
                bar.set_position(0);
                bar.set_message(activity.line());
            }
            _ => {
                bar.set_style(other_style.clone());
                bar.set_position(0);
                bar.set_message("daemon not running");
            }
        }
        bar.tick();
        // Wakes on the daemon's writes; the timeout only notices a daemon that died.
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => while rx.try_recv().is_ok() {},
            Err(err) => return Err(err).context("inotify ended"),
        }
    }
}
