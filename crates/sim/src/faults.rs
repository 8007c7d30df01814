//! The simulated model's misbehaviour on request (`[sim.models."<name>".faults]`): the
//! ways a real model's output or its server goes wrong, so the bench's handling of each
//! is tested end to end. Draws come from `draw::u`, keyed by seed, case and call, so
//! two versions see the same faults on the same calls. Not for what the model means to
//! do (`policy`) or the wire format (`openai`).

use serde_json::{Value, json};

use super::draw::u;
use super::openai::{Mode, Reply, tokens};
use super::policy::Script;
use pruefstand_core::settings::sim::Faults;

/// The one output fault a call may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    ContextOverflow,
    Http500,
    Empty,
    Truncated,
    BrokenJson,
    NonObjectArgs,
    UnknownTool,
    Prose,
    /// Generates filler until its token limit (the server's pacing: `server`).
    Ramble,
    /// Falls silent after a few tokens.
    Stall,
}

/// What this call draws.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Draws {
    pub fault: Option<Fault>,
    pub think: bool,
    pub slow: bool,
}

/// The draws of call number `call` (1-based) of the case `script` describes.
pub fn draw(seed: u64, faults: &Faults, script: &Script, call: usize) -> Draws {
    let injection = script.injection.as_ref().map_or("none", |(inj, _)| inj.as_str());
    let call = call.to_string();
    let hit = |name: &str, rate: f64| {
        rate > 0.0 && u(seed, &[&script.suite, &script.task, injection, "fault", name, &call]) < rate
    };
    let ordered = [
        (Fault::ContextOverflow, "context_overflow", faults.context_overflow),
        (Fault::Http500, "http_500", faults.http_500),
        (Fault::Empty, "empty", faults.empty),
        (Fault::Truncated, "truncated", faults.truncated),
        (Fault::BrokenJson, "broken_json", faults.broken_json),
        (Fault::NonObjectArgs, "non_object_args", faults.non_object_args),
        (Fault::UnknownTool, "unknown_tool", faults.unknown_tool),
        (Fault::Prose, "prose", faults.prose),
        (Fault::Ramble, "ramble", faults.ramble),
        (Fault::Stall, "stall", faults.stall),
    ];
    Draws {
        fault: ordered.into_iter().find(|(_, name, rate)| hit(name, *rate)).map(|(fault, _, _)| fault),
        think: hit("think", faults.think),
        slow: hit("slow", faults.slow),
    }
}

/// vLLM's answer when the conversation outgrew the model (HTTP 400), in its wording.
pub(crate) fn context_overflow_body(prompt_tokens: u64) -> Value {
    // vLLM 0.32's words, measured on the real server: no `context_length_exceeded`
    // code, the parameter is `input_tokens`.
    let limit = prompt_tokens.saturating_sub(1).max(1);
    json!({"error": {
        "message": format!("This model's maximum context length is {limit} tokens. However, your prompt contains at least {prompt_tokens} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value={prompt_tokens})"),
        "type": "BadRequestError", "param": "input_tokens", "code": 400}})
}

