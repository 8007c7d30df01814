//! pruefstand — a local GPU test bench for tool-using LLM agents under prompt-injection
//! attack. The flow (DESIGN §3) reads from the module list: a version `spec` and a
//! `plan` make `case`s; the `gym` runs them through AgentDojo (Python, via `pyenv`)
//! with the `agent` runtime talking to a model (`sim` here, vLLM on the Jetson);
//! `telemetry`, `stats` and `judge` turn records into a verdict; `report` writes it.
//! One file per command lives in `cmd`.

mod agent;
mod case;
mod cmd;
mod container;
mod defence;
mod guard;
mod gym;
mod hooks;
mod judge;
mod model;
mod plan;
mod provenance;
mod pyenv;
mod report;
mod root;
mod rundir;
mod run;
mod sim;
mod spec;
mod stats;
mod telemetry;
mod util;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "pruefstand", version, about = "Local GPU test bench for tool-using LLM agents under prompt-injection attack")]
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
    /// Run a plan's cases against any agent that speaks the JSON-line protocol.
    Gym(cmd::gym::Args),
    /// Re-judge a stored run without re-running a case.
    Judge(cmd::judge::Args),
    /// The default agent runtime the gym spawns (JSON lines on stdin/stdout).
    Agent(cmd::agent::Args),
    /// Create the managed Python venv with the pinned agentdojo now.
    Setup(cmd::setup::Args),
    /// Serve the simulated OpenAI-compatible model (vLLM's command-line shape).
    SimServe(cmd::sim_serve::Args),
}

fn main() -> ExitCode {
    util::init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => cmd::run::main(cli.root, args),
        Command::Gym(args) => cmd::gym::main(cli.root, args),
        Command::Judge(args) => cmd::judge::main(cli.root, args),
        Command::Agent(args) => cmd::agent::main(args),
        Command::SimServe(args) => cmd::sim_serve::main(args),
        Command::Setup(args) => cmd::setup::main(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(util::EXIT_COULD_NOT_RUN)
        }
    }
}
