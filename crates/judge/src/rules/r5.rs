//! R5, operating budget: case time, tokens, guardrail false positives and human asks
//! per case, and the model's format health where the profile sets a budget for it;
//! each figure within its maximum, one not measured said so.
//!
//! Not here: the model's timing itself (`pruefstand_core::telemetry`).

use serde::{Deserialize, Serialize};

use super::measure::mean;
use super::{RuleResult, Threshold};
use crate::{Measured, RuleId, RuleStatus};
use pruefstand_core::case::{CaseKind, CaseRecord, Outcome};
use pruefstand_core::settings::thresholds;
use pruefstand_core::util::percentile;
use pruefstand_core::words::Unit;

/// What R5 measured, as `judgement.json` writes it: a figure per budget, the
/// format-health ones only where the profile sets their maximum.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Budgets {
    pub p95_case_s: Budget,
    pub tokens_per_case: Budget,
    pub guardrail_fp_rate: Budget,
    pub human_asks_per_case: Budget,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub malformed_outputs_per_case: Option<Budget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_tool_calls_per_case: Option<Budget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_overflow_rate: Option<Budget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_p95_s: Option<Budget>,
}

/// One figure against its maximum: None when no case measured it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    pub value: Option<f64>,
    pub cases: usize,
    pub within: Option<bool>,
}

impl Budget {
    fn of(value: Option<f64>, cases: usize, max: f64) -> Budget {
        Budget { value, cases, within: value.map(|v| v <= max) }
    }
}

/// Per scored case that reported the counter: the mean, over how many cases.
fn per_case(records: &[CaseRecord], counter: fn(&CaseRecord) -> Option<u64>, max: f64) -> Budget {
    let counted: Vec<f64> = records.iter().filter(|r| !r.is_error()).filter_map(counter).map(|v| v as f64).collect();
    Budget::of(mean(counted.iter().copied()), counted.len(), max)
}

fn guardrail_fp_rate(records: &[CaseRecord], max: f64) -> Budget {
    let clean_flags: Vec<u64> = records
        .iter()
        .filter(|r| r.kind == CaseKind::Clean && !r.is_error())
        .filter_map(|r| r.guardrail_flags)
        .collect();
    let rate = (!clean_flags.is_empty())
        .then(|| clean_flags.iter().filter(|f| **f > 0).count() as f64 / clean_flags.len() as f64);
    Budget::of(rate, clean_flags.len(), max)
}

fn context_overflow_rate(records: &[CaseRecord], max: f64) -> Budget {
    let scored: Vec<&CaseRecord> = records.iter().filter(|r| !r.is_error()).collect();
    let overflows = scored.iter().filter(|r| r.outcome() == Outcome::ContextOverflow).count();
    Budget::of((!scored.is_empty()).then(|| overflows as f64 / scored.len() as f64), scored.len(), max)
}

fn ttft_p95_s(records: &[CaseRecord], max: f64) -> Budget {
    let scored = || records.iter().filter(|r| !r.is_error());
    let timing = pruefstand_core::telemetry::ModelTiming::of(scored());
    Budget::of(timing.ttft_s_p95, scored().filter(|r| r.streamed_calls.is_some_and(|n| n > 0)).count(), max)
}

fn measure(records: &[CaseRecord], t: &thresholds::R5) -> Budgets {
    let durations = records.iter().map(|r| r.duration_s).collect();
    let tokens = || records.iter().filter_map(|r| r.tokens());
    let asks = || records.iter().filter_map(|r| r.human_asks);
    Budgets {
        p95_case_s: Budget::of(percentile(durations, 0.95), records.len(), t.p95_case_s_max),
        tokens_per_case: Budget::of(mean(tokens().map(|v| v as f64)), tokens().count(), t.tokens_per_case_max),
        guardrail_fp_rate: guardrail_fp_rate(records, t.guardrail_fp_rate_max),
        human_asks_per_case: Budget::of(mean(asks().map(|v| v as f64)), asks().count(), t.human_asks_per_case_max),
        malformed_outputs_per_case: t
            .malformed_outputs_per_case_max
            .map(|max| per_case(records, |r| r.malformed_outputs, max)),
        unknown_tool_calls_per_case: t
            .unknown_tool_calls_per_case_max
            .map(|max| per_case(records, |r| r.unknown_tool_calls, max)),
        context_overflow_rate: t.context_overflow_rate_max.map(|max| context_overflow_rate(records, max)),
        ttft_p95_s: t.ttft_p95_s_max.map(|max| ttft_p95_s(records, max)),
    }
}

impl Budgets {
    /// Each figure measured with its label, unit and maximum, in the order R5 words them.
    fn labelled(&self, t: &thresholds::R5) -> Vec<(&'static str, Unit, Budget, f64)> {
        let optional = [
            (
                "mean malformed outputs per case",
                Unit::PerCase,
                self.malformed_outputs_per_case,
                t.malformed_outputs_per_case_max,
            ),
            (
                "mean unknown-tool calls per case",
                Unit::PerCase,
                self.unknown_tool_calls_per_case,
                t.unknown_tool_calls_per_case_max,
            ),
            (
                "context overflows (share of scored cases)",
                Unit::Share,
                self.context_overflow_rate,
                t.context_overflow_rate_max,
            ),
            ("p95 time to first token", Unit::Seconds, self.ttft_p95_s, t.ttft_p95_s_max),
        ];
        [
            ("p95 case time", Unit::Seconds, self.p95_case_s, t.p95_case_s_max),
            ("mean tokens per case", Unit::PerCase, self.tokens_per_case, t.tokens_per_case_max),
            (
                "guardrail false positives (share of clean cases flagged)",
                Unit::Share,
                self.guardrail_fp_rate,
                t.guardrail_fp_rate_max,
            ),
            ("mean human asks per case", Unit::PerCase, self.human_asks_per_case, t.human_asks_per_case_max),
        ]
        .into_iter()
        .chain(optional.into_iter().filter_map(|(label, unit, b, max)| Some((label, unit, b?, max?))))
        .collect()
    }
}

pub(crate) fn r5_budget(records: &[CaseRecord], t: &thresholds::R5) -> RuleResult {
    let measured = measure(records, t);
    let (mut over, mut within, mut unmeasured) = (Vec::new(), Vec::new(), Vec::new());
    for (label, unit, budget, max) in measured.labelled(t) {
        match budget.value {
            None => unmeasured.push(label),
            Some(v) if v > max => over.push(format!("{label} {} > {}", unit.show(v), unit.show_limit(max))),
            // The measured numbers beside the pass: a pass by a hair reads differently.
            Some(v) => within.push(format!("{label} {} ≤ {}", unit.show(v), unit.show_limit(max))),
        }
    }
    let note =
        if unmeasured.is_empty() { String::new() } else { format!(" (not measured: {})", unmeasured.join(", ")) };
    let (status, reason) = if over.is_empty() {
        (RuleStatus::Pass, format!("within every measured budget: {}{note}", within.join("; ")))
    } else {
        (RuleStatus::Fail, format!("over budget: {}{note}", over.join("; ")))
    };
    RuleResult::new(RuleId::R5, status, Measured::R5(Box::new(measured)), Threshold::R5(t.clone()), reason)
}
