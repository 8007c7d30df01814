//! A debug-build check that blocking work (a flock, a child process's wait, the pip
//! venv build, judging and writing the reports, an fsync) stays off the async
//! runtime's worker threads, where it would stall every task the worker carries.
//!
//! The binary marks each thread its runtime starts ([`mark_runtime_thread`], from the
//! builder's `on_thread_start`); the blocking entry points of the core call
//! [`assert_may_block`] first. The runtime's `spawn_blocking` threads are started by
//! the same builder, so they are marked too: the binary's wrapper around
//! `spawn_blocking` runs its closure inside a [`section`], which says "blocking is
//! fine here". Nothing here knows about tokio; a thread no runtime started (a test,
//! the main thread driving `block_on`) may always block.

use std::cell::Cell;

thread_local! {
    /// This thread was started by an async runtime (a worker or a blocking-pool thread).
    static RUNTIME_THREAD: Cell<bool> = const { Cell::new(false) };
    /// This thread is inside a [`section`]: what it runs was handed off to block.
    static BLOCKING_SECTION: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as one of an async runtime's (the runtime builder's
/// `on_thread_start`).
pub fn mark_runtime_thread() {
    RUNTIME_THREAD.with(|flag| flag.set(true));
}

/// Runs `f` as blocking work handed off the runtime's workers (the binary's
/// `spawn_blocking` wrapper calls it); the flag is restored afterwards, also when `f`
/// panics, so a pool thread reused for async work is checked again.
pub fn section<R>(f: impl FnOnce() -> R) -> R {
    /// Puts the previous flag back when dropped.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BLOCKING_SECTION.with(|flag| flag.set(self.0));
        }
    }
    let _restore = Restore(BLOCKING_SECTION.with(|flag| flag.replace(true)));
    f()
}

/// Panics in a debug build when called on an async runtime's thread outside a
/// [`section`]: `what` blocks, and must go through `spawn_blocking`.
pub fn assert_may_block(what: &str) {
    debug_assert!(
        !RUNTIME_THREAD.with(Cell::get) || BLOCKING_SECTION.with(Cell::get),
        "{what} on an async runtime worker: go through spawn_blocking"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_a_marked_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> std::thread::Result<R> {
        std::thread::spawn(move || {
            mark_runtime_thread();
            f()
        })
        .join()
    }

    #[test]
    fn an_unmarked_thread_may_block() {
        assert_may_block("a test");
    }

    #[test]
    #[cfg(debug_assertions)]
    fn a_runtime_thread_may_block_only_inside_a_section() {
        assert!(on_a_marked_thread(|| assert_may_block("an fsync")).is_err());
        assert!(on_a_marked_thread(|| section(|| assert_may_block("an fsync"))).is_ok());
        // The flag is restored: after the section, the thread is checked again (also
        // after a nested one).
        let after = on_a_marked_thread(|| {
            section(|| section(|| ()));
            assert_may_block("an fsync")
        });
        assert!(after.is_err());
    }
}
