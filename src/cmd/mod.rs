//! One file per command: argument parsing and the command's top-level flow. The work
//! itself lives in the domain modules.

pub mod agent;
pub mod check;
pub mod gym;
pub mod judge;
pub mod run;
pub mod setup;
pub mod study;
pub mod sim_serve;
