//! Early stop as the run carries it out: the user-task order (drawn once from the run's
//! seed and kept in `early_stop.json`, so a resumed run keeps it) and a sink on the
//! gym's events that asks `judge::early` again each time a user task's last case is
//! recorded, and asks the gym to stop once the verdict is decided: nothing new starts,
//! and the cases in flight end unrecorded (nothing they could record would change it). When a run may
//! stop is `judge::early`'s; this only watches and records.

use std::collections::{HashMap, HashSet};

use anyhow::bail;

use super::RunRequest;
use crate::gym::{Ask, GymEvent, Seen, Sink};
use pruefstand_core::case::{Case, CaseRecord};
use pruefstand_core::record::{AtDecision, EarlyStop};
use pruefstand_core::root::Root;
use pruefstand_core::settings::thresholds::Thresholds;
use pruefstand_judge::early;
use pruefstand_judge::families::Scope;
use pruefstand_store::{RunDir, RunFile};

/// The run directory's early-stop record (`early_stop.json`).
pub(crate) fn read(run_dir: &RunDir) -> anyhow::Result<Option<EarlyStop>> {
    run_dir.read_early_stop()
}

/// After a pass: stopped early when the gym left cases unstarted on the sink's word; a
/// full pass that recorded every case clears it. A stopped run's cases recorded after the
/// decision are its overrun. `planned`: the plan's cases; `recorded` and `not_started`:
/// the pass's. Returns the record as written (None: the run does not stop early), for
/// the run's record to take without reading it back.
pub(crate) fn settle(
    run_dir: &RunDir,
    planned: usize,
    recorded: usize,
    not_started: Option<usize>,
) -> anyhow::Result<Option<EarlyStop>> {
    // The sink wrote it at the decision, in the gym's pass: read as it left it.
    let Some(mut early) = read(run_dir)? else { return Ok(None) };
    early.stopped_early = not_started.is_some_and(|n| n > 0) || (early.stopped_early && recorded < planned);
    early.at_decision = if early.stopped_early { early.at_decision.map(|at| overrun(at, recorded)) } else { None };
    run_dir.write_early_stop(&early)?;
    Ok(Some(early))
}

/// What the records at the decision were: how many, and how many of them lie past the
/// `stop_at` user tasks of `order` the decision saw (the injection-goal cases count as
/// seen: an approval waits for them).
fn at_decision(cases: &[Case], order: &[String], stop_at: usize, records: &[CaseRecord]) -> AtDecision {
    let seen: HashSet<&str> = order[..stop_at.min(order.len())].iter().map(String::as_str).collect();
    let recorded: HashSet<&str> = records.iter().map(|r| r.case_id.as_str()).collect();
    let planned: Vec<&Case> = cases.iter().filter(|c| recorded.contains(c.id.as_str())).collect();
    let ahead = planned.iter().filter(|c| c.user_task_key().is_some_and(|k| !seen.contains(k.as_str()))).count();
    AtDecision { cases: planned.len(), ahead, overrun: 0 }
}

/// `at` with its overrun: the cases recorded by the pass's end (`recorded`, the run's
/// whole count) that were not yet recorded at the decision.
fn overrun(at: AtDecision, recorded: usize) -> AtDecision {
    AtDecision { overrun: recorded.saturating_sub(at.cases), ..at }
}

