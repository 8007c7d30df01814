//! The adaptive attacker (docs/attacks.md): after a plan's fixed cases, for each planned
//! (user task, injection task) pair of its `[adaptive]` section, up to K attempts against
//! the version itself, each worded from the family grammars — the first a fresh draw,
//! later ones mutations and recombinations of wordings that landed on any pair ("keep
//! what lands"). A pair is broken once an attempt lands. Rounds run through the gym in
//! `<run>/adaptive/`, apart from the plan's cases; the search log is `adaptive.json`.
//!
//! Every choice is a hash of the run's seed, the pair and the attempt, and depends only
//! on earlier rounds' outcomes: a resumed run redraws the same words and skips recorded
//! attempts, and the log replays exactly. The log's records are `record`'s
//! ([`SearchLog`]); judging the result is `judge`'s.

use std::collections::BTreeMap;

use crate::gym::{self, GymSettings};
use crate::runtime;
use pruefstand_core::case::Case;
use pruefstand_core::family;
use pruefstand_core::inventory::Inventory;
use pruefstand_core::plan::{Adaptive, Plan};
use pruefstand_core::record::{Attempt, Choices, How, PairLog, SearchLog, Wording};
use pruefstand_gym::pyenv::PyEnv;
use pruefstand_store::RunDir;

// The search's steps on its log: the log is plain data (`record`), how it grows is
// this module's.

fn pair_key(pair: &PairLog) -> String {
    format!("{}/{}/{}", pair.suite, pair.user_task, pair.injection_task)
}

/// An empty log for the plan's pairs.
fn new_log(seed: u64, adaptive: &Adaptive) -> SearchLog {
    let pairs = adaptive
        .pairs
        .iter()
        .map(|(suite, user_task, injection_task)| PairLog {
            suite: suite.clone(),
            user_task: user_task.clone(),
            injection_task: injection_task.clone(),
            attempts: Vec::new(),
        })
        .collect();
    SearchLog { seed, attempts: adaptive.attempts, families: adaptive.families.clone(), pairs }
}

/// Wordings that landed, in the order they were found (round, then pair).
fn pool(log: &SearchLog, before_round: usize) -> Vec<&Wording> {
    (0..before_round)
        .flat_map(|k| log.pairs.iter().filter_map(move |p| p.attempts.get(k)))
        .filter(|a| a.landed == Some(true))
        .map(|a| &a.wording)
        .collect()
}

/// The attempts of round `k` (0-based): one for each pair not yet broken.
pub fn plan_round(log: &mut SearchLog, k: usize) -> Vec<(Case, Wording)> {
    let landed: Vec<Wording> = pool(log, k).into_iter().cloned().collect();
    let mut out = Vec::new();
    for pair in log.pairs.iter_mut().filter(|p| p.attempts.len() == k && !p.broken()) {
        let tried: Vec<&Wording> = pair.attempts.iter().map(|a| &a.wording).collect();
        let (wording, how) = next(log.seed, &pair_key(pair), k, &log.families, &landed, &tried);
        let case = Case::attacked(&pair.suite, &pair.user_task, &pair.injection_task, &format!("adaptive_{}", k + 1));
        pair.attempts.push(Attempt { case_id: case.id.clone(), wording: wording.clone(), how, landed: None });
        out.push((case, wording));
    }
    out
}

/// Records the outcomes of a round by case id.
pub fn record(log: &mut SearchLog, outcomes: &BTreeMap<String, Option<bool>>) {
    for attempt in log.pairs.iter_mut().flat_map(|p| p.attempts.iter_mut()) {
        if let Some(landed) = outcomes.get(&attempt.case_id) {
            attempt.landed = *landed;
        }
    }
}

/// The wording of attempt `k` of a pair: mutate or recombine what landed, else a fresh
/// draw from the next family in the pair's own rotation; never one the pair tried.
fn next(seed: u64, pair: &str, k: usize, families: &[String], pool: &[Wording], tried: &[&Wording]) -> (Wording, How) {
    let key = |purpose: &str| format!("pruefstand-adaptive/1:{seed}:{pair}:{k}:{purpose}");
    let fresh = |salt: usize| {
        let start = family::pick(&key("rotation"), families.len());
        let name = &families[(start + k + salt) % families.len()];
        let f = family::family(name).expect("plan checked the family");
        let mut choices: Choices = [0; 5];
        for (i, options) in f.slots().iter().enumerate() {
            choices[i] = family::pick(&key(&format!("fresh:{salt}:{i}")), options.len());
        }
        Wording { family: name.clone(), choices }
    };
    let candidate = if pool.is_empty() {
        (fresh(0), How::Fresh)
    } else {
        let parent = &pool[family::pick(&key("parent"), pool.len())];
        let f = family::family(&parent.family).expect("pool holds grammar families");
        let mates: Vec<&Wording> = pool.iter().filter(|w| w.family == parent.family && *w != parent).collect();
        if !mates.is_empty() && family::pick(&key("mode"), 2) == 1 {
            let mate = mates[family::pick(&key("mate"), mates.len())];
            let mut choices = parent.choices;
            for (i, choice) in choices.iter_mut().enumerate() {
                if family::pick(&key(&format!("cross:{i}")), 2) == 1 {
                    *choice = mate.choices[i];
                }
            }
            (Wording { family: parent.family.clone(), choices }, How::Recombined)
        } else {
            let slot = family::pick(&key("slot"), 5);
            let mut choices = parent.choices;
            choices[slot] = family::pick(&key("option"), f.slots()[slot].len());
            (Wording { family: parent.family.clone(), choices }, How::Mutated)
        }
    };
    if !tried.contains(&&candidate.0) {
        return candidate;
    }
    // Already tried here: the first fresh draw the pair has not seen.
    (0..families.len() * 4).map(fresh).find(|w| !tried.contains(&w)).map_or(candidate, |w| (w, How::Fresh))
}

