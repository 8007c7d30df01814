//! For a run judged inconclusive: would the `voll` plan decide each undecided figure of
//! R2 and R3? The distance of the estimate from its threshold against `voll`'s minimum
//! detectable difference at the rule's α.
//!
//! Not here: the rules' own decisions (`r2`, `r3`).

use super::RuleResult;
use super::measure::{at_least, attack_obs, utility_bounded};
use crate::clustering::adjust;
use crate::stats::{self, Adjusted};
use crate::{Outlook, RuleId, RuleStatus, Thresholds};
use pruefstand_core::case::{CaseKind, CaseRecord};
use pruefstand_core::util::pct;

/// `voll`'s attacked cases per user task, by suite: (user tasks, cases each) — 949
/// pairs × 2 attacks = 1,898 cases.
const VOLL_ATTACKED: [(u64, u64); 4] = [(40, 28), (20, 14), (16, 18), (21, 10)];
/// What R2 judges of `voll`: each pair once, under its suite's held-out family
/// (docs/attacks.md) — 949 cases.
const VOLL_HELD_OUT: [(u64, u64); 4] = [(40, 14), (20, 7), (16, 9), (21, 5)];
/// `voll` runs every user task clean once.
const VOLL_CLEAN: u64 = 97;
/// Planning ρ for the outlook: the study's realistic value unless the run shows more.
const PLANNING_RHO: f64 = 0.1;
const POWER: f64 = 0.8;

/// `voll`'s shape for a figure: cases and the size-weighted mean cluster size Σm²/N.
fn shape(clusters: &[(u64, u64)]) -> (u64, f64) {
    let n: u64 = clusters.iter().map(|(k, m)| k * m).sum();
    (n, clusters.iter().map(|(k, m)| (k * m * m) as f64).sum::<f64>() / n as f64)
}

/// One undecided figure: what it measured and what it is held against.
struct Undecided<'a> {
    rule: RuleId,
    figure: &'a str,
    measured: Adjusted,
    threshold: f64,
    alpha: f64,
    /// `voll`'s cases and mean cluster size for it.
    voll: (u64, f64),
}

fn outlook_of(plan: &str, u: Undecided) -> Option<Outlook> {
    let a = &u.measured;
    if a.n == 0 {
        return None;
    }
    let (voll_n, voll_mw) = u.voll;
    let rho = a.rho.max(PLANNING_RHO);
    let deff = 1.0 + (voll_mw - 1.0) * rho;
    let mdd = stats::min_detectable_difference(u.threshold, voll_n as f64, deff, u.alpha, POWER);
    let distance = (a.rate() - u.threshold).abs();
    let already = plan == "voll";
    let voll_decides = !already && distance >= mdd;
    let note = if already {
        format!("this is voll already: {} from the threshold is within its reach of ±{}", pct(distance), pct(mdd))
    } else if voll_decides {
        format!("voll detects ±{} here; the estimate sits {} from the threshold", pct(mdd), pct(distance))
    } else {
        format!("too close to call: {} from the threshold, voll detects ±{}", pct(distance), pct(mdd))
    };
    Some(Outlook {
        rule: u.rule,
        figure: u.figure.into(),
        estimate: a.rate(),
        threshold: u.threshold,
        mdd_voll: mdd,
        voll_decides,
        note,
    })
}

/// For each undecided figure of R2/R3: would `voll` decide it? `r2_records` are the
/// records R2 judged (its held-out families); R3 looks at all.
pub fn outlook(
    plan: &str,
    records: &[CaseRecord],
    r2_records: &[CaseRecord],
    rules: &[RuleResult],
    t: &Thresholds,
) -> Vec<Outlook> {
    let inconclusive = |id: RuleId| rules.iter().any(|r| r.id == id && r.status == RuleStatus::Inconclusive);
    let mut undecided = Vec::new();
    if inconclusive(RuleId::R2) {
        let a = adjust(&attack_obs(r2_records, None), t.r2.clustering);
        let alpha = if a.rate() < t.r2.asr_max { t.r2.alpha_pass } else { t.r2.alpha_fail };
        let voll = shape(&VOLL_HELD_OUT);
        undecided.push(Undecided {
            rule: RuleId::R2,
            figure: "asr",
            measured: a,
            threshold: t.r2.asr_max,
            alpha,
            voll,
        });
    }
    if inconclusive(RuleId::R3) {
        for (figure, kind, min, voll) in [
            ("utility", CaseKind::Clean, t.r3.utility_min, (VOLL_CLEAN, 1.0)),
            ("utility_under_attack", CaseKind::Attacked, t.r3.utility_under_attack_min, shape(&VOLL_ATTACKED)),
        ] {
            let b = utility_bounded(records, kind, t.r3.clustering);
            let (status, _, _) = at_least(&b.errors_false, &b.errors_true, t.r3.alpha, min);
            if status == RuleStatus::Inconclusive {
                let alpha = t.r3.alpha;
                undecided.push(Undecided { rule: RuleId::R3, figure, measured: b.ok, threshold: min, alpha, voll });
            }
        }
    }
    undecided.into_iter().filter_map(|u| outlook_of(plan, u)).collect()
}
