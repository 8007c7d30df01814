//! Fuzzing the agent: native and prompted model answers, streamed answers cut
//! anywhere, `agent.json`, and the gym's protocol lines against a real agent on the
//! simulated model; and the simulated model's HTTP surface read by the agent's stream
//! reader (here, above both). The harness: `pruefstand_core::fuzzing`.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};

use crate::format::{self, Turn};
use crate::{Agent, AgentConfig};
use pruefstand_core::fuzzing::{HOSTILE_TOML, any_text, check, fuzz, json_value, loaded_text, names_file};
use pruefstand_core::settings::sim::SimConfig;
use pruefstand_sim::server::Server;
use pruefstand_sim::testing::{sim_settings, test_runtime};

fn counter_ids() -> impl FnMut() -> String {
    let mut n = 0;
    move || {
        n += 1;
        format!("id-{n}")
    }
}

#[test]
fn prompted_answers_parse_like_agentdojo() {
    let input = (
        prop_oneof![any_text(), loaded_text(), (loaded_text(), loaded_text()).prop_map(|(a, b)| a + &b)],
        prop::option::of(prop::sample::select(vec!["stop", "length", "tool_calls", ""])),
    );
    fuzz("agent/prompted", 3000, input, |(completion, finish)| {
        let answer = format::parse_prompted(&completion, finish, &mut counter_ids());
        match &answer.turn {
            // At most the first tag is a call, and its text is the whole completion.
            Turn::Calls { calls, content } => check(
                calls.len() == 1 && answer.rejected.is_empty() && content.is_some() && completion.contains("<function"),
                || format!("{answer:?}"),
            ),
            Turn::Final(text) => {
                check(text.is_empty() <= answer.malformed && text.trim_matches(char::is_whitespace) == text, || {
                    format!("{answer:?}")
                })
            }
        }
    });
}

#[test]
fn native_answers_are_calls_rejections_or_a_final_answer() {
    let message = prop_oneof![
        json_value(),
        (json_value(), prop::collection::vec(json_value(), 0..4))
            .prop_map(|(content, calls)| json!({"content": content, "tool_calls": calls})),
        (prop::option::of(loaded_text()), prop::collection::vec((loaded_text(), json_value()), 1..4)).prop_map(
            |(content, calls)| {
                let calls: Vec<Value> = calls
                    .into_iter()
                    .map(|(name, arguments)| json!({"type": "function", "function": {"name": name, "arguments": arguments}}))
                    .collect();
                json!({"role": "assistant", "content": content, "tool_calls": calls})
            }
        ),
    ];
    let input = (message, prop::option::of(prop::sample::select(vec!["stop", "length", "tool_calls"])));
    fuzz("agent/native", 3000, input, |(message, finish)| {
        let offered = message.get("tool_calls").and_then(Value::as_array).map_or(0, Vec::len);
        let answer = format::parse_native(&message, finish, &mut counter_ids());
        match &answer.turn {
            // Every offered call is kept or rejected with a reason, none twice.
            Turn::Calls { calls, .. } => check(
                calls.len() + answer.rejected.len() == offered
                    && calls.iter().all(|c| !c.function.is_empty() && c.id.is_some())
                    && answer.malformed >= !answer.rejected.is_empty(),
                || format!("{offered} calls offered: {answer:?}"),
            ),
            Turn::Final(_) => check(offered == 0, || format!("{offered} calls offered: {answer:?}")),
        }
    });
}

/// A streamed answer, as server-sent event lines: real chunks, garbage, oversized
/// pieces and error events, cut into arbitrary pieces as the network delivers them.
fn stream_body() -> impl Strategy<Value = (Vec<u8>, Vec<usize>)> {
    let event = prop_oneof![
        loaded_text().prop_map(|t| format!("data: {}\n\n", json!({"choices": [{"delta": {"content": t}}]}))),
        (loaded_text(), loaded_text()).prop_map(|(name, args)| format!(
            "data: {}\n\n",
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": name, "arguments": args}}]}}]})
        )),
        json_value().prop_map(|v| format!("data: {v}\n")),
        any_text().prop_map(|t| format!("{t}\n")),
        (1usize..300_000).prop_map(|n| format!("data: {}\n", "x".repeat(n))),
        Just("data: [DONE]\n\n".to_string()),
        Just(": keep-alive\n".to_string()),
    ];
    (prop::collection::vec(event, 0..12), prop::collection::vec(1usize..70_000, 1..20))
        .prop_map(|(events, cuts)| (events.concat().into_bytes(), cuts))
}

