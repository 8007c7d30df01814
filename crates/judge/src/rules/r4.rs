//! R4, no regression: the run paired case by case with its reference (same plan and
//! benchmark, trusted records), the ASR and the utility each tested by a sign-flip test
//! over user tasks, Holm-adjusted; a regression is significant and beyond the margin.
//!
//! Not here: R4's sequential form for a run that stops early (`judge::paired`), whose
//! decision [`sequential_r4`] writes into the rule.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{RuleResult, Threshold, decided_early};
use crate::clustering::user_cluster;
use crate::paired::SequentialR4;
use crate::stats::{self, SignFlip};
use crate::{Measured, ReferenceRun, RuleId, RuleStatus, RunMeta};
use pruefstand_core::case::{CaseKind, CaseRecord};
use pruefstand_core::settings::thresholds;
use pruefstand_core::words;

/// What R4 measured, as `judgement.json` writes it; which parts are there says how far
/// it got: the two plans when they differ, the pairs and both tests when it compared.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Regression {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_plan_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_benchmark_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub benchmark_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paired_cases: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asr: Option<Comparison>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utility: Option<Comparison>,
    /// A stopped run: R4's sequential test, and the status the fixed-sample test alone
    /// would give.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequential: Option<SequentialR4>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed_sample_status: Option<RuleStatus>,
}

/// One paired comparison: `b` pairs where the candidate is worse, `c` where better.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Comparison {
    pub pairs: u64,
    pub b: u64,
    pub c: u64,
    /// (b − c) / pairs: > 0 is worse on net.
    pub difference: f64,
    pub t_obs: i64,
    pub p_value: f64,
    pub p_holm: f64,
    pub exact: bool,
    pub nonzero_clusters: usize,
    pub significant: bool,
    pub regressed: bool,
}

/// One paired comparison of R4: per user task, cases where the candidate is worse
/// minus cases where it is better.
struct Paired {
    n: u64,
    b: u64,
    c: u64,
    d: Vec<i64>,
}

fn paired(pairs: impl Iterator<Item = (String, bool, bool)>) -> Paired {
    let mut by: BTreeMap<String, i64> = BTreeMap::new();
    let mut outcomes = Vec::new();
    for (cluster, cand_bad, ref_bad) in pairs {
        *by.entry(cluster).or_default() += cand_bad as i64 - ref_bad as i64;
        outcomes.push((cand_bad, ref_bad));
    }
    let (b, c) = stats::mcnemar_counts(outcomes.iter().copied());
    Paired { n: outcomes.len() as u64, b, c, d: by.into_values().collect() }
}

/// R4's result; a comparison that measured nothing writes `{}`, as a rule not judged.
fn rule(status: RuleStatus, measured: Regression, t: &thresholds::R4, reason: String) -> RuleResult {
    let measured =
        if measured == Regression::default() { Measured::nothing() } else { Measured::R4(Box::new(measured)) };
    RuleResult::new(RuleId::R4, status, measured, Threshold::R4(t.clone()), reason)
}

/// Why the reference is not comparable, when it is not: another plan or benchmark.
fn unlike(run: &RunMeta, meta: &ReferenceRun) -> Option<String> {
    let short = |h: &str| h.get(..12).unwrap_or(h).to_string();
    if meta.plan_hash != run.plan_hash {
        Some(format!(
            "the reference ran another plan (plan hash {} vs this run's {})",
            if meta.plan_hash.is_empty() { "unknown".to_string() } else { short(&meta.plan_hash) },
            short(&run.plan_hash)
        ))
    } else if meta.benchmark_version != run.benchmark_version {
        Some(format!("the reference ran benchmark {:?}, this run {:?}", meta.benchmark_version, run.benchmark_version))
    } else {
        None
    }
}

/// R4 against the reference's (deduplicated) records. Only a reference of the same plan
/// hash and benchmark version is compared; another is `inconclusive`, never a pass on
/// the cases the two plans happen to share.
pub(crate) fn r4_regression(
    run: &RunMeta,
    records: &[CaseRecord],
    reference: Option<(&ReferenceRun, &[CaseRecord])>,
    t: &thresholds::R4,
) -> RuleResult {
    let Some((meta, reference)) = reference else {
        return rule(RuleStatus::NotApplicable, Regression::default(), t, "no reference run".into());
    };
    if let Some(why) = &meta.untrusted {
        return rule(RuleStatus::Inconclusive, Regression::default(), t, format!("not compared: {why}"));
    }
    if let Some(why) = unlike(run, meta) {
        let measured = Regression {
            reference_plan_hash: Some(meta.plan_hash.clone()),
            reference_benchmark_version: Some(meta.benchmark_version.clone()),
            plan_hash: Some(run.plan_hash.clone()),
            benchmark_version: Some(run.benchmark_version.clone()),
            ..Regression::default()
        };
        let reason = format!("not compared: {why}; R4 compares runs of the same plan only");
        return rule(RuleStatus::Inconclusive, measured, t, reason);
    }
    compared(&run.plan, &crate::pair_with_reference(records, reference), t)
}

