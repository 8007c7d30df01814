//! R1's record checks: does every record say what the plan says its case is? A record
//! that leaves the ASR's denominator unnoticed (an attacked case without `security`, a
//! `kind` that says clean), a case recorded twice, or `suite`/`user_task` fields that move
//! it to another cluster would change the figures R2–R4 decide on. Each finding names
//! the line of `cases.jsonl` it is about.

use std::collections::{BTreeMap, BTreeSet};

use super::JudgeInput;
use pruefstand_core::case::{Case, CaseKind, CaseRecord};

/// One finding: where (the record's position, for ordering) and what, as one line.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Finding {
    pub position: usize,
    pub text: String,
}

/// What the record checks found, ordered by line (plan-level findings first).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct RecordCheck {
    pub findings: Vec<Finding>,
    /// Records whose case id was recorded before.
    pub duplicates: usize,
}

/// The case a case id stands for, read from the id itself (`suite/user/attack/injection`,
/// `suite/user/none/none`, `suite/goal/injection`); None when the id is not of that form.
pub(super) fn case_from_id(id: &str) -> Option<Case> {
    let parts: Vec<&str> = id.split('/').collect();
    let case = match parts.as_slice() {
        [suite, "goal", injection] => Case::injection_goal(suite, injection),
        [suite, user, "none", "none"] => Case::clean(suite, user),
        [suite, user, attack, injection] => Case::attacked(suite, user, injection, attack),
        _ => return None,
    };
    (case.id == id).then_some(case)
}

fn kind_word(kind: CaseKind) -> &'static str {
    match kind {
        CaseKind::Clean => "clean",
        CaseKind::Attacked => "attacked",
        CaseKind::InjectionGoal => "injection_goal",
    }
}

fn show(v: &Option<String>) -> String {
    v.as_deref().map_or_else(|| "null".to_string(), |s| format!("{s:?}"))
}

/// The first field in which `record` differs from `expected`, as "says X, the plan says Y".
fn field_mismatch(record: &CaseRecord, expected: &Case) -> Option<String> {
    if record.kind != expected.kind {
        return Some(format!("kind {}, the plan says {}", kind_word(record.kind), kind_word(expected.kind)));
    }
    if record.suite != expected.suite {
        return Some(format!("suite {:?}, the plan says {:?}", record.suite, expected.suite));
    }
    for (name, got, want) in [
        ("user_task", &record.user_task, &expected.user_task),
        ("injection_task", &record.injection_task, &expected.injection_task),
        ("attack", &record.attack, &expected.attack),
    ] {
        if got != want {
            return Some(format!("{name} {}, the plan says {}", show(got), show(want)));
        }
    }
    None
}

/// The outcome fields a record of this (planned) kind must and must not have.
fn outcome_problem(record: &CaseRecord, kind: CaseKind) -> Option<String> {
    if record.is_error() {
        return None;
    }
    if record.utility.is_none() {
        return Some("no utility and no error".to_string());
    }
    match (kind, record.security) {
        (CaseKind::Attacked, None) => Some("an attacked case without security and without error".to_string()),
        (CaseKind::Clean | CaseKind::InjectionGoal, Some(_)) => {
            Some(format!("security set on a {} case (only attacked cases have one)", kind_word(kind)))
        }
        _ => None,
    }
}

/// Checks every record against the plan (`plan.json`'s cases when present, else the
/// planned ids and what the ids say), plus the loader's type faults.
pub(super) fn check_records(input: &JudgeInput) -> RecordCheck {
    let mut out = RecordCheck::default();
    let label = |i: usize| match input.record_lines.get(i) {
        Some(line) => format!("cases.jsonl:{line}"),
        None => format!("record {}", i + 1),
    };
    let run = &input.run;
    let plan: Option<BTreeMap<&str, &Case>> =
        input.plan_cases.as_ref().map(|cases| cases.iter().map(|c| (c.id.as_str(), c)).collect());
    if let Some(cases) = &input.plan_cases {
        let ids: Vec<&str> = cases.iter().map(|c| c.id.as_str()).collect();
        if ids != run.planned_case_ids.iter().map(String::as_str).collect::<Vec<_>>() {
            out.findings.push(Finding { position: 0, text: "plan.json and run.json list different cases".to_string() });
        } else if pruefstand_core::plan::hash_of(&run.benchmark_version, cases, input.plan_adaptive.as_ref())
            != run.plan_hash
        {
            out.findings
                .push(Finding { position: 0, text: "plan.json's cases do not give run.json's plan hash".to_string() });
        }
    }
    // The loader's faults first: on their line they are the cause of what follows.
    for (line, what) in &input.record_faults {
        let position = input.record_lines.iter().position(|l| l == line).map_or(0, |i| i + 1);
        out.findings.push(Finding { position, text: format!("cases.jsonl:{line}: {what}") });
    }
    let planned: BTreeSet<&str> = run.planned_case_ids.iter().map(String::as_str).collect();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, record) in input.records.iter().enumerate() {
        let id = record.case_id.as_str();
        let at = label(i);
        let mut say = |text: String| out.findings.push(Finding { position: i + 1, text: format!("{at}: {text}") });
        if let Some(&first) = seen.get(id) {
            out.duplicates += 1;
            say(format!("case {id} recorded again (first at {})", label(first)));
            continue;
        }
        seen.insert(id, i);
        if !planned.contains(id) {
            say(format!("case {id} is not in the plan"));
            continue;
        }
        let expected = match &plan {
            Some(plan) => plan.get(id).map(|c| (*c).clone()),
            None => case_from_id(id),
        };
        let kind = match &expected {
            Some(case) => {
                if let Some(what) = field_mismatch(record, case) {
                    say(format!("case {id} says {what}"));
                }
                case.kind
            }
            None => {
                say(format!("case id {id} does not name a case (suite/user_task/attack/injection_task)"));
                record.kind
            }
        };
        if let Some(what) = outcome_problem(record, kind) {
            say(format!("case {id}: {what}"));
        }
    }
    out.findings.sort_by_key(|f| f.position);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_cases_and_nothing_else() {
        assert_eq!(case_from_id("banking/user_task_0/none/none"), Some(Case::clean("banking", "user_task_0")));
        assert_eq!(
            case_from_id("banking/user_task_0/important_instructions/injection_task_1"),
            Some(Case::attacked("banking", "user_task_0", "injection_task_1", "important_instructions"))
        );
        assert_eq!(
            case_from_id("slack/goal/injection_task_2"),
            Some(Case::injection_goal("slack", "injection_task_2"))
        );
        assert_eq!(case_from_id("a/b"), None);
        assert_eq!(case_from_id("a/b/c/d/e"), None);
    }
}
