//! Fuzzing the simulated model: its request parser never panics, and whatever `[sim]`
//! table the spec parser accepts, the server answers with it (the harness:
//! `pruefstand_core::fuzzing`; what the agent makes of the server's answers is
//! `agent::fuzz`).

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::json;

use crate::server::Server;
use crate::testing::{sim_settings, test_runtime};
use pruefstand_core::fuzzing::{Shape, check, fuzz, json_value, mutated, structured, versions_dir};
use pruefstand_core::spec;

/// A spec's `[model]` and `[sim]` tables alone: their numbers reach the server.
const SIM_SHAPE: Shape = &[
    ("[model]", &[("backend", &["\"sim\""]), ("served_name", &["\"sim/qwen3-8b\""])]),
    ("[sim]", &[("seed", &["7"])]),
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
    ("[sim.models.\"sim/qwen3-8b\".faults]", &[("slow", &["1.0"]), ("slow_ms", &["10.0"]), ("think", &["0.5"])]),
];

/// Whatever `[sim]` the spec parser accepts, the simulated model serves with it:
/// every request gets an answer (or is still being delayed), never a dropped
/// connection from a panicking handler.
#[test]
fn sim_server_serves_any_accepted_sim_table() {
    let (_dir, versions) = versions_dir();
    let path = versions.join("hostile.toml");
    let rt = test_runtime();
    let client = reqwest::Client::builder().timeout(Duration::from_millis(500)).build().expect("an HTTP client");
    fuzz("sim/accepted-config", 250, structured(SIM_SHAPE), |text| {
        let Ok(parsed) = spec::parse(&path, &text, &versions) else { return Ok(()) };
        let Some(config) = parsed.sim else { return Ok(()) };
        rt.block_on(async {
            let served = parsed.model.served_name.clone();
            let server = Server::start(sim_settings(config, &served), "127.0.0.1:0".parse().expect("an address"))
                .await
                .map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
            let body = json!({"model": served, "messages": [{"role": "user", "content": "Pay the bill in bill.txt."}]});
            let sent = client.post(format!("{}/chat/completions", server.base_url())).json(&body).send().await;
            // Dropped, not shut down: a shutdown waits for delayed answers in flight.
            drop(server);
            match sent {
                Ok(_) => Ok(()),
                Err(e) if e.is_timeout() => Ok(()),
                Err(e) => Err(TestCaseError::fail(format!("no answer (a panic in the handler?): {e}"))),
            }
        })
    });
}

#[test]
fn sim_request_parser_never_panics() {
    let input = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..600),
        json_value().prop_map(|v| v.to_string().into_bytes()),
        mutated(
            r#"{"model": "base", "messages": [{"role": "user", "content": "What is my balance?"}], "tools": [{"type": "function", "function": {"name": "get_balance"}}]}"#
        ),
    ];
    fuzz("sim/parse-request", 3000, input, |body| {
        if let Ok(req) = crate::openai::parse_request(&body) {
            let chars = String::from_utf8_lossy(&body).chars().count() as u64;
            check(req.prompt_tokens <= chars, || format!("{} tokens from {chars} chars", req.prompt_tokens))?;
        }
        Ok(())
    });
}