/// R4 on the cases paired with the reference.
fn compared(plan: &str, both: &[(&CaseRecord, &CaseRecord)], t: &thresholds::R4) -> RuleResult {
    let asr = paired(
        both.iter()
            .filter(|(c, _)| c.kind == CaseKind::Attacked)
            .filter_map(|(c, r)| Some((user_cluster(c), c.security?, r.security?))),
    );
    let util = paired(
        both.iter()
            .filter(|(c, _)| matches!(c.kind, CaseKind::Clean | CaseKind::Attacked))
            .filter_map(|(c, r)| Some((user_cluster(c), !c.utility?, !r.utility?))),
    );
    if asr.n + util.n == 0 {
        let reason = "no case shared with the reference (without error on both sides)".to_string();
        return rule(
            RuleStatus::Inconclusive,
            Regression { paired_cases: Some(0), ..Regression::default() },
            t,
            reason,
        );
    }
    let tests = [&asr, &util].map(|p| stats::sign_flip_test(&p.d, t.permutations, t.seed));
    let adjusted = stats::holm(&[tests[0].p_value, tests[1].p_value]);
    let [asr, util] = [(&asr, &tests[0], adjusted[0]), (&util, &tests[1], adjusted[1])]
        .map(|(p, test, p_holm)| comparison(p, test, p_holm, t));
    let mut worse = Vec::new();
    let mut parts = Vec::new();
    for (key, what, c) in [("asr", words::ASR_ALL, &asr), ("utility", words::UTILITY_PAIRED, &util)] {
        // difference > 0: the candidate is worse than the reference on net.
        let change = match c.difference {
            d if d > 0.0 => format!("worse by {:.1} pt", 100.0 * d),
            d if d < 0.0 => format!("better by {:.1} pt", -100.0 * d),
            _ => "unchanged".to_string(),
        };
        parts.push(format!("{what} {change} ({}, {})", words::paired_counts(c.b, c.c, c.p_holm), tested(c, t)));
        if c.regressed {
            worse.push(key);
        }
    }
    let schnell = if plan == "schnell" { " — on schnell a warning only; the gate is voll" } else { "" };
    let parts = format!("{}; {}", parts.join("; "), words::PAIRED_COUNTS);
    let (status, reason) = if worse.is_empty() {
        let margin = format!("{:.1} pt", 100.0 * t.margin);
        (RuleStatus::Pass, format!("no significant regression beyond {margin}: {parts}{schnell}"))
    } else {
        (RuleStatus::Fail, format!("regressed ({}): {parts}{schnell}", worse.join(", ")))
    };
    let measured =
        Regression { paired_cases: Some(both.len()), asr: Some(asr), utility: Some(util), ..Regression::default() };
    rule(status, measured, t, reason)
}

/// What one comparison's p answers, and so why it passed or failed: the test is
/// one-sided, of "the candidate is worse" (a p near 1 beside "better" is that test's
/// answer, not a doubt about the improvement).
fn tested(c: &Comparison, t: &thresholds::R4) -> String {
    let margin = format!("{:.1} pt", 100.0 * t.margin);
    let outcome = if c.regressed {
        format!("significant and beyond the {margin} margin: a regression")
    } else if c.difference > 0.0 && c.significant {
        format!("significant but within the {margin} margin: no regression")
    } else if c.difference > 0.0 {
        format!("not significant at α {}: no regression", t.alpha)
    } else {
        "no sign of a regression".to_string()
    };
    format!("one-sided test of \"worse\": {outcome}")
}

fn comparison(p: &Paired, test: &SignFlip, p_holm: f64, t: &thresholds::R4) -> Comparison {
    let difference = if p.n == 0 { 0.0 } else { (p.b as f64 - p.c as f64) / p.n as f64 };
    let significant = p_holm < t.alpha;
    Comparison {
        pairs: p.n,
        b: p.b,
        c: p.c,
        difference,
        t_obs: test.t_obs,
        p_value: test.p_value,
        p_holm,
        exact: test.exact,
        nonzero_clusters: test.nonzero_clusters,
        significant,
        regressed: significant && difference > t.margin,
    }
}

/// R4 of a run with a reference that stopped early before R4's sequential test decided:
/// such a run was rejected by another rule (an approval needs R4 decided).
pub(crate) fn stopped_r4() -> RuleResult {
    let reason =
        "not judged: the run stopped early before R4's sequential test decided (`run --full --out DIR` runs the rest)";
    RuleResult::new(RuleId::R4, RuleStatus::Inconclusive, Measured::nothing(), Threshold::nothing(), reason.into())
}

/// R4 of a stopped run that R4's sequential test decided (`paired`): the fixed-sample
/// comparison of the cases run stays as description, the status and reason are the
/// sequential decision's.
pub(crate) fn sequential_r4(mut rule: RuleResult, r4: &SequentialR4) -> RuleResult {
    let decided: Vec<String> = r4.tracks().iter().filter_map(|t| t.describe()).collect();
    let undecided: Vec<&str> = r4.tracks().iter().filter(|t| t.decision.is_none()).map(|t| t.figure.as_str()).collect();
    let mut measured = match &rule.measured {
        Measured::R4(m) => (**m).clone(),
        _ => Regression::default(),
    };
    measured.sequential = Some(r4.clone());
    measured.fixed_sample_status = Some(rule.status);
    rule.measured = Measured::R4(Box::new(measured));
    decided_early(rule, r4.status(), "paired user-task differences", &decided, &undecided)
}
