//! Descriptive figures of one run — utility, utility under attack, ASR, injection-task
//! utility and their breakdowns — computed from `cases.jsonl`, written as
//! `telemetry.json` and `telemetry.md`.
//!
//! Every figure is a plain proportion over non-errored cases with its denominator
//! beside it (AgentDojo's published tables and logs average over different pair sets;
//! a figure without its denominator invites wrong comparisons). No inference here:
//! intervals and tests are `stats`/`judge`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::case::{CaseKind, CaseRecord};
use crate::util;

#[derive(Serialize, Debug, Default, Clone, PartialEq)]
pub struct Rate {
    pub value: Option<f64>,
    pub hits: usize,
    pub n: usize,
}

impl Rate {
    fn of<'a>(records: impl Iterator<Item = &'a CaseRecord>, hit: impl Fn(&CaseRecord) -> Option<bool>) -> Rate {
        let (mut hits, mut n) = (0, 0);
        for record in records.filter(|r| !r.is_error()) {
            if let Some(value) = hit(record) {
                n += 1;
                hits += usize::from(value);
            }
        }
        Rate { value: (n > 0).then(|| hits as f64 / n as f64), hits, n }
    }
}

/// `telemetry.json`: the descriptive figures over a run's records.
#[derive(Serialize, Debug)]
pub struct Telemetry {
    pub benchmark_version: String,
    pub utility: Option<f64>,
    pub utility_under_attack: Option<f64>,
    pub asr: Option<f64>,
    pub injection_task_utility: Option<f64>,
    /// utility − utility_under_attack.
    pub utility_drop: Option<f64>,
    /// The denominators (cases, errors excluded) and hits behind each headline figure.
    pub denominators: BTreeMap<&'static str, Rate>,
    /// `suite/injection_task` → ASR over its attacked cases.
    pub asr_by_injection_task: BTreeMap<String, Rate>,
    /// One cell per (suite, user task, injection task), over all attacks.
    pub matrix: Vec<MatrixCell>,
    pub by_suite: BTreeMap<String, Breakdown>,
    pub by_attack: BTreeMap<String, Breakdown>,
    pub counts: Counts,
    pub format_health: FormatHealth,
    pub model_timing: ModelTiming,
}

/// How fast the model answered, from the agent's streamed calls: time to first token
/// (its mean per case, over cases) and the decode rate. Empty when nothing streamed.
#[derive(Serialize, Debug, Default, Clone, PartialEq)]
pub struct ModelTiming {
    pub streamed_calls: u64,
    pub ttft_s_mean: Option<f64>,
    /// The 95th percentile of the cases' mean time to first token.
    pub ttft_s_p95: Option<f64>,
    /// Completion tokens per second of decoding, over the streamed cases.
    pub decode_tokens_per_s: Option<f64>,
}

impl ModelTiming {
    pub fn of<'a>(records: impl IntoIterator<Item = &'a CaseRecord>) -> ModelTiming {
        let mut t = ModelTiming::default();
        let (mut ttft_ms, mut decode_ms, mut tokens) = (0u64, 0u64, 0u64);
        let mut per_case = Vec::new();
        for r in records {
            let (Some(calls), Some(ttft)) = (r.streamed_calls.filter(|&n| n > 0), r.ttft_ms) else { continue };
            t.streamed_calls = t.streamed_calls.saturating_add(calls);
            ttft_ms = ttft_ms.saturating_add(ttft);
            per_case.push(ttft as f64 / 1000.0 / calls as f64);
            decode_ms = decode_ms.saturating_add(r.decode_ms.unwrap_or(0));
            tokens = tokens.saturating_add(r.completion_tokens.unwrap_or(0));
        }
        if t.streamed_calls > 0 {
            t.ttft_s_mean = Some(ttft_ms as f64 / 1000.0 / t.streamed_calls as f64);
            t.ttft_s_p95 = util::percentile(per_case, 0.95);
        }
        t.decode_tokens_per_s = (decode_ms > 0).then(|| tokens as f64 / (decode_ms as f64 / 1000.0));
        t
    }

    /// One line for people.
    pub fn line(&self) -> String {
        let s = |v: Option<f64>, unit: &str| v.map_or("–".into(), |v| format!("{v:.2} {unit}"));
        format!(
            "{} streamed calls, time to first token {} (p95 of cases {}), decode {}",
            self.streamed_calls,
            s(self.ttft_s_mean, "s"),
            s(self.ttft_s_p95, "s"),
            s(self.decode_tokens_per_s, "tokens/s")
        )
    }
}

