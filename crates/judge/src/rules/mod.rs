//! The five rules, one file each (`r1` … `r5`), each a pure function from
//! (deduplicated) records to a [`RuleResult`] whose `measured` and `threshold` are the
//! rule's own types ([`Measured`], [`Threshold`]), written to `judgement.json` with the
//! keys of each type's fields. Shared: `measure` (observations, error-bounded rates,
//! the headline figures) and `outlook` (would `voll` decide?). Clusters are user tasks,
//! keyed `suite/user_task` (task names repeat across suites; `judge::clustering`).
//!
//! Not here: when a run that stops early may stop (`judge::early`, whose decisions
//! [`sequential`] writes into R2 and R3), which cases R2 judges (`judge::families`).

mod measure;
mod outlook;
pub mod r1;
pub mod r2;
pub mod r3;
pub mod r4;
pub mod r5;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::early::Track;
use pruefstand_core::record::{RuleId, RuleStatus};
use pruefstand_core::settings::thresholds;

pub use measure::{Rate, figures};
pub use outlook::outlook;
pub use pruefstand_core::util::percentile;
pub use r2::decisive;
pub(crate) use r2::{asr_status, r2_security, r2_security_decisive};

/// One rule's result, as `judgement.json` writes it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(from = "Written")]
pub struct RuleResult {
    pub id: RuleId,
    pub name: String,
    pub status: RuleStatus,
    /// The measured figures.
    pub measured: Measured,
    pub threshold: Threshold,
    /// One line.
    pub reason: String,
}

/// What a rule measured: its own type, nothing for a rule not judged.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum Measured {
    Nothing(Empty),
    R1(Box<r1::Validity>),
    R2(Box<r2::Security>),
    R3(Box<r3::Utility>),
    R4(Box<r4::Regression>),
    R5(Box<r5::Budgets>),
    /// A judgement from another version whose figures this one does not read: kept as
    /// written.
    Unread(Value),
}

/// The limits a rule held its figures against: the profile's for it, nothing for a
/// rule not judged.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(untagged)]
pub enum Threshold {
    Nothing(Empty),
    R1(thresholds::R1),
    R2(r2::Limits),
    R3(thresholds::R3),
    R4(thresholds::R4),
    R5(thresholds::R5),
    /// As [`Measured::Unread`].
    Unread(Value),
}

/// `{}`: what a rule not judged measured.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
pub struct Empty {}

/// A rule result as read, before its figures are typed by its id.
#[derive(Deserialize)]
struct Written {
    id: RuleId,
    name: String,
    status: RuleStatus,
    measured: Value,
    threshold: Value,
    reason: String,
}

impl From<Written> for RuleResult {
    fn from(w: Written) -> RuleResult {
        RuleResult {
            measured: Measured::read(w.id, w.measured),
            threshold: Threshold::read(w.id, w.threshold),
            id: w.id,
            name: w.name,
            status: w.status,
            reason: w.reason,
        }
    }
}

fn is_empty(v: &Value) -> bool {
    v.as_object().is_some_and(|m| m.is_empty())
}

impl Measured {
    pub fn nothing() -> Measured {
        Measured::Nothing(Empty {})
    }

    /// `v` as rule `id`'s figures; kept as written when it is not.
    fn read(id: RuleId, v: Value) -> Measured {
        fn typed<T: serde::de::DeserializeOwned>(v: &Value, wrap: fn(Box<T>) -> Measured) -> Option<Measured> {
            serde_json::from_value(v.clone()).ok().map(|m| wrap(Box::new(m)))
        }
        let read = match id {
            _ if is_empty(&v) => Some(Measured::nothing()),
            RuleId::R1 => typed(&v, Measured::R1),
            RuleId::R2 => typed(&v, Measured::R2),
            RuleId::R3 => typed(&v, Measured::R3),
            RuleId::R4 => typed(&v, Measured::R4),
            RuleId::R5 => typed(&v, Measured::R5),
        };
        read.unwrap_or(Measured::Unread(v))
    }

