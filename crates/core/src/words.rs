//! One vocabulary for the figures: the names of the rates, how a one-sided bound is
//! said (its level first, then its side in words: "95 % lower bound 16.5 %"), how a
//! figure meets its limit, and the units of R5's budgets. The rules' reasons, the CLI,
//! `queue`, the hooks, `judgement.md` and the report all word their figures here, so
//! that one number never goes by two names (docs/statistics.md, "Figures and their
//! names").

use serde::{Deserialize, Serialize};

use crate::util::pct;

/// Landed ÷ attacked cases without error, every attack family: what R2 judges only
/// when the plan holds no family out.
pub const ASR_ALL: &str = "ASR (all attacks)";
/// The ASR of the plan's held-out families (less those the version trained on): what
/// R2 judges when the plan holds families out.
pub const ASR_HELD_OUT: &str = "held-out ASR";
/// Pairs the adaptive attacker broke within its attempts.
pub const ASR_ADAPTIVE: &str = "adaptive ASR";
pub const UTILITY_CLEAN: &str = "utility (clean)";
pub const UTILITY_UNDER_ATTACK: &str = "utility under attack";
/// R4's utility: clean and attacked cases paired with the reference's.
pub const UTILITY_PAIRED: &str = "utility (clean and attacked)";
/// Can the model do the attacker's task when asked directly?
pub const INJECTION_GOAL_UTILITY: &str = "injection-goal utility";

/// What an ASR rests on when some of its landed attacks are context overflows, which
/// AgentDojo's rule scores as landed: said beside the ASR wherever it is shown, so a
/// reader does not take them for followed injections. None when there are none.
pub fn overflow_note(overflows: u64, landed: u64) -> Option<String> {
    (overflows > 0).then(|| {
        let (verb, noun) = if overflows == 1 { ("is", "a context overflow") } else { ("are", "context overflows") };
        format!(
            "{overflows} of the {landed} attack successes {verb} {noun}: the conversation outgrew the model's context, \
             which AgentDojo scores as a landed attack, not a followed injection"
        )
    })
}

/// Which side of the estimate a one-sided bound lies on.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BoundSide {
    Upper,
    Lower,
}

impl BoundSide {
    pub fn as_str(self) -> &'static str {
        match self {
            BoundSide::Upper => "upper",
            BoundSide::Lower => "lower",
        }
    }
}

/// A share as a short percentage: `0.1` → `10 %`, `0.975` → `97.5 %` (limits and
/// confidence levels, which are round numbers; measured rates use [`pct`]).
pub fn short_pct(p: f64) -> String {
    let v = 100.0 * p;
    if (v - v.round()).abs() < 1e-9 { format!("{:.0} %", v.round()) } else { format!("{:.1} %", v) }
}

/// The confidence level of a one-sided bound at `alpha`: `0.05` → `95 %`.
pub fn level(alpha: f64) -> String {
    short_pct(1.0 - alpha)
}

/// "95 % lower bound 16.5 %": the level, the side in words, the value.
pub fn bound(side: BoundSide, alpha: f64, value: f64) -> String {
    format!("{} {} bound {}", level(alpha), side.as_str(), pct(value))
}

/// A rate with its count: "26.6 % (17/64)".
pub fn rate(rate: f64, hits: u64, cases: u64) -> String {
    format!("{} ({hits}/{cases})", pct(rate))
}

/// A maximum ("limit 10 %") or a minimum ("minimum 50 %").
pub fn limit(max: bool, value: f64) -> String {
    format!("{} {}", if max { "limit" } else { "minimum" }, short_pct(value))
}

/// How a bound meets a maximum: "95 % lower bound 16.5 % > limit 10 %".
pub fn against_max(side: BoundSide, alpha: f64, value: f64, max: f64) -> String {
    let sign = if value <= max { "≤" } else { ">" };
    format!("{} {sign} {}", bound(side, alpha, value), limit(true, max))
}

/// How a bound meets a minimum: "95 % lower bound 86.3 % ≥ minimum 50 %".
pub fn against_min(side: BoundSide, alpha: f64, value: f64, min: f64) -> String {
    let sign = if value >= min { "≥" } else { "<" };
    format!("{} {sign} {}", bound(side, alpha, value), limit(false, min))
}

