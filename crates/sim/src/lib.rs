//! The simulated model: an OpenAI-compatible server that acts out the
//! AgentDojo ground truth, follows injections with a seeded probability per served
//! name, names the task's tools to AgentDojo's tool filter, classifies tool outputs for
//! the prompt-injection detector, and models latency and batch capacity. Deterministic and honest about being a
//! simulation; not a language model and not a general mock.
//!
//! `truth` (truth.json) → `policy` (what to do) → `openai` (wire format) → `server`
//! (HTTP, latency, metrics). `draw` is the only randomness.

pub mod draw;
pub mod faults;
pub mod metrics;
pub mod openai;
pub mod policy;
pub mod server;
pub mod truth;

#[cfg(test)]
mod fuzz;
// Test fixtures, for the agent's tests too (`test-support`).
#[cfg(any(test, feature = "test-support"))]
pub mod testing;

pub use pruefstand_core::settings::sim::SimConfig;
pub use server::{Server, SimSettings};
pub use truth::Truth;
