//! `pruefstand gym`: run a plan's cases against any agent command that speaks the
//! JSON-line protocol, and write a run directory with `cases.jsonl` and telemetry.
//! No version, model or verdict: that is `run`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::gym::{GymSettings, execute};
use crate::plan::{Filters, Plan, Profile};
use crate::pyenv::{Inventory, PyEnv};
use crate::root::Root;
use crate::rundir::RunDir;
use crate::{telemetry, util};

#[derive(clap::Args)]
pub struct Args {
    /// `schnell`, `voll` (from the root's profiles/) or a plan file.
    #[arg(long, default_value = "schnell")]
    pub plan: String,
    /// The agent under test, e.g. "python3 scripts/examples/agent_counter.py". Split
    /// like a shell would split words, but no shell runs it.
    #[arg(long)]
    pub agent_cmd: String,
    /// Only these suites (repeatable).
    #[arg(long = "suite")]
    pub suites: Vec<String>,
    /// Only these user tasks (repeatable).
    #[arg(long = "user-task")]
    pub user_tasks: Vec<String>,
    /// Only these injection tasks (repeatable).
    #[arg(long = "injection-task")]
    pub injection_tasks: Vec<String>,
    /// Only these attacks (repeatable; `none` selects clean cases).
    #[arg(long = "attack")]
    pub attacks: Vec<String>,
    /// Parallel workers (default: the plan's).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// The run directory itself; an existing one with the same cases is resumed.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Names the run's folder under reports/.
    #[arg(long, default_value = "gym")]
    pub name: String,
    /// Model name the important_instructions attacks address the model by.
    #[arg(long, default_value = "Local model")]
    pub display_name: String,
    /// Per-case wall-time limit in seconds (default: the plan's).
    #[arg(long)]
    pub case_timeout: Option<f64>,
}

pub fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let agent_cmd = shlex::split(&args.agent_cmd)
        .filter(|argv| !argv.is_empty())
        .with_context(|| format!("--agent-cmd {:?} is empty or has unbalanced quotes", args.agent_cmd))?;
    let filters = Filters {
        suites: args.suites,
        user_tasks: args.user_tasks,
        injection_tasks: args.injection_tasks,
        attacks: args.attacks,
    };
    let pyenv = PyEnv::ensure()?;
    let plan_path = Profile::locate(&root.path, &args.plan);
    let (profile, _) = Profile::load(&plan_path)?;
    let inventory = Inventory::load(&pyenv, profile.benchmark_version.get_ref())?;
    let plan = Plan::resolve(&plan_path, &inventory, &filters)?;
    let run_dir = RunDir::new(args.out.unwrap_or_else(|| root.new_run_dir(&args.name, &plan.name)));
    let outcome = execute(
        &pyenv,
        &run_dir,
        &plan,
        &inventory,
        GymSettings {
            agent_cmd,
            jobs: args.jobs.unwrap_or(plan.jobs),
            display_name: args.display_name,
            case_timeout_s: args.case_timeout.unwrap_or(plan.case_timeout_s),
            seed: 0,
            defence: None,
            agent_env: Vec::new(),
            control: None,
            early: None,
        },
    )?;
    print_summary(&run_dir, &outcome.telemetry);
    Ok(ExitCode::from(util::EXIT_APPROVED))
}

pub fn print_summary(run_dir: &RunDir, telemetry: &telemetry::Telemetry) {
    let d = &telemetry.denominators;
    let show = |name: &str| {
        let rate = &d[name];
        match rate.value {
            Some(v) => format!("{:.1} % ({}/{})", v * 100.0, rate.hits, rate.n),
            None => "–".into(),
        }
    };
    outln!(
        "utility {}  utility under attack {}  ASR {}  injection-task utility {}  errors {}",
        show("utility"),
        show("utility_under_attack"),
        show("asr"),
        show("injection_task_utility"),
        telemetry.counts.errors
    );
    outln!("model format health: {}", telemetry.format_health.line(telemetry.counts.recorded));
    outln!("{}", run_dir.path.display());
}
