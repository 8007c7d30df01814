//! Waiting for a lock another process holds — the bench lock before a job takes the GPU,
//! a reference run's lock — without holding up the async runtime: a try every
//! [`LOCK_RETRY`], a line for the user each time it is busy, until it is taken or the
//! caller's stop (a signal, a queue change) comes first. Taking the lock is the core's
//! ([`RunLock`]); only the waiting is async, so it lives here, not in the core.

use pruefstand_core::blocking;
use pruefstand_store::{LockError, RunLock};

/// How often a waiter looks at a lock again.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// How a wait for a lock ended.
pub(crate) enum Waited<S> {
    Taken(RunLock),
    /// The caller's stop came first, with its value.
    Stopped(S),
}

/// Takes a lock, waiting while another process holds it: `take` now and every
/// [`LOCK_RETRY`], `waiting(holder)` each time it is busy, until taken or `stop`
/// resolves. The one waiter of the bench lock and the reference locks. `take` tries
/// without blocking (`flock` with `LOCK_NB` returns at once), so it runs right here on
/// the runtime, as a [`blocking::section`] (the core's blocking check allows it).
pub(crate) async fn wait<S>(
    mut take: impl FnMut() -> Result<RunLock, LockError>,
    mut waiting: impl FnMut(&str),
    stop: impl std::future::Future<Output = S>,
) -> anyhow::Result<Waited<S>> {
    tokio::pin!(stop);
    loop {
        match blocking::section(&mut take) {
            Ok(lock) => return Ok(Waited::Taken(lock)),
            Err(LockError::Busy { holder }) => waiting(&holder),
            Err(LockError::Failed(err)) => return Err(err),
        }
        tokio::select! {
            () = tokio::time::sleep(LOCK_RETRY) => {}
            stopped = &mut stop => return Ok(Waited::Stopped(stopped)),
        }
    }
}
/// The bench lock for a command of this process (`holder` says which, for whoever
/// waits on it next), waited for with one line saying who holds it; Ctrl-C ends the
/// wait. `run` and `train` take the GPU this way.
pub(crate) async fn bench_lock(root: &pruefstand_core::root::Root, holder: &str) -> anyhow::Result<RunLock> {
    use pruefstand_store::benchlock;
    let mut said = false;
    let waiting = |other: &str| {
        if !said {
            tracing::info!("waiting for the GPU: {}", benchlock::held_by(other));
            said = true;
        }
    };
    match wait(|| benchlock::try_take(root, holder), waiting, tokio::signal::ctrl_c()).await? {
        Waited::Taken(lock) => Ok(lock),
        Waited::Stopped(_) => anyhow::bail!("interrupted while waiting for the GPU"),
    }
}