/// Both bounds on either side of a limit: "95 % lower bound 3.1 % and 97 % upper bound
/// 18.2 % straddle limit 10 %".
pub fn straddle(lower: (f64, f64), upper: (f64, f64), max: bool, value: f64) -> String {
    format!(
        "{} and {} straddle {}",
        bound(BoundSide::Lower, lower.0, lower.1),
        bound(BoundSide::Upper, upper.0, upper.1),
        limit(max, value)
    )
}

/// R4's counts of one comparison: "b 0, c 41, Holm-adjusted p 1.000" (what b and c
/// count: [`PAIRED_COUNTS`]).
pub fn paired_counts(b: u64, c: u64, p_holm: f64) -> String {
    format!("b {b}, c {c}, Holm-adjusted p {p_holm:.3}")
}

/// What R4's b and c count, said once per reason. For ASR "right" is resisting the
/// attack, for utility doing the user's task.
pub const PAIRED_COUNTS: &str = "b counts pairs only the reference got right, c pairs only the candidate got right";

/// The unit of one of R5's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Seconds,
    /// A count per case (tokens, asks, calls): a plain number.
    PerCase,
    /// A share of cases: a percentage.
    Share,
}

impl Unit {
    /// A value of this unit: "4.2 s", "1234", "3.0 %".
    pub fn show(self, v: f64) -> String {
        match self {
            // Seconds to a tenth from one up; below that the small number as it is.
            Unit::Seconds if v.abs() >= 1.0 && v.fract() != 0.0 => format!("{v:.1} s"),
            Unit::Seconds => format!("{} s", number(v)),
            Unit::PerCase => number(v),
            Unit::Share => pct(v),
        }
    }

    /// A limit of this unit: "120 s", "40000", "5 %".
    pub fn show_limit(self, v: f64) -> String {
        match self {
            Unit::Share => short_pct(v),
            _ => self.show(v),
        }
    }
}

/// A number for a reason: integers as such, else one decimal from 10 up, three below.
pub fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e12 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_says_its_level_before_its_side_and_the_limit_by_name() {
        assert_eq!(bound(BoundSide::Upper, 0.03, 0.053), "97 % upper bound 5.3 %");
        assert_eq!(bound(BoundSide::Lower, 0.05, 0.165), "95 % lower bound 16.5 %");
        assert_eq!(bound(BoundSide::Lower, 0.025, 0.165), "97.5 % lower bound 16.5 %");
        assert_eq!(against_max(BoundSide::Lower, 0.05, 0.165, 0.1), "95 % lower bound 16.5 % > limit 10 %");
        assert_eq!(against_max(BoundSide::Upper, 0.03, 0.053, 0.1), "97 % upper bound 5.3 % ≤ limit 10 %");
        assert_eq!(against_min(BoundSide::Lower, 0.05, 0.863, 0.5), "95 % lower bound 86.3 % ≥ minimum 50 %");
        assert_eq!(against_min(BoundSide::Upper, 0.05, 0.11, 0.5), "95 % upper bound 11.0 % < minimum 50 %");
        assert_eq!(
            straddle((0.05, 0.031), (0.03, 0.182), true, 0.1),
            "95 % lower bound 3.1 % and 97 % upper bound 18.2 % straddle limit 10 %"
        );
        assert_eq!(rate(0.2656, 17, 64), "26.6 % (17/64)");
    }

    #[test]
    fn units_are_said_with_every_value() {
        assert_eq!(Unit::Seconds.show(4.181), "4.2 s");
        assert_eq!(Unit::Seconds.show(0.042), "0.042 s");
        assert_eq!(Unit::Seconds.show_limit(120.0), "120 s");
        assert_eq!(Unit::Share.show(0.03), "3.0 %");
        assert_eq!(Unit::Share.show_limit(0.05), "5 %");
        assert_eq!(Unit::PerCase.show(1234.0), "1234");
        assert_eq!(paired_counts(0, 41, 1.0), "b 0, c 41, Holm-adjusted p 1.000");
    }
}
