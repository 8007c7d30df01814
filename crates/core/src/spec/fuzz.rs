//! Fuzzing the version spec's parser: arbitrary and mutated texts never panic, and a
//! spec with hostile values is accepted or refused naming the file and the line
//! (the harness: `crate::fuzzing`).

use proptest::prelude::*;

use crate::fuzzing::{Shape, any_text, fuzz, mutated, names_file, names_file_and_line, structured, versions_dir};
use crate::spec;

const SPEC_SHAPE: Shape = &[
    (
        "",
        &[
            ("description", &["\"demo\""]),
            ("reference", &["\"demo-baseline\"", "\"nope\""]),
            ("agent_cmd", &["[\"python3\", \"agent.py\"]"]),
        ],
    ),
    (
        "[model]",
        &[
            ("backend", &["\"sim\"", "\"docker\"", "\"external\""]),
            ("served_name", &["\"sim/qwen3-8b\""]),
            ("tool_calling", &["\"native\"", "\"prompted\""]),
            ("tool_result_role", &["\"user\"", "\"tool\"", "\"input\""]),
            ("image", &["\"vllm:1\""]),
            ("path", &["\"/models/x\""]),
            ("url", &["\"http://127.0.0.1:9/v1\""]),
            ("api_key_env", &["\"KEY\""]),
            ("display_name", &["\"Local model\""]),
            ("args", &["[\"--max-model-len\", \"8192\"]"]),
            ("shm_size", &["\"16g\""]),
            ("ipc", &["\"host\""]),
            ("ulimits", &["{ memlock = -1 }"]),
            ("ready_timeout_s", &["30.0"]),
            ("runtime_lora", &["true"]),
        ],
    ),
    ("[adapter]", &[("name", &["\"inj-harden-r3\""]), ("path", &["\"/adapters/x\""])]),
    (
        "[guardrail]",
        &[
            ("kind", &["\"heuristic\"", "\"none\"", "\"classifier\""]),
            ("threshold", &["0.5"]),
            ("timeout_s", &["10.0"]),
        ],
    ),
    ("[human]", &[("policy", &["\"approve_all\""])]),
    ("[sim]", &[("seed", &["7"])]),
    ("[sim.classifier]", &[("detects", &["0.95"]), ("false_positives", &["0.04"])]),
    (
        "[sim.latency]",
        &[
            ("base_ms", &["1.0"]),
            ("per_prompt_token_ms", &["0.0"]),
            ("per_completion_token_ms", &["0.0"]),
            ("capacity", &["4"]),
        ],
    ),
    ("[sim.models.\"sim/qwen3-8b\"]", &[("susceptibility", &["0.5"]), ("skill", &["0.9"]), ("error_rate", &["0.0"])]),
    (
        "[sim.models.\"sim/qwen3-8b\".faults]",
        &[("http_500", &["0.0"]), ("slow", &["0.0"]), ("slow_ms", &["10.0"]), ("think", &["0.5"])],
    ),
    ("[sim.models.\"inj-harden-r3\"]", &[("susceptibility", &["0.0"]), ("skill", &["0.9"])]),
];

#[test]
fn spec_parser_never_panics_on_arbitrary_text() {
    let (_dir, versions) = versions_dir();
    let path = versions.join("fuzzed.toml");
    let shipped = include_str!("../../../../versions/demo-kandidat.toml");
    let input = prop_oneof![any_text(), mutated(shipped).prop_map(|b| String::from_utf8_lossy(&b).into_owned())];
    fuzz("spec/text", 1500, input, |text| match spec::parse(&path, &text, &versions) {
        Ok(_) => Ok(()),
        Err(err) => names_file(&err, &path, &text),
    });
}

#[test]
fn spec_parser_refuses_hostile_values_with_file_and_line() {
    let (_dir, versions) = versions_dir();
    let path = versions.join("hostile.toml");
    fuzz("spec/hostile", 1500, structured(SPEC_SHAPE), |text| match spec::parse(&path, &text, &versions) {
        Ok(_) => Ok(()),
        Err(err) => names_file_and_line(&err, &path, &text),
    });
}