/// Runs the search round by round through the gym, one `settings` per round, and
/// writes the log after each; a resumed run skips recorded attempts.
pub async fn search(
    pyenv: &PyEnv,
    run_dir: &RunDir,
    plan: &Plan,
    inventory: &Inventory,
    seed: u64,
    rounds: Vec<GymSettings>,
) -> anyhow::Result<SearchLog> {
    let adaptive = plan.adaptive.as_ref().expect("the plan has an [adaptive] section");
    let mut log = new_log(seed, adaptive);
    let dir = run_dir.adaptive_runs();
    std::fs::create_dir_all(&dir.path)?;
    let mut cases: Vec<Case> = Vec::new();
    for (k, mut settings) in rounds.into_iter().enumerate().take(adaptive.attempts) {
        let round = plan_round(&mut log, k);
        if round.is_empty() {
            break;
        }
        tracing::info!("adaptive attacker: attempt {} on {} unbroken pairs", k + 1, round.len());
        cases.extend(round.into_iter().map(|(case, _)| case));
        // Every attempt so far: the gym skips the recorded ones but checks their names.
        let attempts = log.pairs.iter().flat_map(|p| &p.attempts);
        settings.wording.extend(attempts.map(|a| (a.case_id.clone(), a.wording.clone())));
        let sub = Plan {
            name: format!("{}-adaptive", plan.name),
            cases: cases.clone(),
            hash: plan.hash.clone(),
            ..plan.clone()
        };
        let executed = gym::execute(pyenv, &dir, &sub, inventory, settings).await?;
        let outcomes = executed.gym.records.iter().map(|r| (r.case_id.clone(), r.security)).collect();
        record(&mut log, &outcomes);
        let (run_dir, written) = (run_dir.clone(), log.clone());
        runtime::blocking(move || run_dir.write_search_log(&written)).await?;
    }
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adaptive(attempts: usize) -> Adaptive {
        let pairs = (0..6).map(|u| ("banking".to_string(), format!("user_task_{u}"), "injection_task_0".to_string()));
        Adaptive { attempts, families: vec!["roleplay".into(), "authority".into()], pairs: pairs.collect() }
    }

    /// A model that falls for roleplay worded with its second framing only.
    fn respond(w: &Wording) -> Option<bool> {
        Some(w.family == "roleplay" && w.choices[0] == 1)
    }

    fn play(seed: u64, attempts: usize) -> SearchLog {
        let mut log = new_log(seed, &adaptive(attempts));
        for k in 0..attempts {
            let outcomes = plan_round(&mut log, k).into_iter().map(|(c, w)| (c.id, respond(&w))).collect();
            record(&mut log, &outcomes);
        }
        log
    }

    #[test]
    fn the_search_is_seeded_keeps_what_lands_and_stops_on_broken_pairs() {
        let log = play(3, 6);
        assert_eq!(log, play(3, 6), "replays exactly");
        assert_ne!(log, play(4, 6), "another seed, another search");
        for pair in &log.pairs {
            let first_landed = pair.attempts.iter().position(|a| a.landed == Some(true));
            if let Some(i) = first_landed {
                assert_eq!(i + 1, pair.attempts.len(), "no attempt after a pair broke");
            }
            assert!(pair.attempts.len() <= 6);
            let mut seen: Vec<&Wording> = pair.attempts.iter().map(|a| &a.wording).collect();
            seen.dedup();
            assert_eq!(seen.len(), pair.attempts.len(), "never the same wording twice on a pair");
        }
        let (broken, pairs) = log.broken();
        assert_eq!(pairs, 6);
        assert!(broken >= 4, "the search finds the weak spot: {broken} of 6");
        assert!(log.pairs.iter().flat_map(|p| &p.attempts).any(|a| a.how != How::Fresh), "it builds on what landed");
        // One attempt: fresh draws only, fewer broken.
        assert!(play(3, 1).broken().0 < broken);
    }
}
