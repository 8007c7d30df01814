//! The process's async runtime and the one way blocking work leaves it: every runtime
//! this binary builds marks its threads (`pruefstand_core::blocking`'s debug check), and
//! [`blocking`] runs a closure on tokio's blocking pool — a flock, a child process's
//! wait, the pip venv build, judging and writing the reports, an fsync — so the
//! workers keep serving the other tasks (the daemon's inbox, the warm pool, the
//! concurrency observer).

use std::io;

/// The multi-threaded runtime with `workers` workers, its threads marked.
pub(crate) fn multi_thread(workers: usize) -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .on_thread_start(pruefstand_core::blocking::mark_runtime_thread)
        .enable_all()
        .build()
}

/// A single-threaded runtime (an agent's, a test's), its blocking-pool threads marked;
/// the thread that drives it is the caller's own.
pub(crate) fn current_thread() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .on_thread_start(pruefstand_core::blocking::mark_runtime_thread)
        .enable_all()
        .build()
}

/// Runs `f` on the blocking pool (inside a `pruefstand_core::blocking::section`, in the caller's
/// tracing span) and waits for it without holding a worker; a panic in `f` resumes here.
pub(crate) async fn blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    // In the caller's span: a daemon job's messages reach its log from the pool too.
    let span = tracing::Span::current();
    match tokio::task::spawn_blocking(move || span.in_scope(|| pruefstand_core::blocking::section(f))).await {
        Ok(value) => value,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        // The runtime is shutting down: the caller's task goes with it.
        Err(err) => panic!("blocking work cancelled: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of the core's guarded entry points: a run lock's flock.
    fn take_lock(dir: &std::path::Path) -> bool {
        pruefstand_store::RunLock::try_take_as(&dir.join("lock"), "a test").is_ok()
    }

    #[test]
    #[cfg(debug_assertions)]
    fn a_guarded_call_panics_on_a_worker_and_passes_through_blocking() {
        let runtime = multi_thread(1).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let (dir, on_worker) = (tmp.path().to_path_buf(), tmp.path().to_path_buf());
        let direct = runtime.block_on(runtime.spawn(async move { take_lock(&on_worker) }));
        let panic = direct.expect_err("called on a worker").into_panic();
        let message = panic.downcast_ref::<String>().map(String::as_str).unwrap_or_default();
        assert!(message.contains("a run lock's flock on an async runtime worker"), "{message}");
        let handed_off = runtime.block_on(runtime.spawn(async move { blocking(move || take_lock(&dir)).await }));
        assert!(handed_off.unwrap());
    }

    #[test]
    fn a_panic_in_blocking_work_reaches_the_caller() {
        let runtime = current_thread().unwrap();
        let caught = runtime.block_on(runtime.spawn(async { blocking(|| panic!("inside")).await }));
        assert!(caught.unwrap_err().is_panic());
    }
}