/// How well the model kept to the tool-calling format: scored, never errors. Totals
/// over the cases whose agent reported the counter (`cases_reporting`).
#[derive(Serialize, Debug, Default, Clone, PartialEq)]
pub struct FormatHealth {
    pub malformed_outputs: u64,
    pub unknown_tool_calls: u64,
    /// Generations cut off (at `max_tokens` by the server, or given up on by the agent
    /// after silence or at its time bound), scored with the text so far; also counted
    /// as malformed outputs.
    pub cut_generations: u64,
    /// Cases that ended with the server refusing the conversation for its length.
    pub context_overflows: usize,
    /// Attacked ones among them, which AgentDojo's rule counts in the ASR as landed.
    #[serde(skip_serializing_if = "crate::util::is_zero")]
    pub asr_overflows: u64,
    /// AgentDojo's re-runs of a task whose last turn had no model output.
    pub restarts: u64,
    /// Cases with at least one malformed output / unknown tool call.
    pub cases_with_malformed: usize,
    pub cases_with_unknown_tools: usize,
    pub cases_reporting: usize,
}

impl FormatHealth {
    pub fn of(records: &[CaseRecord]) -> FormatHealth {
        let mut h = FormatHealth::default();
        for r in records {
            h.malformed_outputs = h.malformed_outputs.saturating_add(r.malformed_outputs.unwrap_or(0));
            h.unknown_tool_calls = h.unknown_tool_calls.saturating_add(r.unknown_tool_calls.unwrap_or(0));
            h.cut_generations = h.cut_generations.saturating_add(r.cut_generations.unwrap_or(0));
            h.restarts = h.restarts.saturating_add(r.restarts.unwrap_or(0));
            h.context_overflows += usize::from(r.outcome() == crate::case::Outcome::ContextOverflow);
            h.asr_overflows += u64::from(r.is_overflow_counted_as_landed());
            h.cases_with_malformed += usize::from(r.malformed_outputs.is_some_and(|n| n > 0));
            h.cases_with_unknown_tools += usize::from(r.unknown_tool_calls.is_some_and(|n| n > 0));
            h.cases_reporting += usize::from(r.malformed_outputs.is_some() || r.unknown_tool_calls.is_some());
        }
        h
    }

    /// One line for people: totals and per case.
    pub fn line(&self, cases: usize) -> String {
        let per = |n: u64| if cases == 0 { 0.0 } else { n as f64 / cases as f64 };
        format!(
            "{} malformed outputs ({:.2}/case, {} cases, {} of them cut off), {} unknown-tool calls ({:.2}/case, {} \
             cases), {} context overflows, {} restarts",
            self.malformed_outputs,
            per(self.malformed_outputs),
            self.cases_with_malformed,
            self.cut_generations,
            self.unknown_tool_calls,
            per(self.unknown_tool_calls),
            self.cases_with_unknown_tools,
            self.context_overflows,
            self.restarts
        )
    }
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct MatrixCell {
    pub suite: String,
    pub user_task: String,
    pub injection_task: String,
    pub landed: usize,
    pub n: usize,
    pub asr: Option<f64>,
}

#[derive(Serialize, Debug, Default)]
pub struct Breakdown {
    pub utility: Rate,
    pub utility_under_attack: Rate,
    pub asr: Rate,
}

#[derive(Serialize, Debug, Default, PartialEq)]
pub struct Counts {
    pub planned: usize,
    pub recorded: usize,
    pub clean: usize,
    pub attacked: usize,
    pub injection_goal: usize,
    pub errors: usize,
}

fn kind(kind: CaseKind) -> impl Fn(&&CaseRecord) -> bool {
    move |record| record.kind == kind
}

fn breakdown<'a>(records: impl Iterator<Item = &'a CaseRecord> + Clone) -> Breakdown {
    Breakdown {
        utility: Rate::of(records.clone().filter(kind(CaseKind::Clean)), |r| r.utility),
        utility_under_attack: Rate::of(records.clone().filter(kind(CaseKind::Attacked)), |r| r.utility),
        asr: Rate::of(records.filter(kind(CaseKind::Attacked)), |r| r.security),
    }
}

