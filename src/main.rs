//! pruefstand — a local GPU test bench for tool-using LLM agents under prompt-injection
//! attack. The modules below follow the flow of DESIGN §3, top to bottom; one file per
//! command lives in `cmd`.

// What is asked for: a version spec and a plan, snapshotted into a queued job.
mod case;
mod defence;
mod plan;
mod queue;
mod root;
mod spec;

// Who runs it: the daemon, once the GPU is idle and no busy unit runs.
mod daemon;
mod guard;

// The model server: vLLM in a container, or the simulated model.
mod container;
mod model;
mod sim;

// The run: the gym (AgentDojo, Python) with the agent runtime, recorded case by case.
mod agent;
mod gym;
mod provenance;
mod pyenv;
mod run;
mod rundir;

// The verdict: figures, statistics, rules R1–R5, reports — then the hooks.
mod hooks;
mod judge;
mod report;
mod stats;
mod telemetry;

mod cmd;
mod util;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    Run(cmd::run::Args),
    /// Queue a version × plan for the daemon; prints the job id.
    Start(cmd::start::Args),
    /// List the queued, running and finished jobs.
    Queue(cmd::queue::Args),
    /// What the daemon does now.
    Status(cmd::status::Args),
    /// Cancel a pending job, or stop a running one.
    Cancel(cmd::cancel::Args),
    /// Run the job queue (normally under systemd: units/pruefstand.service).
    Daemon(cmd::daemon::Args),
    /// Preflight: venv, Docker, image, model files, NVML, D-Bus, busy units, config
    /// permissions — one line each, OK/WARN/FAIL with the fix.
    Check(cmd::check::Args),
    /// Re-judge a stored run without re-running a case.
    Judge(cmd::judge::Args),
    /// Run a plan's cases against any agent that speaks the JSON-line protocol.
    Gym(cmd::gym::Args),
    /// The R2 error-rate study: false approvals at the boundary on voll's shape.
    Study(cmd::study::Args),
    /// Create the managed Python venv with the pinned agentdojo now.
    Setup(cmd::setup::Args),
    /// Write the systemd user units with this binary and root filled in.
    InstallUnits(cmd::install_units::Args),
    /// The default agent runtime the gym spawns (JSON lines on stdin/stdout).
    Agent(cmd::agent::Args),
    /// Serve the simulated OpenAI-compatible model (vLLM's command-line shape).
    SimServe(cmd::sim_serve::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The daemon's log is the journal: it says what it does. Commands stay quiet.
    util::init_logging(if matches!(cli.command, Command::Daemon(_)) { "warn,pruefstand=info" } else { "warn" });
    let result = match cli.command {
        Command::Run(args) => cmd::run::main(cli.root, args),
        Command::Gym(args) => cmd::gym::main(cli.root, args),
        Command::Judge(args) => cmd::judge::main(cli.root, args),
        Command::Agent(args) => cmd::agent::main(args),
        Command::SimServe(args) => cmd::sim_serve::main(args),
        Command::Setup(args) => cmd::setup::main(args),
        Command::Study(args) => cmd::study::main(cli.root, args),
        Command::Check(args) => cmd::check::main(cli.root, args),
        Command::Start(args) => cmd::start::main(cli.root, args),
        Command::Queue(args) => cmd::queue::main(cli.root, args),
        Command::Cancel(args) => cmd::cancel::main(cli.root, args),
        Command::Status(args) => cmd::status::main(cli.root, args),
        Command::Daemon(args) => cmd::daemon::main(cli.root, args),
        Command::InstallUnits(args) => cmd::install_units::main(cli.root, args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(util::EXIT_COULD_NOT_RUN)
        }
    }
}
