//! pruefstand — a local GPU test bench for tool-using LLM agents under prompt-injection
//! attack. This binary is the orchestrator over the library crates (crates/: the core's
//! vocabulary, the gym's contract, the run store, the judge, the report, the simulated
//! model, the agent); its modules below follow the flow (docs/architecture.md), leaves
//! first; one file per command lives in `cmd`. Every module names the crates' paths in
//! full (`pruefstand_store::RunDir`), so a path says which crate it lives in.

use pruefstand_core::util;

// The orchestrator: a module uses only the crates and modules declared above it
// (tests/layers.rs checks it), so this list reads as the flow. rustfmt keeps this order
// (`reorder_modules = false`).

// The console: output, progress bars and the log format (its macros for every module
// below).
#[macro_use]
mod console;
// The async runtime, and the one way blocking work is handed off its workers; waiting
// for a lock another process holds (the bench lock, a reference's).
mod runtime;
mod lock_wait;

// Before a job may use the GPU: the guards.
mod guard;

// The model server: vLLM in a container, or the simulated model (`pruefstand_sim`),
// brought up and down.
mod container;
mod model;

// The run's parts: the gym (AgentDojo, Python) and its steering, the adaptive attacker,
// provenance (the agent runtime is `pruefstand_agent`).
mod concurrency;
mod gym;
mod adaptive;
mod provenance;

// After the verdict: the hooks.
mod hooks;

// Orchestration: one run end to end, a job's shards on a Slurm cluster, an adapter
// trained from the runs' exports, and the daemon that runs queued jobs.
mod run;
mod cluster;
mod train;
mod daemon;

// The read-only web view of a bench root: the queue, the live progress, the reports.
mod serve;

// The commands: what they share as clients of the queue and the daemon (following a
// job, saying a verdict), then one file per command.
mod client;
mod cmd;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "pruefstand",
    version,
    about = "Local GPU test bench for tool-using LLM agents under prompt-injection attack"
)]
struct Cli {
    /// Bench root (folder with pruefstand.toml, versions/, profiles/, reports/).
    /// Default: $PRUEFSTAND_ROOT, else the nearest parent of the current directory
    /// holding a pruefstand.toml.
    #[arg(long, global = true, env = "PRUEFSTAND_ROOT")]
    root: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmark a version on a plan and judge it (the main job).
    #[command(after_help = cmd::run::exit_codes())]
    Run(cmd::run::Args),
    /// Queue a version × plan for the daemon; prints the job id.
    Start(cmd::start::Args),
    /// List the queued, running and finished jobs.
    Queue(cmd::queue::Args),
    /// What the daemon does now.
    Status(cmd::status::Args),
    /// Cancel a pending job, or stop a running one.
    Cancel(cmd::cancel::Args),
    /// Show a job's log (the daemon's lines about it); --follow until it ends.
    #[command(after_help = cmd::run::exit_codes())]
    Log(cmd::log::Args),
    /// Wait for a queued or running job to end; exit with its verdict's code.
    #[command(after_help = cmd::run::exit_codes())]
    Wait(cmd::wait::Args),
    /// Put a done, failed or cancelled job back into the queue (resumes its run dir).
    Restart(cmd::restart::Args),
    /// Change a pending job's priority.
    Priority(cmd::priority::Args),
    /// Remove ended jobs from the queue (their run directories stay).
    Clean(cmd::clean::Args),
    /// Pause the queue: the daemon starts no new job (a running one finishes).
    Pause(cmd::pause::Args),
    /// Resume a paused queue.
    Resume(cmd::pause::Args),
    /// Run one shard of a queued job on this node (a Slurm array task runs this).
    Shard(cmd::shard::Args),
    /// Run the job queue (normally under systemd: units/pruefstand.service).
    Daemon(cmd::daemon::Args),
    /// Preflight: venv, Docker, image, model files, NVML, D-Bus, busy units, config
    /// permissions — one line each, OK/WARN/FAIL with the fix.
    Check(cmd::check::Args),
    /// Re-judge a stored run without re-running a case.
    Judge(cmd::judge::Args),
    /// Runs side by side in one page (two, or more against the first): spec diff,
    /// figures, R4's pairing, changed cases.
    Compare(cmd::compare::Args),
    /// Hand runs back as training data: DPO pairs or SFT conversations, never of
    /// held-out families (JSON lines and a manifest).
    Export(cmd::export::Args),
    /// A run as JSON, for scripts: its facts, counts, verdict and attacker search, or
    /// its case records or conversations as JSON lines (read-only).
    Show(cmd::show::Args),
    /// Train a LoRA adapter on exports from a version's model, write the new version's
    /// spec and judge it (refused before any step on rows it must not train on).
    #[command(after_help = cmd::run::exit_codes())]
    Train(cmd::train::Args),
    /// Queue a training job: the daemon trains as `train` does, under a bench job's
    /// guards, then judges the version it made (one job, one verdict).
    StartTraining(cmd::start_training::Args),
    /// Queue one night of the gym as a chain: judge VERSION, export its run's rows, train
    /// the next adapter from it and judge that on a plan holding out what it never saw.
    StartNight(cmd::start_night::Args),
    /// Run a plan's cases against any agent that speaks the JSON-line protocol.
    Gym(cmd::gym::Args),
    /// The R2 error-rate study: false approvals at the boundary on voll's shape.
    Study(cmd::study::Args),
    /// Make a new bench root (default ~/pruefstand) from the installed examples.
    Init(cmd::init::Args),
    /// Create the managed Python venv with the pinned agentdojo now.
    Setup(cmd::setup::Args),
    /// Write the systemd user units with this binary and root filled in.
    InstallUnits(cmd::install_units::Args),
    /// The default agent runtime the gym spawns (JSON lines on stdin/stdout).
    Agent(cmd::agent::Args),
    /// Serve a read-only web view of the queue, live progress and reports (127.0.0.1).
    Serve(cmd::serve::Args),
    /// Serve the simulated OpenAI-compatible model (vLLM's command-line shape).
    SimServe(cmd::sim_serve::Args),
    /// Print shell completions (generated from this command line).
    Completions(cmd::completions::Args),
    /// Print the man page, or write all pages with --dir.
    Man(cmd::completions::ManArgs),
}