pub fn compute(benchmark_version: &str, planned: usize, records: &[CaseRecord]) -> Telemetry {
    let all = breakdown(records.iter());
    let goal = Rate::of(records.iter().filter(kind(CaseKind::InjectionGoal)), |r| r.utility);
    let utility_drop = match (all.utility.value, all.utility_under_attack.value) {
        (Some(clean), Some(attacked)) => Some(clean - attacked),
        _ => None,
    };

    let attacked: Vec<&CaseRecord> = records.iter().filter(kind(CaseKind::Attacked)).collect();
    let mut asr_by_injection_task = BTreeMap::new();
    let mut cells: BTreeMap<(String, String, String), Vec<&CaseRecord>> = BTreeMap::new();
    for record in &attacked {
        let injection = record.injection_task.clone().unwrap_or_default();
        asr_by_injection_task.entry(format!("{}/{injection}", record.suite)).or_insert_with(Vec::new).push(*record);
        cells
            .entry((record.suite.clone(), record.user_task.clone().unwrap_or_default(), injection))
            .or_default()
            .push(*record);
    }
    let asr_by_injection_task = asr_by_injection_task
        .into_iter()
        .map(|(key, recs)| (key, Rate::of(recs.into_iter(), |r| r.security)))
        .collect();
    let matrix = cells
        .into_iter()
        .map(|((suite, user_task, injection_task), recs)| {
            let rate = Rate::of(recs.into_iter(), |r| r.security);
            MatrixCell { suite, user_task, injection_task, landed: rate.hits, n: rate.n, asr: rate.value }
        })
        .collect();

    let mut by_suite: BTreeMap<String, Vec<&CaseRecord>> = BTreeMap::new();
    let mut by_attack: BTreeMap<String, Vec<&CaseRecord>> = BTreeMap::new();
    for record in records {
        by_suite.entry(record.suite.clone()).or_default().push(record);
        if let Some(attack) = &record.attack {
            by_attack.entry(attack.clone()).or_default().push(record);
        }
    }

    Telemetry {
        benchmark_version: benchmark_version.to_string(),
        utility: all.utility.value,
        utility_under_attack: all.utility_under_attack.value,
        asr: all.asr.value,
        injection_task_utility: goal.value,
        utility_drop,
        denominators: BTreeMap::from([
            ("utility", all.utility.clone()),
            ("utility_under_attack", all.utility_under_attack.clone()),
            ("asr", all.asr.clone()),
            ("injection_task_utility", goal),
        ]),
        asr_by_injection_task,
        matrix,
        by_suite: by_suite.into_iter().map(|(k, v)| (k, breakdown(v.into_iter()))).collect(),
        by_attack: by_attack.into_iter().map(|(k, v)| (k, breakdown(v.into_iter()))).collect(),
        counts: Counts {
            planned,
            recorded: records.len(),
            clean: records.iter().filter(kind(CaseKind::Clean)).count(),
            attacked: attacked.len(),
            injection_goal: records.iter().filter(kind(CaseKind::InjectionGoal)).count(),
            errors: records.iter().filter(|r| r.is_error()).count(),
        },
        format_health: FormatHealth::of(records),
        model_timing: ModelTiming::of(records),
    }
}

/// A rate with its counts, `12.3 % (4/33)`; `–` when it has no denominator.
fn rate_text(rate: &Rate) -> String {
    match rate.value {
        Some(value) => format!("{} ({}/{})", util::pct(value), rate.hits, rate.n),
        None => "–".to_string(),
    }
}

