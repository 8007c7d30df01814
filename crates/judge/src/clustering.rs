//! How the rules cluster cases, shared by `rules`, `early` and `families`: a record's
//! user-task and injection-task clusters, and a proportion adjusted for the clustering a
//! rule's thresholds ask for. Uses none of its siblings, so they can all use it.
//!
//! Not the statistics themselves (`crate::stats`), nor what a rule decides from them.

use std::collections::BTreeMap;

use crate::stats::{self, Adjusted, Cluster};
use pruefstand_core::case::CaseRecord;
use pruefstand_core::settings::thresholds::Clustering;

/// The user-task cluster of a record, `suite/user_task` (task names repeat across
/// suites); `suite/-` for a record without one.
pub(super) fn user_cluster(r: &CaseRecord) -> String {
    format!("{}/{}", r.suite, r.user_task.as_deref().unwrap_or("-"))
}

/// The injection-task cluster of a case; a case without injection task (clean) is a
/// cluster of its own.
pub(super) fn injection_key(r: &CaseRecord) -> String {
    match &r.injection_task {
        Some(task) => format!("{}/{task}", r.suite),
        None => r.case_id.clone(),
    }
}

fn clusters_of(obs: &[(String, String, bool)]) -> Vec<Cluster> {
    let mut by: BTreeMap<&str, Cluster> = BTreeMap::new();
    for (a, _, y) in obs {
        let c = by.entry(a).or_insert(Cluster { x: 0, m: 0 });
        c.m += 1;
        c.x += *y as u64;
    }
    by.into_values().collect()
}

/// The proportion of `obs` — (user task, injection task, outcome) — adjusted for
/// `clustering`: by user task, two-way, or crossed.
pub(super) fn adjust(obs: &[(String, String, bool)], clustering: Clustering) -> Adjusted {
    match clustering {
        Clustering::UserTask => stats::adjust_one_way(&clusters_of(obs)),
        Clustering::TwoWay => stats::adjust_two_way(obs),
        Clustering::Crossed => {
            let (design, y) = stats::Design::of(obs);
            design.crossed(&y)
        }
    }
}
