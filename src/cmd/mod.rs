//! One file per command: argument parsing and the command's top-level flow. The work
//! itself lives in the domain modules.

pub mod agent;
pub mod cancel;
pub mod check;
pub mod daemon;
pub mod gym;
pub mod install_units;
pub mod judge;
pub mod queue;
pub mod run;
pub mod setup;
pub mod sim_serve;
pub mod start;
pub mod status;
pub mod study;
