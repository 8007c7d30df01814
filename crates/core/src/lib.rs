//! pruefstand's vocabulary, the crate every other one speaks: cases and their records,
//! settings, version specs, plans, the job queue, AgentDojo's inventory as data, the
//! words the figures are said in. It decides nothing about a run's files (the store,
//! `pruefstand-store`), a verdict (`pruefstand-judge`) or a process (the binary). No async
//! runtime lives here: the orchestrator calls into it from its runtime through
//! `spawn_blocking`, never the other way round.
//!
//! The modules below follow the flow (docs/architecture.md), leaves first: a module uses
//! only modules declared above it (tests/layers.rs checks it). rustfmt keeps this order
//! (`reorder_modules = false`).

// The debug check that blocking work stays off the async runtime's workers (util's
// file writes and locks call it).
pub mod blocking;
// Leaves: words and tools every stage may use.
pub mod util;
// For tests only: the fuzzing harness and its generators (the binary's tests too, by
// the `test-support` feature).
#[cfg(any(test, feature = "test-support"))]
pub mod fuzzing;
// Reading configuration files and names, with errors at file:line:col.
pub mod input;
// Reading the files a spec or plan names: regular files only, size-capped, unblocking.
pub mod files;
// The names of the figures and how bounds are said, for every view.
pub mod words;
// How long the cases left will take, for the console and the daemon alike.
pub mod eta;
pub mod record;
pub mod settings;
pub mod case;
pub mod inventory;
pub mod family;

// What is asked for: a version spec and a plan, snapshotted into a queued job.
pub mod root;
pub mod spec;
pub mod plan;
pub mod queue;
// The queue watched (inotify): what wakes the daemon and every command that follows a job.
pub mod watch;

// The figures over a run's records and the order its user tasks are drawn in.
pub mod telemetry;
pub mod order;