fn main() -> ExitCode {
    let cli: Cli = cmd::parse();
    console::init(match cli.command {
        Command::Daemon(_) => console::Audience::Daemon,
        Command::Agent(_) => console::Audience::Agent,
        _ => console::Audience::Command,
    });
    // What a package ships is generated from these two: the words as written.
    if matches!(cli.command, Command::Man(_) | Command::Completions(_)) {
        console::verbatim();
    }
    // The process's one runtime: Docker, D-Bus and HTTP clients are made and used on it,
    // and the daemon's jobs run on it. An agent answers one query at a time (and there
    // are dozens of them), so it gets a single thread.
    let runtime = match &cli.command {
        Command::Agent(_) => runtime::current_thread(),
        _ => runtime::multi_thread(2),
    };
    let result = match runtime {
        Ok(runtime) => {
            let result = runtime.block_on(dispatch(cli.root, cli.command));
            // Work left on the blocking pool (a hung NVML probe, a stdin reader) must not
            // keep the process alive.
            runtime.shutdown_background();
            result
        }
        Err(err) => Err(anyhow::Error::new(err).context("starting the async runtime")),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::from(util::EXIT_COULD_NOT_RUN)
        }
    }
}

async fn dispatch(root: Option<std::path::PathBuf>, command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Run(args) => cmd::run::main(root, args).await,
        Command::Gym(args) => cmd::gym::main(root, args).await,
        Command::Judge(args) => cmd::judge::main(root, args),
        Command::Compare(args) => cmd::compare::main(root, args),
        Command::Export(args) => cmd::export::main(root, args),
        Command::Show(args) => cmd::show::main(root, args),
        Command::Train(args) => cmd::train::main(root, args).await,
        Command::StartTraining(args) => cmd::start_training::main(root, args),
        Command::StartNight(args) => cmd::start_night::main(root, args),
        Command::Agent(args) => cmd::agent::main(args).await,
        Command::SimServe(args) => cmd::sim_serve::main(args).await,
        Command::Serve(args) => cmd::serve::main(root, args).await,
        Command::Init(args) => cmd::init::main(root, args),
        Command::Setup(args) => cmd::setup::main(args),
        Command::Study(args) => cmd::study::main(root, args),
        Command::Check(args) => cmd::check::main(root, args).await,
        Command::Start(args) => cmd::start::main(root, args),
        Command::Queue(args) => cmd::queue::main(root, args),
        Command::Cancel(args) => cmd::cancel::main(root, args),
        Command::Log(args) => cmd::log::main(root, args),
        Command::Wait(args) => cmd::wait::main(root, args),
        Command::Restart(args) => cmd::restart::main(root, args),
        Command::Priority(args) => cmd::priority::main(root, args),
        Command::Clean(args) => cmd::clean::main(root, args),
        Command::Pause(_) => cmd::pause::main(root, true),
        Command::Resume(_) => cmd::pause::main(root, false),
        Command::Status(args) => cmd::status::main(root, args),
        Command::Daemon(args) => cmd::daemon::main(root, args).await,
        Command::Shard(args) => cmd::shard::main(root, args).await,
        Command::InstallUnits(args) => cmd::install_units::main(root, args),
        Command::Completions(args) => cmd::completions::main(args, Cli::command()),
        Command::Man(args) => cmd::completions::man(args, Cli::command()),
    }
}

#[cfg(test)]
mod tests {
    /// clap checks a command's definition only when that command is parsed: every
    /// command's, here, so a clash (a flattened group's name) fails a test, not a user.
    #[test]
    fn every_command_is_defined_without_a_clash() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
