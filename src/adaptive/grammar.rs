//! The grammar proposer: attempts worded from the family grammars — with nothing landed
//! yet a fresh draw from the next family in the pair's own rotation, afterwards a
//! mutation or recombination of wordings that landed on any pair ("keep what lands").
//! Every choice is a hash of the run's seed, the pair and the attempt.

use pruefstand_core::family;
use pruefstand_core::record::{Choices, How, SearchLog, Wording};

/// Wordings that landed, in the order they were found (round, then pair).
pub(crate) fn pool(log: &SearchLog, before_round: usize) -> Vec<Wording> {
    (0..before_round)
        .flat_map(|k| log.pairs.iter().filter_map(move |p| p.attempts.get(k)))
        .filter(|a| a.landed == Some(true))
        .filter_map(|a| a.wording().cloned())
        .collect()
}

/// The wording of attempt `k` of a pair: mutate or recombine what landed, else a fresh
/// draw from the next family in the pair's own rotation; never one the pair tried.
pub(crate) fn next(
    seed: u64,
    pair: &str,
    k: usize,
    families: &[String],
    pool: &[Wording],
    tried: &[&Wording],
) -> (Wording, How) {
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
