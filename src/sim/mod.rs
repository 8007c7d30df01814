//! The simulated model (being written).

pub mod config;
