//! `pruefstand start-training VERSION --export FILE…`: queues a training job — what
//! `pruefstand train` does, run by the daemon under the same guards as a bench job (the
//! GPU idle, no busy unit, never beside another job): the training, then the judgement
//! of the version it made on `--plan`, one job with one verdict and the hooks posting
//! it. What `train` refuses before a step (no rows, an export its manifest no longer
//! vouches for, rows of another base model, a family the plan holds out) is refused
//! here, and nothing is queued; the exports are pinned by sha256 until the job runs.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;

use crate::client::{note_without_daemon, print_end, say_progress, wait_final};
use crate::train::checks;
use pruefstand_core::queue::Queue;
use pruefstand_core::root::Root;

// `train`'s arguments are flattened in: the group of this struct's own would clash with
// theirs by name.
#[derive(clap::Args)]
#[group(skip)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) train: crate::cmd::train::Args,
    /// Higher runs first; equal priorities run in the order queued.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub(crate) priority: i32,
    /// Wait for the verdict and exit with its code (0 approved, 10 rejected, 11
    /// inconclusive, 12 invalid, 2 failed or cancelled).
    #[arg(long)]
    pub(crate) wait: bool,
}

pub(crate) fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let Args { train, priority, wait } = args;
    if train.no_judge || train.out.is_some() {
        bail!("a training job always judges what it made, into a run folder of its own: drop --no-judge and --out");
    }
    if train.online.is_some() {
        bail!("--online: an online training runs in `pruefstand train`, not yet as a queued job");
    }
    crate::cmd::train::online_knobs_left_alone(&train.online_knobs)?;
    let root = Root::find(root)?;
    crate::hooks::validate(&root)?;
    let queue = Queue::open(&root)?;
    let prepared = queue.prepare(&root, &train.version, &train.plan)?;
    // Refused now, as `train` would refuse before its first step.
    let model_path = checks::base_usable(&prepared.version)?;
    let checked =
        checks::check(&prepared.version, &model_path, &train.exports, train.kind, &train.plan, &prepared.profile)?;
    let mut inputs = Vec::new();
    for export in &checked.exports {
        inputs.push(export.path.clone());
        inputs.push(pruefstand_report::export::manifest_path(&export.path));
    }
    // The trained version's name is fixed now, so the job's run folder is its own.
    let mut order = crate::cmd::train::order(&train);
    let id = crate::train::id_of(&prepared.version, &checked, &order.hyper, order.seed);
    let name =
        order.name.get_or_insert_with(|| crate::train::default_name(&prepared.version, checked.kind, &id)).clone();
    let order = serde_json::to_value(order)?;
    let job = queue.enqueue_training(prepared, priority, order, &inputs, None)?;
    outln!("{}", job.id);
    tracing::info!(
        "queued training job {}: {name} from {} on {} row(s), judged on {} (priority {})",
        job.id,
        job.version,
        checked.rows(),
        job.plan,
        job.priority
    );
    note_without_daemon(&root, &queue)?;
    if !wait {
        return Ok(ExitCode::SUCCESS);
    }
    let job = wait_final(&queue, job.id, say_progress)?;
    Ok(print_end(&job))
}
