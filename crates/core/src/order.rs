//! The order a run dispatches cases in, for a plan that stops early (`early_stop = true`;
//! docs/statistics.md, "Stopping early"): the plan's user tasks in an order drawn from
//! the run's seed, and the case ids in the order the gym starts them — each user task's
//! cases together, the few injection-goal cases after the first quarter. Also a plain
//! shuffle, the baseline the gym's own order (a user task's cases together, for the
//! server's prefix cache) is measured against.
//!
//! Not here: when the records seen so far decide the verdict (`judge::early`, which
//! reads the order back from `run.json`), carrying the order to the gym and stopping it
//! (`gym`, `run`).

use std::collections::HashMap;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha20Rng;

use crate::case::Case;

/// The plan's user tasks (their [`Case::user_task_key`]) in an order drawn from `seed`
/// (ChaCha20, Fisher–Yates).
pub fn user_task_order(cases: &[Case], seed: u64) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for key in cases.iter().filter_map(Case::user_task_key) {
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.shuffle(&mut ChaCha20Rng::seed_from_u64(seed));
    keys
}

/// Case ids in an order drawn from `seed` (ChaCha20, Fisher–Yates): the baseline the
/// gym's own order is measured against (`pruefstand gym --order shuffled`, the bench's
/// prefix-cache figure).
pub fn shuffled(cases: &[Case], seed: u64) -> Vec<String> {
    let mut ids: Vec<String> = cases.iter().map(|c| c.id.clone()).collect();
    ids.shuffle(&mut ChaCha20Rng::seed_from_u64(seed));
    ids
}

/// Case ids in the order the gym dispatches them: each user task's cases together, user
/// tasks in `order`, a user task's cases in plan order (clean first); the
/// injection-goal cases (few, and the caution beside R2 needs them) after the first
/// [`goals_after`] user tasks.
pub fn dispatch_order(cases: &[Case], order: &[String]) -> Vec<String> {
    let rank: HashMap<&str, usize> = order.iter().enumerate().map(|(i, k)| (k.as_str(), i)).collect();
    // User task r sorts as 2(r+1); the goal cases as one block between two user tasks.
    let goals = 2 * goals_after(order.len()) + 1;
    let mut ids: Vec<(usize, usize, &str)> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let group = c.user_task_key().map_or(goals, |k| rank.get(k.as_str()).map_or(0, |r| 2 * (r + 1)));
            (group, i, c.id.as_str())
        })
        .collect();
    ids.sort();
    ids.into_iter().map(|(_, _, id)| id.to_string()).collect()
}

/// After how many of `user_tasks` user tasks the injection-goal cases are dispatched: a
/// quarter. Only an approval needs them (the caution beside R2), and no approval comes
/// that soon — deciding "pass" takes dozens of clean user tasks — while a clear
/// rejection often does, and should not wait for them.
pub(crate) fn goals_after(user_tasks: usize) -> usize {
    user_tasks.div_ceil(4)
}

/// A plan of `users` user tasks in suite `s`, each clean and under `injections`
/// injection tasks, and the injection goals: the shape tests of ordering and stopping use.
#[cfg(any(test, feature = "test-support"))]
pub fn test_plan(users: usize, injections: usize) -> Vec<Case> {
    let mut cases = Vec::new();
    for u in 0..users {
        cases.push(Case::clean("s", &format!("user_task_{u}")));
        for i in 0..injections {
            cases.push(Case::attacked("s", &format!("user_task_{u}"), &format!("injection_task_{i}"), "a"));
        }
    }
    for i in 0..injections {
        cases.push(Case::injection_goal("s", &format!("injection_task_{i}")));
    }
    cases
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::user_task_key;

    fn plan(users: usize, injections: usize) -> Vec<Case> {
        test_plan(users, injections)
    }

    #[test]
    fn the_order_is_a_seeded_permutation_and_dispatch_keeps_user_tasks_whole() {
        let cases = plan(30, 3);
        let order = user_task_order(&cases, 7);
        assert_eq!(order, user_task_order(&cases, 7));
        assert_ne!(order, user_task_order(&cases, 8));
        let mut sorted = order.clone();
        sorted.sort();
        let mut expected: Vec<String> = (0..30).map(|u| user_task_key("s", &format!("user_task_{u}"))).collect();
        expected.sort();
        assert_eq!(sorted, expected);
        assert_ne!(order, (0..30).map(|u| user_task_key("s", &format!("user_task_{u}"))).collect::<Vec<_>>());

        let ids = dispatch_order(&cases, &order);
        assert_eq!(ids.len(), cases.len());
        // User task by user task, in the drawn order, clean first; the three goal cases
        // after the first quarter (8 of 30 user tasks, 4 cases each).
        let goals = 4 * goals_after(30);
        assert_eq!(goals, 32);
        assert!(ids[goals..goals + 3].iter().all(|id| id.contains("/goal/")), "{ids:?}");
        let mut rest = ids.clone();
        rest.drain(goals..goals + 3);
        for (n, key) in order.iter().enumerate() {
            let block = &rest[4 * n..4 * (n + 1)];
            assert!(block.iter().all(|id| id.starts_with(&format!("{key}/"))), "{key}: {block:?}");
            assert!(block[0].ends_with("/none/none"), "{block:?}");
        }
    }

    #[test]
    fn a_shuffle_is_a_seeded_permutation_of_every_case() {
        let cases = plan(10, 2);
        let ids = shuffled(&cases, 3);
        assert_eq!(ids, shuffled(&cases, 3));
        assert_ne!(ids, shuffled(&cases, 4));
        let plan_order: Vec<String> = cases.iter().map(|c| c.id.clone()).collect();
        assert_ne!(ids, plan_order);
        let mut sorted = ids.clone();
        sorted.sort();
        let mut expected = plan_order;
        expected.sort();
        assert_eq!(sorted, expected);
    }
}
