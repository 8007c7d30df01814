//! The integration tests, one test binary (`autotests = false` in Cargo.toml): one
//! module per area, each in its own file beside this one, and `common/` (the bench
//! builder and the real stand-ins) compiled and linked once for all of them. One area:
//! `cargo test --test main report::`; one test: its full path, e.g.
//! `cargo test --test main judge::the_r2_study_prints_false_approval_rates_within_the_promise`.
//!
//! All areas share one process: a `OnceLock` in `common/` (the Python venv, the sim
//! image, the Slurm cluster, the fake NVML) runs once for the whole run, and no test may
//! change the process's environment or working directory.

mod common;

mod arm64;
mod attacker;
mod cluster;
mod console;
mod container;
mod daemon;
mod daemon_guards;
mod defences;
mod docs;
mod environment;
mod export;
mod faults;
mod guards;
mod gym;
mod hooks;
mod hostile;
mod isolation;
mod judge;
mod layers;
mod newcomer;
mod night;
mod package;
mod queue;
mod real_server;
mod report;
mod run;
mod serve;
mod show;
mod systemd;
mod training;
mod training_progress;
