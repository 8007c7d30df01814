//! The R2 error-rate study (docs/statistics.md), shipped: simulated versions whose true
//! ASR sits exactly at `asr_max`, on `voll`'s shape (97 user tasks, 949 pairs × 2
//! attacks; cluster sizes 28/14/18/10 per suite), with a latent susceptibility per user
//! task (Beta with intra-cluster correlation ρ). Each replicate runs the real rule R2
//! on constructed records and counts a false approval when it passes.
//!
//! Not a test of the simulator or of AgentDojo: only of the statistics behind R2.

use rand::{RngExt, SeedableRng};
use statrs::distribution::{Beta, ContinuousCDF};

use super::{RuleStatus, rules};
use crate::case::{Case, CaseRecord};
use crate::settings::thresholds::{Clustering, Thresholds};
use crate::stats;

/// `voll`'s attacked shape: (suite, user tasks, injection tasks); every pair under 2
/// attacks.
const VOLL: [(&str, usize, usize); 4] =
    [("workspace", 40, 14), ("travel", 20, 7), ("banking", 16, 9), ("slack", 21, 5)];
const ATTACKS: [&str; 2] = ["important_instructions", "tool_knowledge"];

#[derive(Debug, Clone, PartialEq)]
pub struct StudyResult {
    pub replicates: u32,
    pub true_asr: f64,
    pub rho: f64,
    /// Share of replicates where R2 passed with one-way (user task) clustering.
    pub one_way: f64,
    /// … with the two-way (user × injection task) variant.
    pub two_way: f64,
    /// … had R2 used plain Clopper–Pearson on the case counts (what clustering fixes).
    pub unadjusted: f64,
}

pub fn r2_at_the_boundary(replicates: u32, rho: f64, seed: u64, thresholds: &Thresholds) -> StudyResult {
    let p = thresholds.r2.asr_max;
    // Beta with mean p and ICC ρ: a + b = 1/ρ − 1.
    let spread = 1.0 / rho.max(1e-6) - 1.0;
    let latent = Beta::new(p * spread, (1.0 - p) * spread).expect("valid Beta parameters");
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    let mut two_way_thresholds = thresholds.r2.clone();
    two_way_thresholds.clustering = Clustering::TwoWay;
    let mut one_way_thresholds = thresholds.r2.clone();
    one_way_thresholds.clustering = Clustering::UserTask;
    let (mut one_way, mut two_way, mut unadjusted) = (0u32, 0u32, 0u32);
    for _ in 0..replicates {
        let mut records = Vec::new();
        let mut landed = 0u64;
        for (suite, users, injections) in VOLL {
            for u in 0..users {
                let susceptibility = latent.inverse_cdf(rng.random::<f64>());
                for i in 0..injections {
                    for attack in ATTACKS {
                        let hit = rng.random::<f64>() < susceptibility;
                        landed += u64::from(hit);
                        let case =
                            Case::attacked(suite, &format!("user_task_{u}"), &format!("injection_task_{i}"), attack);
                        records.push(CaseRecord::of(&case, Some(true), Some(hit)));
                    }
                }
            }
        }
        one_way += u32::from(rules::r2_security(&records, &one_way_thresholds).status == RuleStatus::Pass);
        two_way += u32::from(rules::r2_security(&records, &two_way_thresholds).status == RuleStatus::Pass);
        unadjusted += u32::from(stats::cp_upper(landed as f64, records.len() as f64, thresholds.r2.alpha_pass) <= p);
    }
    let rate = |count: u32| f64::from(count) / f64::from(replicates.max(1));
    StudyResult {
        replicates,
        true_asr: p,
        rho,
        one_way: rate(one_way),
        two_way: rate(two_way),
        unadjusted: rate(unadjusted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the boundary R2 falsely approves about 3–5 %; without the
    /// cluster adjustment far more. 300 replicates keep the Monte Carlo error near 1.3 %.
    #[test]
    fn r2_keeps_its_error_rate_at_the_boundary_on_voll() {
        let result = r2_at_the_boundary(300, 0.1, 7, &Thresholds::default());
        eprintln!("{result:?}");
        assert!(result.one_way <= 0.085, "one-way {}", result.one_way);
        assert!(result.two_way <= 0.085, "two-way {}", result.two_way);
        assert!(result.unadjusted > 0.10, "unadjusted {}", result.unadjusted);
    }
}
