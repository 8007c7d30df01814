//! `pruefstand train VERSION --export FILE…`: trains a LoRA adapter on the bench's
//! exports from VERSION's model (`train`: the refusals, the trainer in the model's
//! image, the adapter, its manifest and the new version's spec), then judges the new
//! version on the plan as `pruefstand run NEW --plan PLAN` does, unless `--no-judge`.
//! With `--online PLAN` instead of exports it trains with GRPO in the environment of
//! PLAN (`train::online`) and judges the same way.
//! The exit status is the verdict's, or 0 with `--no-judge`; 2 when it refused or could
//! not train (the message says why; the same command resumes a training that was
//! stopped).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::train::{self, Order, request::Hyper};
use pruefstand_core::root::Root;
use pruefstand_core::spec::Version;
use pruefstand_report::export::Format;
use pruefstand_store::benchlock;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The base version: a model served from Docker out of a model folder, no adapter
    /// (e.g. real-smol).
    pub(crate) version: String,
    /// An export of `pruefstand export` (its manifest beside it); give it once per file.
    #[arg(long = "export", value_name = "FILE", required_unless_present = "online")]
    pub(crate) exports: Vec<PathBuf>,
    /// Train online instead: GRPO in the environment of this plan (its cases, clean and
    /// attacked, played through the gym; the adapter of each step loaded into the
    /// running server for the next rollouts). docs/training.md.
    #[arg(long, value_name = "PLAN", conflicts_with_all = ["exports", "kind", "check_only"])]
    pub(crate) online: Option<String>,
    #[command(flatten)]
    pub(crate) online_knobs: OnlineKnobs,
    /// What to train: DPO on preference pairs or SFT on conversations (default: the
    /// exports' format).
    #[arg(long, value_parser = kind_parser)]
    pub(crate) kind: Option<Format>,
    #[command(flatten)]
    pub(crate) knobs: Knobs,
    /// The new version's name (default: <VERSION>-<kind>-<training id>).
    #[arg(long, value_parser = crate::cmd::name_parser)]
    pub(crate) name: Option<String>,
    /// The plan the new version is judged on; an export holding a family it holds out
    /// is refused. `schnell`, `voll` or a plan file.
    #[arg(long, default_value = "schnell")]
    pub(crate) plan: String,
    /// Train and write the spec, but do not run the new version.
    #[arg(long)]
    pub(crate) no_judge: bool,
    /// Check the rows and stop before the first step: the refusals, then every row
    /// rendered with the served chat template and its tools and matched token for token
    /// against VERSION's running server (`/tokenize`).
    #[arg(long, conflicts_with_all = ["no_judge", "out"])]
    pub(crate) check_only: bool,
    /// The judging run's directory; an existing one of the same plan is resumed (an
    /// interrupted judgement says the command with it).
    #[arg(long, conflicts_with = "no_judge")]
    pub(crate) out: Option<PathBuf>,
}

/// The training's knobs: its hyperparameters and seed (`train`, `start-training` and
/// `start-night` take the same).
#[derive(clap::Args, Clone, Debug)]
#[group(skip)]
pub(crate) struct Knobs {
    /// Optimizer steps.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) steps: u32,
    /// The trainer's seed (same rows, same seed: the same adapter bytes).
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    #[arg(long, default_value_t = 5e-5, value_parser = positive)]
    pub(crate) learning_rate: f64,
    /// The LoRA's rank.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) lora_r: u32,
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) lora_alpha: u32,
    /// Tokens of a row the trainer takes: a longer SFT conversation is cut, a DPO row
    /// whose prompt alone is longer is left out (AgentDojo's rows are 2,000–2,400).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(16..=131_072))]
    pub(crate) max_length: u32,
    /// DPO's beta.
    #[arg(long, default_value_t = 0.1, value_parser = positive)]
    pub(crate) beta: f64,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) batch_size: u32,
}

/// `--online`'s knobs.
#[derive(clap::Args, Clone, Debug, PartialEq)]
#[group(skip)]
pub(crate) struct OnlineKnobs {
    /// Completions of a case per step (a GRPO group).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=256))]
    pub(crate) generations: u32,
    /// Cases a step takes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) prompts_per_step: u32,
    /// Tokens of each first turn the trainer generates.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub(crate) completion_tokens: u32,
    /// The sampling temperature of the first turns.
    #[arg(long, default_value_t = 1.0, value_parser = positive)]
    pub(crate) temperature: f64,
    /// Text every first turn begins with, given rather than generated (e.g. the start of
    /// a tool call, for a model that never calls one); none by default.
    #[arg(long, default_value = "")]
    pub(crate) first_turn_prefix: String,
    /// The policy's turns after the first, answered by the server under the latest
    /// adapter (then the case ends and is scored).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub(crate) max_turns: u32,
    /// Tokens of each later turn.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub(crate) turn_tokens: u32,
    /// A case of the environment to train on (its id; once per case); default: all.
    #[arg(long = "case", value_name = "ID")]
    pub(crate) cases: Vec<String>,
}