#[test]
fn a_streamed_answer_folds_or_fails_in_words_however_it_arrives() {
    fuzz("agent/stream", 400, stream_body(), |(body, cuts)| {
        let mut assembly = crate::stream::Assembly::default();
        let (mut at, mut cut) = (0, cuts.iter().cycle());
        while at < body.len() {
            let end = (at + cut.next().copied().unwrap_or(1)).min(body.len());
            if let Err(message) = assembly.feed(&body[at..end]) {
                check(!message.is_empty(), || "an empty error".to_string())?;
                return Ok(());
            }
            at = end;
        }
        // Every byte counted toward the answer's limit; the message is always an object.
        check(assembly.size() == body.len(), || format!("{} of {} bytes counted", assembly.size(), body.len()))?;
        check(assembly.message().is_object(), || format!("{:?}", assembly.message()))
    });
}

#[test]
fn agent_config_parser_names_the_file() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    // The file a run writes for the default agent.
    let path = pruefstand_store::RunDir::new(dir.path()).agent_config_path();
    let shaped = (json_value(), json_value(), prop::sample::select(HOSTILE_TOML.to_vec())).prop_map(|(a, b, num)| {
        // NaN and infinities are not JSON; their TOML spelling makes the line unparsable.
        format!(r#"{{"model": {a}, "base_url": {b}, "request_timeout_s": {num}, "max_retries": 2}}"#)
    });
    fuzz("agent/config", 1000, prop_oneof![any_text(), shaped], |text| {
        std::fs::write(&path, &text).expect("writing agent.json");
        match AgentConfig::load(&path) {
            Ok(cfg) => check(!cfg.model.is_empty(), || format!("{cfg:?}")),
            Err(err) => names_file(&err, &path, &text),
        }
    });
}

/// A protocol message as the gym sends it, with hostile parts.
fn protocol_line() -> impl Strategy<Value = String> {
    let message = prop_oneof![
        json_value(),
        (
            prop::sample::select(vec!["user", "assistant", "tool", "system", "x", ""]),
            prop_oneof![loaded_text().prop_map(Value::from), json_value()],
            prop::collection::vec(json_value(), 0..3),
        )
            .prop_map(|(role, content, calls)| json!({"role": role, "content": content, "tool_calls": calls})),
    ];
    let query = (
        prop::option::of(loaded_text()),
        prop::collection::vec(message, 0..6),
        prop::collection::vec((loaded_text(), json_value()), 0..3),
    )
        .prop_map(|(prompt, messages, tools)| {
            let tools: Vec<Value> = tools
                .into_iter()
                .map(|(name, schema)| json!({"name": name, "description": "d", "parameters_schema": schema}))
                .collect();
            json!({"type": "query", "prompt": prompt, "messages": messages, "tools": tools}).to_string()
        });
    prop_oneof![
        4 => query,
        1 => json_value().prop_map(|v| v.to_string()),
        1 => (prop::sample::select(vec!["handshake", "case_start", "case_end", "query", "nope"]), json_value())
            .prop_map(|(kind, v)| json!({"type": kind, "case_id": v, "x": v}).to_string()),
        1 => any_text(),
        1 => any_text().prop_map(|t| format!("{{\"type\": \"query\", {t}")),
    ]
}

/// The agent, against the simulated model, reads every line the gym might send: a
/// query gets exactly one reply (an answer with its stats, or an error), anything else
/// none unless it looks like a query.
#[test]
fn agent_answers_each_query_once_and_survives_garbage() {
    let rt = test_runtime();
    let (server, agent) = rt.block_on(async {
        let mut config: SimConfig = toml::from_str("seed = 3").expect("a sim table");
        config.models.insert("base".into(), toml::from_str("susceptibility = 0.5").expect("a model"));
        let server = Server::start(sim_settings(config, "base"), "127.0.0.1:0".parse().expect("an address"))
            .await
            .expect("the simulated model");
        let cfg: AgentConfig = serde_json::from_value(json!({
            "base_url": server.base_url(), "model": "base", "max_retries": 0, "request_timeout_s": 5.0,
            "guardrail": {"kind": "heuristic"}, "human": {"policy": "approve_all"},
        }))
        .expect("an agent config");
        // The runner takes a `Fn`; the agent keeps state from line to line.
        (server, std::cell::RefCell::new(Agent::new(cfg).expect("the agent")))
    });
    fuzz("agent/protocol", 600, protocol_line(), |line| {
        let reply = rt.block_on(agent.borrow_mut().handle_line(&line));
        let msg: Option<Value> = serde_json::from_str(line.trim()).ok();
        let is_query = msg.as_ref().and_then(|m| m.get("type")).and_then(Value::as_str) == Some("query");
        match reply {
            Some(reply) => {
                let kinds = ["tool_calls", "final_answer", "error", "context_overflow"];
                check(kinds.iter().filter(|k| reply.get(**k).is_some()).count() == 1, || format!("{reply}"))?;
                check(is_query || msg.is_none(), || format!("a reply to a non-query: {reply}"))
            }
            None => check(!is_query, || "a query got no reply".into()),
        }
    });
    rt.block_on(server.shutdown()).expect("the simulated model stops");
}