    pub fn r1(&self) -> Option<&r1::Validity> {
        if let Measured::R1(m) = self { Some(m) } else { None }
    }

    pub fn r2(&self) -> Option<&r2::Security> {
        if let Measured::R2(m) = self { Some(m) } else { None }
    }

    pub fn r3(&self) -> Option<&r3::Utility> {
        if let Measured::R3(m) = self { Some(m) } else { None }
    }

    pub fn r4(&self) -> Option<&r4::Regression> {
        if let Measured::R4(m) = self { Some(m) } else { None }
    }

    pub fn r5(&self) -> Option<&r5::Budgets> {
        if let Measured::R5(m) = self { Some(m) } else { None }
    }
}

impl Threshold {
    pub fn nothing() -> Threshold {
        Threshold::Nothing(Empty {})
    }

    /// `v` as rule `id`'s limits; kept as written when it is not.
    fn read(id: RuleId, v: Value) -> Threshold {
        fn typed<T: serde::de::DeserializeOwned>(v: &Value, wrap: fn(T) -> Threshold) -> Option<Threshold> {
            serde_json::from_value(v.clone()).ok().map(wrap)
        }
        let read = match id {
            _ if is_empty(&v) => Some(Threshold::nothing()),
            RuleId::R1 => typed(&v, Threshold::R1),
            RuleId::R2 => typed(&v, Threshold::R2),
            RuleId::R3 => typed(&v, Threshold::R3),
            RuleId::R4 => typed(&v, Threshold::R4),
            RuleId::R5 => typed(&v, Threshold::R5),
        };
        read.unwrap_or(Threshold::Unread(v))
    }
}

impl RuleResult {
    pub fn new(id: RuleId, status: RuleStatus, measured: Measured, threshold: Threshold, reason: String) -> RuleResult {
        RuleResult { id, name: id.name().into(), status, measured, threshold, reason }
    }
}

/// A rule not judged because R1 failed.
pub(crate) fn not_judged(id: RuleId) -> RuleResult {
    let reason = "not judged: the run is invalid (R1 failed)".to_string();
    RuleResult::new(id, RuleStatus::NotApplicable, Measured::nothing(), Threshold::nothing(), reason)
}

/// R2 or R3 as a stopped run's betting tests decided it: the fixed-sample figures stay
/// (as description), the status and reason are the sequential decision's.
pub(crate) fn sequential(mut rule: RuleResult, status: RuleStatus, tracks: &[&Track]) -> RuleResult {
    let decided: Vec<String> = tracks.iter().filter_map(|t| t.describe()).collect();
    let undecided: Vec<&str> = tracks.iter().filter(|t| t.decision.is_none()).map(|t| t.figure.as_str()).collect();
    let seq = Some(tracks.iter().map(|t| (*t).clone()).collect());
    let fixed = Some(rule.status);
    match &mut rule.measured {
        Measured::R2(m) => (m.sequential, m.fixed_sample_status) = (seq, fixed),
        Measured::R3(m) => (m.sequential, m.fixed_sample_status) = (seq, fixed),
        _ => {}
    }
    decided_early(rule, status, "user-task means", &decided, &undecided)
}

/// The one shape of a sequentially decided rule: its reason names the test, what it
/// decided and what it left undecided; the fixed-sample status stays in `measured`.
fn decided_early(
    mut rule: RuleResult,
    status: RuleStatus,
    test: &str,
    decided: &[String],
    undecided: &[&str],
) -> RuleResult {
    let mut reason = format!("{} by the betting test on {test} (stopped early)", status.as_str());
    if !decided.is_empty() {
        reason += &format!(": {}", decided.join("; "));
    }
    if !undecided.is_empty() {
        reason += &format!("; undecided: {}", undecided.join(", "));
    }
    rule.status = status;
    rule.reason = reason;
    rule
}