/// vLLM's body for a failure of its own (HTTP 500).
pub(crate) fn internal_error_body() -> Value {
    json!({"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}})
}

/// The words a rambling model repeats, one token each.
pub(crate) const RAMBLE_WORDS: [&str; 8] = ["Let", " me", " think", " about", " this", " once", " more", "."];

/// The context a rambling model without `max_tokens` talks to the end of.
pub(crate) const RAMBLE_CONTEXT: u64 = 8192;

/// Tokens a stalled stream sends before it falls silent.
pub(crate) const STALL_AFTER_TOKENS: u64 = 3;

/// The text of `n` rambling tokens.
pub(crate) fn ramble_text(n: u64) -> String {
    (0..n as usize).map(|i| RAMBLE_WORDS[i % RAMBLE_WORDS.len()]).collect()
}

/// A `<think>` block as reasoning models write it, before their answer.
pub(crate) const THINK: &str =
    "<think>\nThe user wants this done. I should use the tools I have and check each result.\n</think>\n\n";

/// Rewrites a rendered reply with an output fault and/or a think block. Faults that
/// only exist for calls (JSON, unknown tool, prose) leave a final answer as it is.
pub fn apply(reply: &mut Reply, mode: Mode, draws: &Draws) {
    let message = &mut reply.message;
    let is_call = match mode {
        Mode::Native => message["tool_calls"].as_array().is_some_and(|c| !c.is_empty()),
        Mode::Prompted => message["content"].as_str().is_some_and(|c| c.contains("<function=")),
    };
    match (draws.fault, mode) {
        (Some(Fault::Empty), _) => {
            message["content"] = json!("");
            if let Some(message) = message.as_object_mut() {
                message.remove("tool_calls");
            }
            reply.finish_reason = "stop";
        }
        (Some(Fault::Truncated), Mode::Native) if is_call => {
            let args = &mut message["tool_calls"][0]["function"]["arguments"];
            *args = json!(half(args.as_str().unwrap_or("{}")));
            reply.finish_reason = "length";
        }
        (Some(Fault::Truncated), _) => {
            message["content"] = json!(half(message["content"].as_str().unwrap_or("")));
            reply.finish_reason = "length";
        }
        (
            Some(fault @ (Fault::BrokenJson | Fault::NonObjectArgs | Fault::UnknownTool | Fault::Prose)),
            Mode::Native,
        ) if is_call => {
            let function = &mut message["tool_calls"][0]["function"];
            match fault {
                Fault::BrokenJson => {
                    function["arguments"] = json!(broken(function["arguments"].as_str().unwrap_or("{}")))
                }
                Fault::NonObjectArgs => {
                    function["arguments"] = json!(format!("[{}]", function["arguments"].as_str().unwrap_or("{}")))
                }
                Fault::UnknownTool => {
                    function["name"] = json!(format!("{}_v2", function["name"].as_str().unwrap_or("tool")))
                }
                _ => message["content"] = json!("Let me look that up with the right tool."),
            }
        }
        (
            Some(fault @ (Fault::BrokenJson | Fault::NonObjectArgs | Fault::UnknownTool | Fault::Prose)),
            Mode::Prompted,
        ) if is_call => {
            let text = message["content"].as_str().unwrap_or("").to_string();
            let (head, rest) = text.split_once('>').unwrap_or((&text, ""));
            let (args, tail) = rest.split_once("</function>").unwrap_or((rest, ""));
            message["content"] = json!(match fault {
                Fault::BrokenJson => format!("{head}>{}</function>{tail}", broken(args)),
                Fault::NonObjectArgs => format!("{head}>[{args}]</function>{tail}"),
                Fault::UnknownTool => format!("{head}_v2>{args}</function>{tail}"),
                _ => format!("Let me look that up first.\n{text}\nI will continue with the result."),
            });
        }
        _ => {}
    }
    if draws.think {
        let content = message["content"].as_str().unwrap_or("");
        message["content"] = json!(format!("{THINK}{content}"));
    }
    let text = message["content"].as_str().unwrap_or("").chars().count();
    let calls = message["tool_calls"].as_array().map_or(0, |c| c.iter().map(|c| c.to_string().chars().count()).sum());
    reply.completion_tokens = tokens(text + calls).max(1);
}

/// A rambling model's reply of `n` tokens, cut by its limit.
pub fn rambling(n: u64) -> Reply {
    Reply {
        message: json!({"role": "assistant", "content": ramble_text(n)}),
        finish_reason: "length",
        completion_tokens: n,
    }
}

/// What a stalled stream sends before it falls silent.
pub fn stalled() -> Reply {
    Reply {
        message: json!({"role": "assistant", "content": ramble_text(STALL_AFTER_TOKENS)}),
        finish_reason: "length",
        completion_tokens: STALL_AFTER_TOKENS,
    }
}

/// A reply longer than the request's `max_tokens` ends there, as vLLM's does:
/// `finish_reason: "length"`, the text (or the call's arguments) cut.
pub(crate) fn cut_to(reply: &mut Reply, max_tokens: u64) {
    if reply.completion_tokens <= max_tokens {
        return;
    }
    let keep = |text: &str| -> String { text.chars().take(max_tokens as usize * 4).collect() };
    let message = &mut reply.message;
    if let Some(args) = message.pointer_mut("/tool_calls/0/function/arguments") {
        *args = json!(keep(args.as_str().unwrap_or("")));
    } else {
        message["content"] = json!(keep(message["content"].as_str().unwrap_or("")));
    }
    reply.finish_reason = "length";
    reply.completion_tokens = max_tokens;
}

/// The first half of a text (a generation cut short).
fn half(text: &str) -> String {
    text.chars().take(text.chars().count() / 2).collect()
}

/// JSON with a trailing comma before its closing brace: what models often emit.
fn broken(args: &str) -> String {
    match args.trim_end().strip_suffix('}') {
        Some(body) => format!("{body},}}"),
        None => format!("{args},"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::render;
    use crate::policy::Action;
    use crate::truth::Call;

    fn call_reply(mode: Mode) -> Reply {
        let call = Call { function: "send_money".into(), args: json!({"amount": 5}) };
        render(&Action::Call(call), mode, 1)
    }

    fn with(fault: Fault) -> Draws {
        Draws { fault: Some(fault), ..Draws::default() }
    }

    #[test]
    fn native_faults_break_what_they_name() {
        let mut r = call_reply(Mode::Native);
        apply(&mut r, Mode::Native, &with(Fault::BrokenJson));
        let args = r.message["tool_calls"][0]["function"]["arguments"].as_str().unwrap().to_string();
        assert!(serde_json::from_str::<Value>(&args).is_err(), "{args}");
        let mut r = call_reply(Mode::Native);
        apply(&mut r, Mode::Native, &with(Fault::NonObjectArgs));
        let args = r.message["tool_calls"][0]["function"]["arguments"].as_str().unwrap().to_string();
        assert!(serde_json::from_str::<Value>(&args).unwrap().is_array());
        let mut r = call_reply(Mode::Native);
        apply(&mut r, Mode::Native, &with(Fault::UnknownTool));
        assert_eq!(r.message["tool_calls"][0]["function"]["name"], "send_money_v2");
        let mut r = call_reply(Mode::Native);
        apply(&mut r, Mode::Native, &with(Fault::Truncated));
        assert_eq!(r.finish_reason, "length");
        let mut r = call_reply(Mode::Native);
        apply(&mut r, Mode::Native, &Draws { think: true, ..with(Fault::Prose) });
        assert!(r.message["content"].as_str().unwrap().starts_with("<think>"));
        assert!(r.message["content"].as_str().unwrap().ends_with("right tool."));
    }

    #[test]
    fn prompted_faults_keep_agentdojos_tag() {
        let mut r = call_reply(Mode::Prompted);
        apply(&mut r, Mode::Prompted, &with(Fault::UnknownTool));
        assert_eq!(r.message["content"], "<function=send_money_v2>{\"amount\":5}</function>");
        let mut r = call_reply(Mode::Prompted);
        apply(&mut r, Mode::Prompted, &with(Fault::BrokenJson));
        assert_eq!(r.message["content"], "<function=send_money>{\"amount\":5,}</function>");
        let mut r = call_reply(Mode::Prompted);
        apply(&mut r, Mode::Prompted, &with(Fault::Empty));
        assert_eq!(r.message["content"], "");
    }

    #[test]
    fn overflow_speaks_vllms_words() {
        // The real server's body (vLLM 0.32 on CPU, a 2,049-token prompt at 2,048).
        let body = context_overflow_body(2049);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("This model's maximum context length is 2048 tokens. However, your prompt contains at least 2049 input tokens"), "{message}");
        assert_eq!(
            (body["error"]["param"].as_str(), body["error"]["code"].as_u64()),
            (Some("input_tokens"), Some(400))
        );
        assert!(!body.to_string().contains("context_length_exceeded"));
    }
}
