//! Watching the queue with inotify, no polling: the one watcher that the daemon, `start
//! --wait`, `wait`, `cancel`, `status --watch`, `log --follow` and `serve` share
//! ([`Queue::watch`], or [`Queue::wakeups`] for a loop that blocks between looks), and
//! the one place that tells a change from a read. Every watcher reads what it was woken
//! for, and a read opens and closes files in the folders it watches: counted as news,
//! those events would wake it again and again. The queue's own writes are what wakes it
//! (`Queue::touch` bumps `jobs/.changed` on every transition and pause, so watching
//! `jobs/` sees a change inside any job's folder). A folder outside the queue can be
//! added to a watch ([`Watch::add`]: a training's, whose steps a job's watcher shows),
//! or watched alone ([`folders`]: the daemon's config). Not what a change means to its
//! watcher.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use notify::Watcher;

use crate::queue::Queue;

/// A running watch; dropped, inotify's thread ends and no callback comes after.
pub struct Watch {
    watcher: notify::RecommendedWatcher,
}

impl Watch {
    /// Watches `dir` too, not recursively: its changes come as [`Change::Elsewhere`] (or
    /// as what they are in the queue, for a queue folder).
    pub fn add(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.watcher
            .watch(dir, notify::RecursiveMode::NonRecursive)
            .with_context(|| format!("watching {}", dir.display()))
    }

    /// Stops watching `dir`, added before; one not watched (or gone) is no error.
    pub fn remove(&mut self, dir: &Path) {
        let _ = self.watcher.unwatch(dir);
    }
}

/// A folder of the queue a watch covers; none is watched recursively.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Folder {
    /// `.pruefstand/` itself: the daemon's published state, its lock, the pause marker.
    Daemon,
    /// `jobs/`: a job queued or cleaned, and `.changed`, which every transition and every
    /// pause or resume bumps.
    Jobs,
    /// One job's folder: its `job.json` (replaced by a transition, or edited in place by
    /// something else than the queue, which bumps nothing), its log growing.
    Job(u64),
}

/// What a watch saw change, in the queue's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A file in `.pruefstand/` itself (`daemon.json`, the daemon lock closed by a daemon
    /// that ended, the pause marker).
    Daemon,
    /// An entry of `jobs/`: `.changed`, or a job's folder come or gone.
    Jobs,
    /// A job's `job.json`.
    Job(u64),
    /// Another file in a job's folder: its log, its notifications, a file being written
    /// before it replaces `job.json`.
    JobFolder(u64),
    /// A file in a folder outside the queue, added to the watch ([`Watch::add`]).
    Elsewhere(PathBuf),
    /// Changes may have been missed (inotify's queue overflowed, or it failed): anything
    /// may have changed.
    Unknown,
}

impl Queue {
    /// Watches the `which` folders and calls `on_change` on inotify's thread with each change; reads
    /// (ours among them) are none.
    pub fn watch(&self, which: &[Folder], on_change: impl Fn(Change) + Send + 'static) -> anyhow::Result<Watch> {
        let dirs: Vec<PathBuf> = which
            .iter()
            .map(|folder| match folder {
                Folder::Daemon => self.dir.clone(),
                Folder::Jobs => self.jobs_dir(),
                Folder::Job(id) => self.job_dir(*id),
            })
            .collect();
        let queue = self.clone();
        folders(&dirs, move |path| on_change(path.map_or(Change::Unknown, |path| queue.change_of(path))))
    }

    /// A watch of `which` folders whose changes `wakes` lets through wait for
    /// [`Wakeups::wait`].
    pub fn wakeups(
        &self,
        which: &[Folder],
        wakes: impl Fn(&Change) -> bool + Send + 'static,
    ) -> anyhow::Result<Wakeups> {
        let (tx, rx) = mpsc::channel();
        let watch = self.watch(which, move |change| {
            if wakes(&change) {
                let _ = tx.send(change);
            }
        })?;
        Ok(Wakeups { rx, watch })
    }

    /// What a changed path is in the queue.
    fn change_of(&self, path: &Path) -> Change {
        if !path.starts_with(&self.dir) {
            return Change::Elsewhere(path.to_path_buf());
        }
        let Ok(in_jobs) = path.strip_prefix(self.jobs_dir()) else { return Change::Daemon };
        let mut parts = in_jobs.components().map(|part| part.as_os_str());
        match (parts.next().and_then(|name| name.to_str()?.parse::<u64>().ok()), parts.next()) {
            (Some(id), Some(file)) if file == "job.json" => Change::Job(id),
            (Some(id), Some(_)) => Change::JobFolder(id),
            _ => Change::Jobs,
        }
    }
}

