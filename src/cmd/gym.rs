//! `pruefstand gym`: run a plan's cases against any agent command that speaks the
//! JSON-line protocol, and write a run directory with `cases.jsonl` and telemetry.
//! No version, model or verdict: that is `run`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::gym::{self, GymRequest, Inventory};
use crate::plan::{Filters, Plan, Profile};
use crate::pyenv::PyEnv;
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
        },
    )?;
    print_summary(&run_dir, &outcome.telemetry);
    Ok(ExitCode::from(util::EXIT_APPROVED))
}

/// How to run a plan's cases (shared by `gym` and `run`).
pub struct GymSettings {
    pub agent_cmd: Vec<String>,
    pub jobs: usize,
    pub display_name: String,
    pub case_timeout_s: f64,
    pub seed: u64,
    pub defence: Option<String>,
    pub agent_env: Vec<(String, String)>,
    /// The daemon's stop switch and progress sink.
    pub control: Option<std::sync::Arc<gym::Control>>,
}

pub struct Executed {
    pub gym: gym::GymOutcome,
    pub telemetry: telemetry::Telemetry,
}

/// Claims the run directory for the plan, runs (or resumes) its cases, and writes the
/// telemetry.
pub fn execute(
    pyenv: &PyEnv,
    run_dir: &RunDir,
    plan: &Plan,
    inventory: &Inventory,
    settings: GymSettings,
) -> anyhow::Result<Executed> {
    run_dir.create()?;
    let plan_json = serde_json::json!({
        "name": plan.name,
        "source": plan.source,
        "hash": plan.hash,
        "benchmark_version": plan.benchmark_version,
        "agentdojo_version": inventory.agentdojo_version,
        "cases": plan.cases,
    });
    run_dir.claim_plan(&plan_json, &plan.hash)?;
    eprintln!("run directory: {}", run_dir.path.display());
    let request = GymRequest {
        run_dir: run_dir.path.canonicalize()?,
        benchmark_version: plan.benchmark_version.clone(),
        jobs: settings.jobs.max(1),
        agent_cmd: settings.agent_cmd,
        model_display_name: settings.display_name,
        case_timeout_s: settings.case_timeout_s,
        seed: settings.seed,
        defence: settings.defence,
        cases: plan.cases.clone(),
        done: Vec::new(),
    };
    let outcome = gym::run(pyenv, run_dir, request, &settings.agent_env, settings.control.as_deref())?;
    if outcome.skipped > 0 || !outcome.rerun.is_empty() {
        eprintln!("resumed: {} cases already recorded, {} run again", outcome.skipped, outcome.rerun.len());
    }
    let telemetry = telemetry::compute(&plan.benchmark_version, plan.cases.len(), &outcome.records);
    util::write_json_atomic(&run_dir.file("telemetry.json"), &telemetry)?;
    let title = format!("{} — plan {}", crate::root::run_id(&run_dir.path), plan.name);
    util::write_atomic(&run_dir.file("telemetry.md"), telemetry::markdown(&title, &telemetry).as_bytes())?;
    Ok(Executed { gym: outcome, telemetry })
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
    println!(
        "utility {}  utility under attack {}  ASR {}  injection-task utility {}  errors {}",
        show("utility"),
        show("utility_under_attack"),
        show("asr"),
        show("injection_task_utility"),
        telemetry.counts.errors
    );
    println!("{}", run_dir.path.display());
}