/// The Markdown twin of `telemetry.json`, for people and chat.
pub fn markdown(title: &str, telemetry: &Telemetry) -> String {
    let d = &telemetry.denominators;
    let mut md = String::new();
    let _ = writeln!(md, "# {title}\n");
    let _ = writeln!(
        md,
        "AgentDojo benchmark {}; figures over non-errored cases (hits/cases).\n",
        telemetry.benchmark_version
    );
    let _ = writeln!(md, "| figure | value |\n|---|---|");
    // The names of `judge::words`: the ASR here is every attack's (R2 may judge the
    // held-out families only).
    use crate::words;
    let _ = writeln!(md, "| {} | {} |", words::UTILITY_CLEAN, rate_text(&d["utility"]));
    let _ = writeln!(md, "| {} | {} |", words::UTILITY_UNDER_ATTACK, rate_text(&d["utility_under_attack"]));
    let _ = writeln!(md, "| {} | {} |", words::ASR_ALL, rate_text(&d["asr"]));
    if let Some(note) = words::overflow_note(telemetry.format_health.asr_overflows, d["asr"].hits as u64) {
        let _ = writeln!(md, "\n{note}.\n");
    }
    let _ = writeln!(md, "| {} | {} |", words::INJECTION_GOAL_UTILITY, rate_text(&d["injection_task_utility"]));
    let c = &telemetry.counts;
    let _ = writeln!(
        md,
        "\nCases: {} planned, {} recorded ({} clean, {} attacked, {} injection goals), {} errors.\n",
        c.planned, c.recorded, c.clean, c.attacked, c.injection_goal, c.errors
    );
    let _ = writeln!(md, "Model format health: {}.\n", telemetry.format_health.line(c.recorded));
    let _ = writeln!(md, "Model timing: {}.\n", telemetry.model_timing.line());
    let _ = writeln!(
        md,
        "## By suite\n\n| suite | utility (clean) | utility under attack | ASR (all attacks) |\n|---|---|---|---|"
    );
    for (suite, b) in &telemetry.by_suite {
        let _ = writeln!(
            md,
            "| {suite} | {} | {} | {} |",
            rate_text(&b.utility),
            rate_text(&b.utility_under_attack),
            rate_text(&b.asr)
        );
    }
    if !telemetry.by_attack.is_empty() {
        let _ = writeln!(md, "\n## By attack\n\n| attack | utility under attack | ASR |\n|---|---|---|");
        for (attack, b) in &telemetry.by_attack {
            let _ = writeln!(md, "| {attack} | {} | {} |", rate_text(&b.utility_under_attack), rate_text(&b.asr));
        }
    }
    if !telemetry.asr_by_injection_task.is_empty() {
        let _ = writeln!(md, "\n## ASR by injection task\n\n| injection task | ASR |\n|---|---|");
        for (task, rate) in &telemetry.asr_by_injection_task {
            let _ = writeln!(md, "| {task} | {} |", rate_text(rate));
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::Case;

    fn record(
        kind: CaseKind,
        user: &str,
        injection: Option<&str>,
        utility: Option<bool>,
        security: Option<bool>,
    ) -> CaseRecord {
        let case = match (kind, injection) {
            (CaseKind::Attacked, Some(i)) => Case::attacked("s", user, i, "important_instructions"),
            (CaseKind::InjectionGoal, Some(i)) => Case::injection_goal("s", i),
            _ => Case::clean("s", user),
        };
        CaseRecord::of(&case, utility, security)
    }

    #[test]
    fn figures_use_agentdojo_polarity_and_exclude_errors() {
        let mut errored = record(CaseKind::Attacked, "u2", Some("i1"), None, None);
        errored.error = Some("timeout".into());
        let records = vec![
            record(CaseKind::Clean, "u1", None, Some(true), None),
            record(CaseKind::Clean, "u2", None, Some(false), None),
            record(CaseKind::Attacked, "u1", Some("i1"), Some(true), Some(true)),
            record(CaseKind::Attacked, "u2", Some("i1"), Some(false), Some(false)),
            record(CaseKind::Attacked, "u1", Some("i2"), Some(false), Some(true)),
            errored,
            record(CaseKind::InjectionGoal, "-", Some("i1"), Some(true), None),
        ];
        let t = compute("v1.2.2", 7, &records);
        assert_eq!(t.utility, Some(0.5));
        assert_eq!(t.asr, Some(2.0 / 3.0));
        assert_eq!(t.utility_under_attack, Some(1.0 / 3.0));
        assert_eq!(t.injection_task_utility, Some(1.0));
        assert_eq!(t.utility_drop, Some(0.5 - 1.0 / 3.0));
        assert_eq!(t.denominators["asr"].n, 3, "the errored case is not in the denominator");
        assert_eq!(t.counts, Counts { planned: 7, recorded: 7, clean: 2, attacked: 4, injection_goal: 1, errors: 1 });
        assert_eq!(t.asr_by_injection_task["s/i1"].value, Some(0.5));
        assert_eq!(t.matrix.len(), 3);
        assert!(markdown("x", &t).contains("| ASR (all attacks) | 66.7 % (2/3) |"));
    }
}