/// A watch for a loop that looks, then blocks until the next change it cares for.
pub struct Wakeups {
    rx: mpsc::Receiver<Change>,
    /// To add a folder outside the queue, or remove it.
    pub watch: Watch,
}

impl Wakeups {
    /// Blocks until a change wakes it, or until `timeout` when one is given (then none:
    /// an empty list). The changes queued behind the first are taken with it, so a burst
    /// of events (one atomic write is several) is one wake.
    pub fn wait(&self, timeout: Option<Duration>) -> anyhow::Result<Vec<Change>> {
        let first = match timeout {
            None => self.rx.recv().context("inotify ended")?,
            Some(timeout) => match self.rx.recv_timeout(timeout) {
                Ok(change) => change,
                Err(mpsc::RecvTimeoutError::Timeout) => return Ok(Vec::new()),
                Err(err) => return Err(err).context("inotify ended"),
            },
        };
        Ok(std::iter::once(first).chain(self.rx.try_iter()).collect())
    }
}

/// Watches `dirs`, none recursively, and calls `on_change` on inotify's thread with each
/// path a change touched, or `None` when changes may have been missed.
pub fn folders(dirs: &[PathBuf], on_change: impl Fn(Option<&Path>) + Send + 'static) -> anyhow::Result<Watch> {
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
        Ok(event) if is_read(&event.kind) => {}
        // inotify's overflow comes without a path.
        Ok(event) if event.paths.is_empty() => on_change(None),
        Ok(event) => event.paths.iter().for_each(|path| on_change(Some(path))),
        Err(_) => on_change(None),
    })
    .context("starting inotify")?;
    for dir in dirs {
        watcher
            .watch(dir, notify::RecursiveMode::NonRecursive)
            .with_context(|| format!("watching {}", dir.display()))?;
    }
    Ok(Watch { watcher })
}