impl OnlineKnobs {
    /// The knobs as given no flag: the defaults above, from clap itself.
    fn default_values() -> OnlineKnobs {
        #[derive(clap::Parser)]
        struct Bare {
            #[command(flatten)]
            knobs: OnlineKnobs,
        }
        <Bare as clap::Parser>::parse_from(["train"]).knobs
    }

    fn online(&self) -> train::online::Online {
        train::online::Online {
            generations: self.generations,
            prompts_per_step: self.prompts_per_step,
            completion_tokens: self.completion_tokens,
            temperature: self.temperature,
            first_turn_prefix: self.first_turn_prefix.clone(),
            max_turns: self.max_turns,
            turn_tokens: self.turn_tokens,
            cases: self.cases.clone(),
        }
    }
}

impl Knobs {
    pub(crate) fn hyper(&self) -> Hyper {
        Hyper {
            steps: self.steps,
            learning_rate: self.learning_rate,
            lora_r: self.lora_r,
            lora_alpha: self.lora_alpha,
            max_length: self.max_length,
            beta: self.beta,
            batch_size: self.batch_size,
        }
    }

    /// The knobs as given no flag: the defaults above, from clap itself.
    fn default_values() -> Knobs {
        #[derive(clap::Parser)]
        struct Bare {
            #[command(flatten)]
            knobs: Knobs,
        }
        <Bare as clap::Parser>::parse_from(["train"]).knobs
    }
}

pub(super) fn kind_parser(text: &str) -> Result<Format, String> {
    match text {
        "dpo" => Ok(Format::Dpo),
        "sft" => Ok(Format::Sft),
        _ => Err(format!("{text:?}: dpo or sft")),
    }
}

fn positive(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 10.0 => Ok(v),
        _ => Err(format!("{text:?} is not a number above 0 and at most 10")),
    }
}

/// What to train, as the arguments say it (`start-training` queues the same).
pub(crate) fn order(args: &Args) -> Order {
    Order {
        exports: args.exports.clone(),
        kind: args.kind,
        hyper: args.knobs.hyper(),
        seed: args.knobs.seed,
        name: args.name.clone(),
        rows_of: None,
    }
}

pub(crate) async fn main(root: Option<PathBuf>, args: Args) -> anyhow::Result<ExitCode> {
    let root = Root::find(root)?;
    let base = Version::load(&root.versions(), &args.version)?;
    if let Some(env_plan) = args.online.clone() {
        offline_knobs_left_alone(&args.knobs)?;
        return online(root, base, env_plan, args).await;
    }
    online_knobs_left_alone(&args.online_knobs)?;
    let ask = order(&args).ask(base, args.plan.clone());
    let trained = {
        // The trainer takes the GPU as a run does: one user of it at a time.
        let _gpu = match benchlock::needs_gpu(&ask.base)? {
            true => {
                let holder = format!("`pruefstand train {}`, pid {}", ask.base.name, std::process::id());
                Some(crate::lock_wait::bench_lock(&root, &holder).await?)
            }
            false => None,
        };
        if args.check_only {
            let checked = train::check_rows(&root, ask, stopped()).await?;
            outln!(
                "checked: {} row(s), {} tokens, each as the server tokenizes it (/tokenize); no step trained",
                checked.rows,
                checked.tokens
            );
            outln!("  log: {}", checked.dir.log().display());
            return Ok(ExitCode::SUCCESS);
        }
        train::train(&root, ask, stopped()).await?
    };
    let m = &trained.manifest;
    outln!("trained: {}{}", trained.version, if trained.reused { " (the adapter of an earlier run)" } else { "" });
    outln!("  adapter: {}", m.adapter.path.display());
    outln!("  manifest: {}", trained.dir.manifest().display());
    outln!("  spec: {}", trained.spec.display());
    outln!(
        "  {} step(s) on {} of {} row(s); loss {}",
        m.steps,
        m.rows_used,
        m.rows,
        m.losses
            .iter()
            .map(|l| l.map_or_else(|| "–".to_string(), |l| format!("{l:.4}")))
            .collect::<Vec<_>>()
            .join(" → ")
    );
    judge(root, trained.version, args).await
}

/// `--online`'s knobs, given to a training on exports, would be silently ignored.
pub(crate) fn online_knobs_left_alone(knobs: &OnlineKnobs) -> anyhow::Result<()> {
    anyhow::ensure!(
        *knobs == OnlineKnobs::default_values(),
        "--generations, --prompts-per-step, --completion-tokens, --temperature, --first-turn-prefix, --max-turns, \
         --turn-tokens and --case are --online's: an export trains without them"
    );
    Ok(())
}