/// A chat request of the right shape with hostile parts: roles, content shapes, calls
/// and tools, the served model or not, a key or not.
fn chat_request() -> impl Strategy<Value = (Value, Option<&'static str>)> {
    let content = prop_oneof![
        loaded_text().prop_map(Value::from),
        json_value(),
        loaded_text().prop_map(|t| json!([{"type": "text", "text": t}, {"content": t}])),
    ];
    let message = (
        prop::sample::select(vec!["system", "user", "assistant", "tool", "developer", "x"]),
        content,
        prop::option::of(prop::collection::vec(json_value(), 0..3)),
    )
        .prop_map(|(role, content, calls)| json!({"role": role, "content": content, "tool_calls": calls}));
    (
        prop::sample::select(vec!["base", "weak", "other", ""]),
        prop::collection::vec(message, 0..8),
        prop::option::of(prop::collection::vec(loaded_text(), 0..4)),
        prop::bool::weighted(0.1),
        prop::option::of(prop::sample::select(vec!["k", "wrong"])),
    )
        .prop_map(|(model, messages, tools, stream, key)| {
            let tools = tools.map(|names| {
                names.into_iter().map(|n| json!({"type": "function", "function": {"name": n}})).collect::<Vec<_>>()
            });
            (json!({"model": model, "messages": messages, "tools": tools, "stream": stream}), key)
        })
}

/// Over HTTP, every request gets an answer with a documented status: the handler never
/// panics (a panic drops the connection).
#[test]
fn sim_server_answers_every_request() {
    let rt = test_runtime();
    let server = rt.block_on(async {
        let mut config: SimConfig = toml::from_str("seed = 5").expect("a sim table");
        config.models.insert("weak".into(), toml::from_str("susceptibility = 1.0\nerror_rate = 0.3").expect("a model"));
        let mut settings = sim_settings(config, "base");
        settings.api_key = Some("k".into());
        Server::start(settings, "127.0.0.1:0".parse().expect("an address")).await.expect("the simulated model")
    });
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", server.base_url());
    let input = prop_oneof![
        4 => chat_request().prop_map(|(v, key)| (v.to_string().into_bytes(), key)),
        1 => (prop::collection::vec(any::<u8>(), 0..300), Just(Some("k"))),
    ];
    fuzz("sim/http", 600, input, |(body, key)| {
        rt.block_on(async {
            let mut request = client.post(&url).header("content-type", "application/json").body(body);
            if let Some(key) = key {
                request = request.bearer_auth(key);
            }
            let response = request.send().await.map_err(|e| TestCaseError::fail(format!("no answer: {e}")))?;
            let status = response.status().as_u16();
            let streamed = response.headers().get("content-type").is_some_and(|t| t == "text/event-stream");
            let text = response.text().await.map_err(|e| TestCaseError::fail(format!("no body: {e}")))?;
            check([200, 400, 401, 404].contains(&status), || format!("HTTP {status}: {text}"))?;
            if streamed {
                // A stream the agent folds into one whole message with its finish reason.
                let mut assembly = crate::stream::Assembly::default();
                let fed = assembly.feed(text.as_bytes());
                return check(
                    status == 200 && fed.is_ok() && assembly.done && assembly.finish_reason.is_some(),
                    || format!("HTTP {status}: {text}"),
                );
            }
            let v: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
            check(
                if status == 200 { v.pointer("/choices/0/message").is_some() } else { v.get("error").is_some() },
                || format!("HTTP {status}: {text}"),
            )
        })
    });
    rt.block_on(server.shutdown()).expect("the simulated model stops");
}