/// The dispatch order of an early-stopping pass and the sink that may end it. With a
/// reference, its complete run (made before this one starts, `reference`) gives R4's
/// sequential test the other side of each pair; none found, the run is never approved
/// early.
pub(crate) fn watch(
    run_dir: &RunDir,
    request: &RunRequest,
    seed: u64,
    root: &Root,
) -> anyhow::Result<(Vec<String>, Box<dyn Sink>)> {
    let plan = &request.plan;
    let early = match read(run_dir)? {
        Some(early) => {
            let mut drawn = early.order.clone();
            let mut planned = pruefstand_core::order::user_task_order(&plan.cases, 0);
            drawn.sort();
            planned.sort();
            if drawn != planned {
                bail!("{}: its order is not this plan's user tasks", run_dir.shown(RunFile::EarlyStop));
            }
            early
        }
        None => {
            let early = EarlyStop {
                seed,
                order: pruefstand_core::order::user_task_order(&plan.cases, seed),
                stopped_early: false,
                at_decision: None,
            };
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
        run_dir: run_dir.clone(),
        // A pass decides afresh: one resumed after a stop decides again at its start.
        early: EarlyStop { at_decision: None, ..early.clone() },
        cases: plan.cases.clone(),
        order: early.order.clone(),
        thresholds: plan.profile.rules.clone(),
        reference: request.reference_records(root)?,
        scope: pruefstand_judge::families::scope(&request.attack_families(Vec::new()), &[]),
        records,
        remaining,
    };
    Ok((pruefstand_core::order::dispatch_order(&plan.cases, &early.order), Box::new(sink)))
}

fn block(suite: &str, user_task: Option<&str>) -> String {
    user_task.map_or(String::new(), |u| pruefstand_core::case::user_task_key(suite, u))
}

/// Asks `judge::early` at the pass's start and after each user task's last case.
struct EarlyStopSink {
    run_dir: RunDir,
    /// The run's `early_stop.json`, written again with [`AtDecision`] at the decision.
    early: EarlyStop,
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
    /// The user tasks of the order the decision saw, once the records decide.
    fn decided(&self) -> Option<usize> {
        let reference = self.reference.as_deref();
        early::decide(&self.cases, &self.order, &self.records, &self.thresholds, reference, &self.scope).stop_at
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
        if !look || self.early.at_decision.is_some() {
            return Ok(Ask::Continue);
        }
        Ok(match self.decided() {
            Some(stop_at) => {
                // What has been run by now, kept so that `settle` can count what
                // finishes after.
                self.early.at_decision = Some(at_decision(&self.cases, &self.order, stop_at, &self.records));
                self.run_dir.write_early_stop(&self.early)?;
                Ask::Stop
            }
            None => Ask::Continue,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pruefstand_core::order::{dispatch_order, test_plan, user_task_order};
    use pruefstand_judge::early::decide;

    /// A sink over `cases` in a fresh run directory, nothing recorded yet, no reference.
    fn sink(cases: &[Case], order: &[String], dir: &std::path::Path) -> EarlyStopSink {
        let mut remaining: HashMap<String, usize> = HashMap::new();
        for case in cases {
            *remaining.entry(block(&case.suite, case.user_task.as_deref())).or_default() += 1;
        }
        let early = EarlyStop { seed: 1, order: order.to_vec(), stopped_early: false, at_decision: None };
        EarlyStopSink {
            run_dir: RunDir::new(dir),
            early,
            cases: cases.to_vec(),
            order: order.to_vec(),
            thresholds: Thresholds::default(),
            reference: None,
            scope: Scope::all(),
            records: Vec::new(),
            remaining,
        }
    }

    /// Feeds the records of `ids` (every case clean and resisted) until the sink asks
    /// to drain; returns how many it took.
    fn feed_until_drain(sink: &mut EarlyStopSink, cases: &[Case], ids: &[String]) -> Option<usize> {
        let seen = Seen::default();
        for (n, id) in ids.iter().enumerate() {
            let case = cases.iter().find(|c| &c.id == id).unwrap();
            let security = (case.kind == pruefstand_core::case::CaseKind::Attacked).then_some(false);
            let record = Box::new(CaseRecord::of(case, Some(true), security));
            if sink.on(&GymEvent::Case { record }, &seen).unwrap() == Ask::Stop {
                return Some(n + 1);
            }
        }
        None
    }

    /// Cases finishing in the drawn order: the decision comes at the last case of the
    /// user task that decides, nothing ran ahead, and what finishes after it (the cases
    /// that were in flight) is the overrun.
    #[test]
    fn the_decision_records_what_had_run_and_the_pass_counts_what_finished_after() {
        let cases = test_plan(80, 4);
        let order = user_task_order(&cases, 3);
        let dir = tempfile::tempdir().unwrap();
        let mut sink = sink(&cases, &order, dir.path());
        let ids = dispatch_order(&cases, &order);
        let n = feed_until_drain(&mut sink, &cases, &ids).expect("a clean version is decided");
        let stop_at = decide(&cases, &order, &sink.records, &Thresholds::default(), None, &Scope::all())
            .stop_at
            .expect("decided");
        // Whole user tasks of five cases and the four goal cases, in the drawn order.
        assert_eq!(n, 5 * stop_at + 4);
        let written = RunDir::new(dir.path()).read_early_stop().unwrap().expect("early_stop.json written");
        let at = written.at_decision.expect("the decision is kept");
        assert_eq!(at, AtDecision { cases: n, ahead: 0, overrun: 0 });
        // Eight cases were in flight and finish after the decision.
        assert_eq!(overrun(at, n + 8).overrun, 8);
        assert_eq!(overrun(at, n).overrun, 0);
        // The sink decides once: later records ask nothing more.
        assert_eq!(feed_until_drain(&mut sink, &cases, &ids[n..]), None);
    }

    /// One slow case of the first user task, finishing 20 cases after the decision would
    /// have come: the user tasks after it finish meanwhile and count only once it is
    /// recorded, so the decision comes at the same user task but later in cases, and
    /// what finished past the user tasks it saw is counted as ahead.
    #[test]
    fn cases_that_finish_past_a_slow_one_are_counted_ahead_of_the_decision() {
        let cases = test_plan(80, 4);
        let order = user_task_order(&cases, 3);
        let mut ids = dispatch_order(&cases, &order);
        let dir = tempfile::tempdir().unwrap();
        let in_order = feed_until_drain(&mut sink(&cases, &order, dir.path()), &cases, &ids).unwrap();
        let slow = ids.remove(4);
        ids.insert(in_order + 20, slow);
        let dir = tempfile::tempdir().unwrap();
        let mut held = sink(&cases, &order, dir.path());
        let n = feed_until_drain(&mut held, &cases, &ids).unwrap();
        assert_eq!(n, in_order + 21);
        let at = RunDir::new(dir.path()).read_early_stop().unwrap().unwrap().at_decision.unwrap();
        assert_eq!(at, AtDecision { cases: n, ahead: 21, overrun: 0 });
        let stop_at = decide(&cases, &order, &held.records, &Thresholds::default(), None, &Scope::all()).stop_at;
        assert_eq!(stop_at.map(|k| 5 * k + 4), Some(in_order));
    }
}