/// GRPO takes no DPO beta (it trains with beta 0), no row length (its prompts are the
/// cases' first turns) and no batch size (a step is its groups): given with
/// `--online`, they would be silently ignored, so they are refused.
fn offline_knobs_left_alone(knobs: &Knobs) -> anyhow::Result<()> {
    let defaults = Knobs::default_values();
    let ignored: Vec<&str> = [
        ("--beta", knobs.beta != defaults.beta),
        ("--max-length", knobs.max_length != defaults.max_length),
        ("--batch-size", knobs.batch_size != defaults.batch_size),
    ]
    .into_iter()
    .filter_map(|(flag, set)| set.then_some(flag))
    .collect();
    anyhow::ensure!(
        ignored.is_empty(),
        "{} {} not apply to --online (GRPO trains with beta 0, on the cases' first turns, a step being its \
         groups: --generations, --prompts-per-step, --completion-tokens)",
        ignored.join(", "),
        if ignored.len() == 1 { "does" } else { "do" }
    );
    Ok(())
}

/// The judgement would refuse an adapter trained online on a family its plan holds
/// out: said before the training, not after it.
fn judge_plan_holds_out_nothing_offered(root: &Root, version: &str, env_plan: &str, plan: &str) -> anyhow::Result<()> {
    let queue = pruefstand_core::queue::Queue::open(root)?;
    let offered = queue.prepare(root, version, env_plan)?;
    let judged = queue.prepare(root, version, plan)?;
    let held_out: std::collections::BTreeSet<String> = judged.held_out().into_iter().collect();
    let clash: Vec<String> = offered.trained_on().intersection(&held_out).cloned().collect();
    anyhow::ensure!(
        clash.is_empty(),
        "--online {} offers {} (it runs and does not hold out), which --plan {} holds out: the judgement would \
         refuse the adapter after its training; hold it out in {} too, or judge on another plan",
        offered.profile.name,
        clash.join(", "),
        judged.profile.name,
        offered.profile.name
    );
    Ok(())
}

/// `train --online`: GRPO in the environment of `env_plan`, then the judgement.
async fn online(root: Root, base: Version, env_plan: String, args: Args) -> anyhow::Result<ExitCode> {
    judge_plan_holds_out_nothing_offered(&root, &args.version, &env_plan, &args.plan)?;
    let ask = train::online::Ask {
        base,
        env_plan,
        hyper: args.knobs.hyper(),
        seed: args.knobs.seed,
        name: args.name.clone(),
        online: args.online_knobs.online(),
    };
    let trained = {
        let _gpu = match benchlock::needs_gpu(&ask.base)? {
            true => {
                let holder = format!("`pruefstand train {}`, pid {}", ask.base.name, std::process::id());
                Some(crate::lock_wait::bench_lock(&root, &holder).await?)
            }
            false => None,
        };
        train::online::train(&root, ask, stopped()).await?
    };
    let m = &trained.manifest;
    outln!(
        "trained online: {}{}",
        trained.version,
        if trained.reused { " (the adapter of an earlier run)" } else { "" }
    );
    outln!("  adapter: {}", m.adapter.path.display());
    outln!("  manifest: {}", trained.dir.path.join(train::online::MANIFEST).display());
    outln!("  environment: {} ({} case(s))", m.environment.manifest.display(), m.environment.cases);
    outln!("  spec: {}", trained.spec.display());
    let spread: Vec<String> = m.reward_spread.iter().map(|s| format!("{s:.3}")).collect();
    outln!(
        "  {} step(s): {} rollout(s), {} errored (no reward), reward spread per step {}; {} adapter(s) loaded into the server",
        m.steps,
        m.rollouts,
        m.rollout_errors,
        spread.join(", "),
        m.adapters_loaded.len()
    );
    judge(root, trained.version, args).await
}

/// Resolves on Ctrl-C or SIGTERM: the trainer's container is removed, its checkpoints
/// stay.
async fn stopped() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(term) => {
                term.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

/// The trained version judged on `--plan` as `pruefstand run` judges it (exit: its
/// verdict's), unless `--no-judge`.
async fn judge(root: Root, version: String, args: Args) -> anyhow::Result<ExitCode> {
    if args.no_judge {
        return Ok(ExitCode::SUCCESS);
    }
    let run = crate::cmd::run::Args {
        version,
        plan: args.plan,
        jobs: None,
        out: args.out,
        full: false,
        no_wait: false,
        json: false,
    };
    crate::cmd::run::main(Some(root.path), run).await
}
