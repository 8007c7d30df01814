//! `pruefstand start-night VERSION`: queues one night of the gym as a chain of two jobs
//! (docs/training.md, "The night as a loop"): first VERSION judged on `--plan` (its
//! fixed cases and, where the plan has one, the attacker's campaign); then a training
//! job that exports that run's rows (the families the plan does not hold out), trains
//! the next adapter from VERSION and judges it on `--judge-plan`. The second job waits
//! for the first and runs only on a valid verdict; a first job that fails, is cancelled
//! or is invalid stops the chain (the daemon fails the second job naming why, and the
//! hooks post it). Each job runs under a bench job's guards. When the chain ends, the
//! daemon writes its morning report under `reports/nights/<night>/`.
//!
//! Refused now, before anything is queued: a VERSION the trainer cannot start from, a
//! family the first plan trains on that the judge plan holds out (the chain would be
//! refused in the morning, after a night of cases).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::client::{note_without_daemon, print_end, say_progress, wait_final};
use crate::cmd::train::{Knobs, kind_parser};
use crate::train::{Order, checks};
use pruefstand_core::queue::{ChainLink, Prepared, Queue};
use pruefstand_core::root::Root;
use pruefstand_report::export::Format;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The version judged first and trained from: a model served from Docker out of a
    /// model folder, no adapter (e.g. real-smol).
    pub(crate) version: String,
    /// The plan VERSION is judged on; its run gives the rows. `nacht`, a plan name or a
    /// plan file.
    #[arg(long, default_value = "nacht")]
    pub(crate) plan: String,
    /// The plan the trained version is judged on. It must hold out no family the first
    /// plan trains on; what it holds out beyond them is what the gate tests unseen.
    #[arg(long)]
    pub(crate) judge_plan: String,
    /// What to train: DPO on preference pairs (the run against its reference run) or
    /// SFT on conversations.
    #[arg(long, value_parser = kind_parser, default_value = "dpo")]
    pub(crate) kind: Format,
    #[command(flatten)]
    pub(crate) knobs: Knobs,
    /// The trained version's name (default: <VERSION>-<kind>-night<first job's id>).
    #[arg(long, value_parser = crate::cmd::name_parser)]
    pub(crate) name: Option<String>,
    /// The night's name: its morning report's folder (default: <date>-<VERSION>, then
    /// -2, -3, … for the version's next nights that day). One no queued job carries.
    #[arg(long, value_parser = crate::cmd::name_parser)]
    pub(crate) night: Option<String>,
    /// A found family the night trains on as seen (pinned into the job's copy of
    /// --plan with `held_out = false`): a found-family.json, or a run (a run folder, a
    /// version name, job:N, latest) whose campaign wrote one; `none`: none. Default: the
    /// family the newest finished run of VERSION on --plan found, if its campaign found
    /// one, so each night trains on what the last night's attacker found.
    #[arg(long, value_name = "FILE|RUN|none")]
    pub(crate) found: Option<PathBuf>,
    /// Higher runs first; equal priorities run in the order queued.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub(crate) priority: i32,
    /// Wait for the chain's end and exit with the trained version's verdict code (0
    /// approved, 10 rejected, 11 inconclusive, 12 invalid, 2 failed or cancelled).
    #[arg(long)]
    pub(crate) wait: bool,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    crate::hooks::validate(&root)?;
    let queue = Queue::open(&root)?;
    let mut judged = queue.prepare(&root, &args.version, &args.plan)?;
    checks::base_usable(&judged.version)?;
    if let Some(file) = carried_found(&root, args.found.as_deref(), &args.version, &judged)? {
        let family = file.display().to_string();
        if judged.pin_found_as_seen(&file).with_context(|| format!("the found family {family}"))? {
            tracing::info!("the night trains on the found family of {family} as seen (pinned into its --plan)");
        }
    }
    let trained = queue.prepare(&root, &args.version, &args.judge_plan)?;
    let held_out: BTreeSet<String> = trained.held_out().into_iter().collect();
    let clash = judged.trained_on().intersection(&held_out).cloned().collect::<Vec<_>>();
    if !clash.is_empty() {
        bail!(
            "--plan {} trains on {} (it runs and does not hold out), which --judge-plan {} holds out: the \
             training would be refused after the night's run; hold it out in {} too, or judge on another plan",
            judged.profile.name,
            clash.join(", "),
            trained.profile.name,
            judged.profile.name
        );
    }
    let night = night_name(&queue, args.night.as_deref(), &args.version)?;
    let first = queue.enqueue(judged, args.priority, Some(ChainLink { night: night.clone(), after: None }))?;
    let name =
        args.name.clone().unwrap_or_else(|| format!("{}-{}-night{}", args.version, args.kind.as_str(), first.id));
    let order = Order {
        exports: Vec::new(),
        kind: Some(args.kind),
        hyper: args.knobs.hyper(),
        seed: args.knobs.seed,
        name: Some(name.clone()),
        rows_of: Some(first.id),
    };
    let link = ChainLink { night: night.clone(), after: Some(first.id) };
    let second = queue.enqueue_training(trained, args.priority, serde_json::to_value(order)?, &[], Some(link))?;
    outln!("{}", first.id);
    outln!("{}", second.id);
    tracing::info!(
        "queued night {night}: job {} judges {} on {}; then job {} trains {name} ({}) on its rows and judges it on {}",
        first.id,
        first.version,
        first.plan,
        second.id,
        args.kind.as_str(),
        second.plan
    );
    note_without_daemon(&root, &queue)?;
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let job = wait_final(&queue, second.id, say_progress)?;
    Ok(print_end(&job))
}

/// The night's name: `--night`, which no job of the queue may carry already (its
/// morning report would mix two nights), else `<date>-<VERSION>`, with `-2`, `-3`, …
/// for a second night of the version that day.
fn night_name(queue: &Queue, asked: Option<&str>, version: &str) -> anyhow::Result<String> {
    let taken: BTreeSet<String> = queue.list()?.into_iter().filter_map(|job| job.night).collect();
    if let Some(asked) = asked {
        if taken.contains(asked) {
            bail!("--night {asked}: the queue has jobs of that night already (`pruefstand queue`); name another");
        }
        return Ok(asked.to_string());
    }
    let base = format!("{}-{version}", chrono::Utc::now().format("%Y%m%d"));
    let name = (1..).map(|k| if k == 1 { base.clone() } else { format!("{base}-{k}") }).find(|n| !taken.contains(n));
    Ok(name.expect("an unused name"))
}

/// The found family `--found` names (see its help), or by default the one the newest
/// finished run of `version` on the plan found; None: nothing to carry.
fn carried_found(
    root: &Root,
    asked: Option<&std::path::Path>,
    version: &str,
    plan: &Prepared,
) -> anyhow::Result<Option<PathBuf>> {
    let run = match asked {
        Some(word) if word.as_os_str() == "none" => return Ok(None),
        Some(file) if file.is_file() => return Ok(Some(file.to_path_buf())),
        Some(word) => crate::cmd::runs::resolve(Some(&root.path), &[word.to_path_buf()])?.remove(0),
        None => match crate::cmd::runs::newest_on_plan(root, version, &plan.profile.name)? {
            Some(run) => run,
            None => return Ok(None),
        },
    };
    let file = pruefstand_store::RunDir::new(&run).found_family_file();
    if file.is_none() && asked.is_some() {
        bail!("--found {}: its campaign found no family (no found-family.json in it)", run.display());
    }
    Ok(file)
}
