//! `pruefstand log [<job>] [--follow]`: the daemon's lines about one job (its own log,
//! `.pruefstand/jobs/<id>/log`, across attempts); without an id, the last job started.
//! `--follow` keeps printing new lines (the queue's watch on the job's folder) until the
//! job has ended, then its end in a line (`job N: done, approved`) and exits with the
//! verdict's code (`run`'s: 0 approved, 10 rejected, 11 inconclusive, 12 invalid, 2
//! failed or cancelled). Each line's time is shown as in every other view
//! (`util::local_time`); the file keeps RFC 3339 in UTC.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use pruefstand_core::queue::Queue;
use pruefstand_core::root::Root;
use pruefstand_core::watch::Folder;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The job id (see `pruefstand queue`); without it, the last job started.
    pub(crate) job: Option<String>,
    /// Keep printing new lines until the job has ended; then its verdict, and exit with
    /// its code (0 approved, 10 rejected, 11 inconclusive, 12 invalid, 2 failed or
    /// cancelled).
    #[arg(long, short)]
    pub(crate) follow: bool,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let queue = Queue::open(&root)?;
    let id = match &args.job {
        Some(job) => queue.find(job)?.id,
        None => last_started(&queue)?,
    };
    let path = queue.log_file(id);
    if !args.follow {
        if !path.exists() {
            tracing::info!("job {id} has no log yet: it has not started ({})", queue.load(id)?.state.as_str());
            return Ok(ExitCode::SUCCESS);
        }
        let mut shown = 0;
        print_new(&path, &mut shown, true)?;
        return Ok(ExitCode::SUCCESS);
    }
    // The job's folder: its log grows there and job.json is replaced there.
    let wakeups = queue.wakeups(&[Folder::Job(id)], |_| true)?;
    let mut shown = 0;
    loop {
        // The state first: lines written before it ended are all printed below.
        let job = queue.load(id)?;
        let ended = job.state.is_final();
        print_new(&path, &mut shown, ended)?;
        if ended {
            outln!("job {id}: {}", crate::client::describe(&job));
            return Ok(ExitCode::from(job.exit_code()));
        }
        // The timeout only guards against a missed event; new lines wake this at once.
        wakeups.wait(Some(Duration::from_secs(5)))?;
    }
}

/// The job with the highest id that has a log (has started), else the newest job.
fn last_started(queue: &Queue) -> anyhow::Result<u64> {
    let mut ids: Vec<u64> = queue.list()?.iter().map(|j| j.id).collect();
    ids.sort_unstable();
    let started = ids.iter().rev().find(|id| queue.log_file(**id).exists());
    match started.or(ids.last()) {
        Some(id) => {
            tracing::info!("job {id}, the last one started (`pruefstand log ID` for another)");
            Ok(*id)
        }
        None => anyhow::bail!("no jobs in {} yet: `pruefstand start` queues one", queue.dir.display()),
    }
}

/// Prints the whole lines of `path` after byte `shown` and moves `shown` past them; a
/// line still being written waits for its end unless `all`.
fn print_new(path: &Path, shown: &mut u64, all: bool) -> anyhow::Result<()> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    file.seek(SeekFrom::Start(*shown))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).with_context(|| format!("reading {}", path.display()))?;
    let end = complete_lines(&bytes, all);
    if end > 0 {
        let text = String::from_utf8_lossy(&bytes[..end]);
        for line in text.strip_suffix('\n').unwrap_or(&text).split('\n') {
            outln!("{}", with_local_time(line));
        }
    }
    *shown += end as u64;
    Ok(())
}

/// A log line as the other views show times: its leading RFC 3339 time (UTC, as the
/// daemon writes it) in local time to the second.
fn with_local_time(line: &str) -> String {
    match line.split_once(' ') {
        Some((time, rest)) if chrono::DateTime::parse_from_rfc3339(time).is_ok() => {
            format!("{} {rest}", pruefstand_core::util::local_time(time))
        }
        _ => line.to_string(),
    }
}

/// How many leading bytes of `bytes` are whole lines (all of them when `all`).
fn complete_lines(bytes: &[u8], all: bool) -> usize {
    if all {
        return bytes.len();
    }
    bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_lines_time_is_shown_like_every_other() {
        let line = with_local_time("2026-01-02T03:04:05.678Z  INFO job 3: done, approved");
        let time = pruefstand_core::util::local_time("2026-01-02T03:04:05Z");
        assert_eq!(line, format!("{time}  INFO job 3: done, approved"));
        assert_eq!(with_local_time("a line without a time"), "a line without a time");
        assert_eq!(with_local_time(""), "");
    }

    #[test]
    fn a_half_written_line_waits_for_its_end() {
        assert_eq!(complete_lines(b"one\ntw", false), 4);
        assert_eq!(complete_lines(b"one\ntw", true), 6);
        assert_eq!(complete_lines(b"partial", false), 0);
        assert_eq!(complete_lines(b"", false), 0);
    }
}
