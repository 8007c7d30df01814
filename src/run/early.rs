//! Early stop as the run carries it out: the user-task order (drawn once from the run's
//! seed and kept in `early_stop.json`, so a resumed run keeps it) and a sink on the
//! gym's events that asks `judge::early` again each time a user task's last case is
//! recorded, and asks the gym to drain once the verdict is decided. When a run may
//! stop is `judge::early`'s; this only watches and records.

use std::collections::HashMap;

use anyhow::bail;

use super::RunRequest;
use crate::case::{Case, CaseRecord};
use crate::gym::{Ask, Executed, GymEvent, Seen, Sink};
use crate::judge::early;
use crate::judge::families::Scope;
use crate::plan::Plan;
use crate::record::EarlyStop;
use crate::root::Root;
use crate::rundir::{RunDir, RunFile};
use crate::settings::thresholds::Thresholds;

/// The run directory's early-stop record (`early_stop.json`).
pub fn read(run_dir: &RunDir) -> anyhow::Result<Option<EarlyStop>> {
    run_dir.read_early_stop()
}

/// After a pass: stopped early when the gym left cases unstarted on the sink's word; a
/// full pass that recorded every case clears it.
pub fn settle(run_dir: &RunDir, plan: &Plan, executed: &Executed) -> anyhow::Result<()> {
    if let Some(mut early) = read(run_dir)? {
        early.stopped_early = executed.gym.not_started.is_some_and(|n| n > 0)
            || (early.stopped_early && executed.gym.records.len() < plan.cases.len());
        run_dir.write_early_stop(&early)?;
    }
    Ok(())
}

/// The dispatch order of an early-stopping pass and the sink that may end it. With a
/// reference, its complete run (made before this one starts, `reference`) gives R4's
/// sequential test the other side of each pair; none found, the run is never approved
/// early.
pub fn watch(
    run_dir: &RunDir,
    request: &RunRequest,
    seed: u64,
    root: &Root,
) -> anyhow::Result<(Vec<String>, Box<dyn Sink>)> {
    let plan = &request.plan;
    let early = match read(run_dir)? {
        Some(early) => {
            let mut drawn = early.order.clone();
            let mut planned = crate::order::user_task_order(&plan.cases, 0);
            drawn.sort();
            planned.sort();
            if drawn != planned {
                bail!("{}: its order is not this plan's user tasks", run_dir.path_of(RunFile::EarlyStop).display());
            }
            early
        }
        None => {
            let early =
                EarlyStop { seed, order: crate::order::user_task_order(&plan.cases, seed), stopped_early: false };
            run_dir.write_early_stop(&early)?;
            early
        }
    };
    let records: Vec<CaseRecord> = run_dir.read_cases_lenient()?.records.into_values().collect();
    // Cases left per user task, and of the injection-goal block (key ""): only the last
    // case of one can change what `decide` says.
    let mut remaining: HashMap<String, usize> = HashMap::new();
    for case in &plan.cases {
        if !records.iter().any(|r| r.case_id == case.id) {
            *remaining.entry(block(&case.suite, case.user_task.as_deref())).or_default() += 1;
        }
    }
    let sink = EarlyStopSink {
        cases: plan.cases.clone(),
        order: early.order.clone(),
        thresholds: plan.profile.rules.clone(),
        reference: request.reference_records(root)?,
        scope: crate::judge::families::scope(&request.attack_families(), &[]),
        records,
        remaining,
    };
    Ok((crate::order::dispatch_order(&plan.cases, &early.order), Box::new(sink)))
}

fn block(suite: &str, user_task: Option<&str>) -> String {
    user_task.map_or(String::new(), |u| crate::case::user_task_key(suite, u))
}

/// Asks `judge::early` at the pass's start and after each user task's last case.
struct EarlyStopSink {
    cases: Vec<Case>,
    order: Vec<String>,
    thresholds: Thresholds,
    /// The reference's records (deduplicated), when the version has one.
    reference: Option<Vec<CaseRecord>>,
    scope: Scope,
    records: Vec<CaseRecord>,
    remaining: HashMap<String, usize>,
}

impl EarlyStopSink {
    fn decided(&self) -> bool {
        let reference = self.reference.as_deref();
        early::decide(&self.cases, &self.order, &self.records, &self.thresholds, reference, &self.scope)
            .stop_at
            .is_some()
    }
}

impl Sink for EarlyStopSink {
    fn on(&mut self, event: &GymEvent, _: &Seen) -> anyhow::Result<Ask> {
        let look = match event {
            GymEvent::Start { .. } => true,
            GymEvent::Case { record } => {
                self.records.push((**record).clone());
                match self.remaining.get_mut(&block(&record.suite, record.user_task.as_deref())) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        *n == 0
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        Ok(if look && self.decided() { Ask::Drain } else { Ask::Continue })
    }
}