/// Whether an event tells only of a read: a file opened, read, or closed without a
/// write. Its close after a write is a change (a file written in place may show nothing
/// else once its writer is done).
fn is_read(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    matches!(kind, EventKind::Access(access) if *access != AccessKind::Close(AccessMode::Write))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue in a fresh folder with job 3's folder and its `job.json`.
    fn queue() -> (tempfile::TempDir, Queue) {
        let tmp = tempfile::tempdir().unwrap();
        let queue = Queue { dir: tmp.path().join(".pruefstand") };
        std::fs::create_dir_all(queue.job_dir(3)).unwrap();
        std::fs::write(queue.job_dir(3).join("job.json"), "{}").unwrap();
        std::fs::write(queue.daemon_lock_file(), "").unwrap();
        (tmp, queue)
    }

    /// Every change until `last` (itself included). inotify keeps its events in order, so
    /// what came before the last write's change is everything the steps before it caused.
    fn until(rx: &mpsc::Receiver<Change>, last: Change) -> Vec<Change> {
        let mut seen = Vec::new();
        while seen.last() != Some(&last) {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(change) => seen.push(change),
                Err(err) => panic!("no {last:?} after {seen:?}: {err}"),
            }
        }
        seen
    }

    fn append(path: &Path, text: &str) {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        file.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn a_watch_wakes_on_each_change_of_the_queue_and_names_it() {
        let (_tmp, queue) = queue();
        let (tx, rx) = mpsc::channel();
        let _watch = queue
            .watch(&[Folder::Daemon, Folder::Jobs, Folder::Job(3)], move |change| tx.send(change).unwrap())
            .unwrap();
        // Each step's changes, with what the step before may still trail (a rename is
        // told as its two halves and as one).
        let step = |last: Change, before: &[Change]| {
            let seen = until(&rx, last.clone());
            assert!(seen.iter().all(|c| *c == last || before.contains(c)), "before {last:?}: {seen:?}");
        };
        // A transition: job.json replaced whole (a temporary file renamed over it), then
        // `.changed` bumped.
        crate::util::write_atomic(&queue.job_dir(3).join("job.json"), b"{\"id\":3}").unwrap();
        step(Change::Job(3), &[Change::JobFolder(3)]);
        append(&queue.jobs_dir().join(".changed"), "now");
        step(Change::Jobs, &[Change::Job(3), Change::JobFolder(3)]);
        // A job.json edited in place, by something else than the queue.
        append(&queue.job_dir(3).join("job.json"), " ");
        step(Change::Job(3), &[Change::Jobs]);
        append(&queue.log_file(3), "a line\n");
        step(Change::JobFolder(3), &[Change::Job(3)]);
        std::fs::create_dir(queue.job_dir(4)).unwrap();
        step(Change::Jobs, &[Change::JobFolder(3)]);
        std::fs::write(queue.daemon_state_file(), "{}").unwrap();
        step(Change::Daemon, &[Change::Jobs]);
    }

    #[test]
    fn our_own_reads_wake_no_watch() {
        let (_tmp, queue) = queue();
        let (tx, rx) = mpsc::channel();
        let _watch = queue
            .watch(&[Folder::Daemon, Folder::Jobs, Folder::Job(3)], move |change| tx.send(change).unwrap())
            .unwrap();
        // What a woken watcher does: read the job, list the queue, look at the lock.
        for _ in 0..3 {
            std::fs::read(queue.job_dir(3).join("job.json")).unwrap();
            std::fs::read_dir(queue.jobs_dir()).unwrap().for_each(drop);
            std::fs::read_dir(&queue.dir).unwrap().for_each(drop);
            std::fs::File::open(queue.daemon_lock_file()).unwrap();
            assert!(!queue.log_file(3).exists());
        }
        // The last step's change: nothing came before it.
        append(&queue.log_file(3), "a line\n");
        let seen = until(&rx, Change::JobFolder(3));
        assert!(seen.iter().all(|c| *c == Change::JobFolder(3)), "reads woke the watch: {seen:?}");
    }

    #[test]
    fn wakeups_let_through_only_the_changes_asked_for() {
        let (_tmp, queue) = queue();
        let wakeups = queue.wakeups(&[Folder::Jobs, Folder::Job(3)], |c| *c == Change::Job(3)).unwrap();
        append(&queue.log_file(3), "a line\n");
        append(&queue.jobs_dir().join(".changed"), "now");
        append(&queue.job_dir(3).join("job.json"), " ");
        // The log line and `.changed` came first: had they been let through, they would be.
        let woken = wakeups.wait(None).unwrap();
        assert!(!woken.is_empty() && woken.iter().all(|c| *c == Change::Job(3)), "{woken:?}");
    }

    #[test]
    fn a_folder_outside_the_queue_is_watched_while_it_is_added() {
        let (tmp, queue) = queue();
        let training = tmp.path().join("training");
        std::fs::create_dir(&training).unwrap();
        let (tx, rx) = mpsc::channel();
        let mut watch = queue.watch(&[Folder::Jobs], move |change| tx.send(change).unwrap()).unwrap();
        watch.add(&training).unwrap();
        let events = training.join("trainer-events.jsonl");
        append(&events, "{}\n");
        append(&queue.jobs_dir().join(".changed"), "now");
        let seen = until(&rx, Change::Jobs);
        let elsewhere = Change::Elsewhere(events.clone());
        assert!(seen.contains(&elsewhere) && seen.iter().all(|c| [&elsewhere, &Change::Jobs].contains(&c)), "{seen:?}");
        watch.remove(&training);
        watch.remove(&training);
        append(&events, "{}\n");
        append(&queue.jobs_dir().join(".changed"), "now");
        let seen = until(&rx, Change::Jobs);
        assert!(seen.iter().all(|c| *c == Change::Jobs), "a removed folder still wakes the watch: {seen:?}");
    }

    #[test]
    fn a_path_is_named_by_where_it_lies_in_the_queue() {
        let queue = Queue { dir: PathBuf::from("/r/.pruefstand") };
        let of = |path: &str| queue.change_of(Path::new(path));
        assert_eq!(of("/r/.pruefstand/daemon.json"), Change::Daemon);
        assert_eq!(of("/r/.pruefstand/paused"), Change::Daemon);
        assert_eq!(of("/r/.pruefstand/jobs"), Change::Jobs);
        assert_eq!(of("/r/.pruefstand/jobs/.changed"), Change::Jobs);
        assert_eq!(of("/r/.pruefstand/jobs/12"), Change::Jobs);
        assert_eq!(of("/r/.pruefstand/jobs/12/job.json"), Change::Job(12));
        assert_eq!(of("/r/.pruefstand/jobs/12/log"), Change::JobFolder(12));
        assert_eq!(of("/r/.pruefstand/jobs/12/.tmpXYZ"), Change::JobFolder(12));
        assert_eq!(of("/r/.pruefstand/jobs/next/x"), Change::Jobs);
        assert_eq!(of("/r/training/events.jsonl"), Change::Elsewhere(PathBuf::from("/r/training/events.jsonl")));
    }
}
