//! Fuzzing the plan's parser: arbitrary and mutated texts never panic, and a plan with
//! hostile values resolves or is refused naming the file (the harness:
//! `crate::fuzzing`).

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::fuzzing::{Shape, any_text, check, fuzz, mutated, names_file, structured};
use crate::plan::{Filters, Plan, Profile};

const PLAN_SHAPE: Shape = &[
    (
        "",
        &[
            ("name", &["\"mini\""]),
            ("description", &["\"d\""]),
            ("benchmark_version", &["\"v1.2.2\""]),
            ("attacks", &["[\"important_instructions\"]", "[\"important_instructions\", \"tool_knowledge\"]"]),
            ("jobs", &["2"]),
            ("case_timeout_s", &["60"]),
            ("injection_goals", &["true", "false"]),
        ],
    ),
    (
        "[[suites]]",
        &[
            ("name", &["\"banking\""]),
            ("user_tasks", &["[\"user_task_0\", \"user_task_1\"]"]),
            ("injection_tasks", &["[\"injection_task_0\"]"]),
        ],
    ),
    (
        "[[suites]]",
        &[("name", &["\"slack\""]), ("user_tasks", &["[\"user_task_0\"]"]), ("attacks", &["[\"tool_knowledge\"]"])],
    ),
    ("[rules.R1]", &[("max_error_rate", &["0.05"])]),
    ("[rules.R2]", &[("asr_max", &["0.10"]), ("alpha_pass", &["0.03"]), ("clustering", &["\"crossed\""])]),
    ("[rules.R3]", &[("utility_min", &["0.5"]), ("alpha", &["0.05"])]),
    ("[rules.R4]", &[("margin", &["0.02"]), ("permutations", &["2000"]), ("seed", &["1"])]),
    ("[rules.R5]", &[("p95_case_s_max", &["120.0"]), ("tokens_per_case_max", &["40000"])]),
];

/// Writes the plan, loads and resolves it: accepted, or an error naming the file.
fn plan_property(
    path: &Path,
    text: &[u8],
    located: fn(&anyhow::Error, &Path, &str) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    std::fs::write(path, text).expect("writing the plan");
    let shown = String::from_utf8_lossy(text);
    match Plan::resolve(path, &super::tests::inventory(), &Filters::default()) {
        Ok(plan) => {
            let (profile, _) = Profile::load(path).expect("resolve loaded it");
            check(plan.jobs == profile.jobs && !plan.cases.is_empty(), || format!("{plan:?}"))
        }
        // Unreadable bytes are refused by the read, which names the file.
        Err(err) if std::str::from_utf8(text).is_err() => names_file(&err, path, &shown),
        Err(err) => located(&err, path, &shown),
    }
}

#[test]
fn plan_parser_never_panics_on_arbitrary_text() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("fuzzed.toml");
    let shipped = include_str!("../../../../profiles/schnell.toml");
    let input = prop_oneof![any_text().prop_map(String::into_bytes), mutated(shipped)];
    fuzz("plan/text", 1000, input, |text| plan_property(&path, &text, names_file));
}

#[test]
fn plan_parser_refuses_hostile_values_with_file() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("hostile.toml");
    // Rule thresholds are checked after parsing, by name: those errors name the file
    // and the rule but carry no line.
    fuzz("plan/hostile", 1500, structured(PLAN_SHAPE), |text| plan_property(&path, text.as_bytes(), names_file));
}
