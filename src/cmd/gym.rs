//! `pruefstand gym`: run a plan's cases against any agent command that speaks the
//! JSON-line protocol, and write a run directory with `cases.jsonl` and telemetry.
//! No version, model or verdict: that is `run`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;

use crate::run::{AgentOnly, Extent, ReferencePolicy, RunControl, RunRequest, Session};
use pruefstand_core::plan::Filters;
use pruefstand_core::root::Root;
use pruefstand_core::spec::Version;
use pruefstand_core::{family, telemetry, util};
use pruefstand_store::RunDir;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// `schnell`, `voll` (from the root's profiles/) or a plan file.
    #[arg(long, default_value = "schnell")]
    pub(crate) plan: String,
    /// The agent under test, e.g. "python3 scripts/examples/agent_counter.py". Split
    /// like a shell would split words, but no shell runs it.
    #[arg(long, required_unless_present = "dataset")]
    pub(crate) agent_cmd: Option<String>,
    /// Only these suites (repeatable).
    #[arg(long = "suite")]
    pub(crate) suites: Vec<String>,
    /// Only these user tasks (repeatable).
    #[arg(long = "user-task")]
    pub(crate) user_tasks: Vec<String>,
    /// Only these injection tasks (repeatable).
    #[arg(long = "injection-task")]
    pub(crate) injection_tasks: Vec<String>,
    /// Only these attacks (repeatable; `none` selects clean cases).
    #[arg(long = "attack")]
    pub(crate) attacks: Vec<String>,
    /// Cases in flight at once (default: the plan's `jobs`).
    #[arg(long, value_parser = crate::cmd::jobs_parser)]
    pub(crate) jobs: Option<usize>,
    /// The run directory itself; an existing one with the same cases is resumed.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
    /// Names the run's folder under reports/.
    #[arg(long, default_value = "gym", value_parser = crate::cmd::name_parser)]
    pub(crate) name: String,
    /// Model name the important_instructions attacks address the model by.
    #[arg(long, default_value = "Local model")]
    pub(crate) display_name: String,
    /// Per-case wall-time limit in seconds (default: the plan's; at most a day).
    #[arg(long, value_parser = case_timeout_parser)]
    pub(crate) case_timeout: Option<f64>,
    /// The order cases start in: `grouped` (the gym's own: a user task's cases together,
    /// longest first, so the model server's prefix cache holds what they share) or
    /// `shuffled` (drawn from the run's seed: the baseline to measure that against).
    #[arg(long, value_enum, default_value = "grouped")]
    pub(crate) order: Order,
    /// Pass this variable of pruefstand's environment on to the agent (repeatable), e.g.
    /// PRUEFSTAND_API_KEY for a server that wants a key. Agents get a minimal
    /// environment otherwise; a variable that is not set is an error.
    #[arg(long = "pass-env", value_name = "NAME")]
    pub(crate) pass_env: Vec<String>,
    /// Run nothing: print the plan's cases as the gym would be handed them, as one JSON
    /// object — each case with its attack family, the wording drawn from `--seed`, the
    /// found families' templates, the families the plan holds out. The training
    /// environment's dataset (scripts/pruefstand_env, docs/training.md).
    #[arg(long, conflicts_with_all = ["out", "jobs", "order", "pass_env", "case_timeout"])]
    pub(crate) dataset: bool,
    /// The seed `--dataset` draws the per-run wording from (a run's own is in its
    /// `identity.json`).
    #[arg(long, requires = "dataset", default_value_t = 0)]
    pub(crate) seed: u64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    Grouped,
    Shuffled,
}

pub(crate) async fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let given = args.agent_cmd.clone().unwrap_or_else(|| "-".to_string());
    let agent_cmd = shlex::split(&given)
        .filter(|argv| !argv.is_empty())
        .with_context(|| format!("--agent-cmd {given:?} is empty or has unbalanced quotes"))?;
    let filters = Filters {
        suites: args.suites,
        user_tasks: args.user_tasks,
        injection_tasks: args.injection_tasks,
        attacks: args.attacks,
    };
    // A gym run's version is its name and agent, in place of a spec.
    let version = Version::of_agent_command(&args.name, agent_cmd, &args.display_name)?;
    let control = Arc::new(RunControl::default());
    let session = Session::open(root, control.clone()).await?;
    let request = RunRequest::builder(&session, version, &args.plan)
        .filters(filters)
        .reference(ReferencePolicy::Skip)
        .extent(Extent::Full)
        .jobs(args.jobs)
        .out(args.out)
        .resolve()
        .await?;
    if args.dataset {
        outln!("{}", serde_json::to_string(&dataset(request.plan(), args.seed))?);
        return Ok(ExitCode::SUCCESS);
    }
    let agent_env = args
        .pass_env
        .iter()
        .map(|name| match std::env::var(name) {
            Ok(value) => Ok((name.clone(), value)),
            Err(_) => Err(anyhow::anyhow!("--pass-env {name}: {name} is not set (or not UTF-8) in this environment")),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let executor = AgentOnly { shuffled: args.order == Order::Shuffled, case_timeout_s: args.case_timeout, agent_env };
    // Ctrl-C stops the gym; finished cases stay for --out to resume.
    let signals = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            control.stop();
        }
    });
    let executed = session.execute(&request, &executor).await;
    signals.abort();
    let (run_dir, executed, _) = executed?;
    print_summary(&run_dir, &executed.telemetry);
    Ok(ExitCode::from(util::EXIT_APPROVED))
}

/// `--dataset`: the resolved plan's cases as the gym's request would carry them, each
/// with its family ([`family::name_of_attack`]: a found family's is its attack), and
/// what the plan holds out; the environment leaves the held-out ones out itself.
fn dataset(plan: &pruefstand_core::plan::Plan, seed: u64) -> serde_json::Value {
    let cases: Vec<serde_json::Value> = plan
        .cases
        .iter()
        .map(|case| {
            let mut value = serde_json::to_value(case).expect("a case serializes");
            value["family"] = case.attack.as_deref().and_then(family::name_of_attack).into();
            value
        })
        .collect();
    serde_json::json!({
        "plan": plan.name,
        "plan_file": plan.source,
        "plan_hash": plan.hash,
        "benchmark_version": plan.benchmark_version,
        "case_timeout_s": plan.case_timeout_s,
        "jobs": plan.jobs,
        "seed": seed,
        "held_out": plan.held_out,
        "cases": cases,
        "wording": family::wordings(&plan.cases, seed),
        "templates": crate::gym::found_templates(plan),
    })
}

fn case_timeout_parser(text: &str) -> Result<f64, String> {
    let seconds: f64 = text.parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 86_400.0) {
        return Err(format!("{seconds} is not a number of seconds in (0, 86400]"));
    }
    Ok(seconds)
}

fn print_summary(run_dir: &RunDir, telemetry: &telemetry::Telemetry) {
    outln!("{}", crate::client::headline(telemetry));
    outln!("model format health: {}", telemetry.format_health.line(telemetry.counts.recorded));
    outln!("{}", run_dir.path().display());
}
