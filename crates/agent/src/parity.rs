//! The prompted-mode parser against AgentDojo's own: a corpus of generated messy
//! completions (prose around tags, missing closing tags, trailing commas, single
//! quotes, nested tags, unicode, empty) parsed by [`format::parse_prompted`] and by
//! `agentdojo.agent_pipeline.llms.local_llm._parse_model_output` in the managed venv
//! must give the same call (name and arguments) or the same final answer, and the same
//! text. Not covered, on purpose: `NaN`/`Infinity`, lone surrogates and numbers beyond
//! f64 — JSON that Python accepts and Rust's serde_json refuses.

use serde_json::{Value, json};

use super::format::{self, Turn};

const PREFIXES: [&str; 7] =
    ["", "Sure, let me check.\n", "  \n", "Ünïcödé 😀 — ", "\u{1c}", "Thought: pay.\n\n", "```\n"];
const TAGS: [&str; 11] = [
    "<function=get_balance>",
    "<function = send_money >",
    "<function=send_money\n>",
    "<function=>",
    "<function=a>b>",
    "<function=two words>",
    "<FUNCTION=get_balance>",
    "<function=get_balance",
    "<functio=x>",
    "<function=a><function=b>",
    "<function=\u{1c}send_money\u{1f}>",
];
const BODIES: [&str; 16] = [
    "{}",
    "{\"recipient\": \"DE89\", \"amount\": 5}",
    "{\"amount\": 5,}",
    "{'amount': 5}",
    "[1, 2]",
    "\"text\"",
    "42",
    "null",
    "{\"a\": {\"b\": [1, 2, {\"c\": null}]}}",
    "{\"a\": \"ü😀\\n\\u00e9\"}",
    "{\"a\": 1} {\"b\": 2}",
    "",
    "{\"a\": 1",
    "{\"a\": \"</function>\"}",
    "{\"a\": 1, \"a\": 2, \"big\": 123456789012345678901234567890, \"f\": 1.5e3}",
    "  {\"amount\": true}  ",
];
const CLOSERS: [&str; 5] = ["</function>", "", "</function> and then some prose", "\n</function>\n", "</Function>"];
const SUFFIXES: [&str; 4] = ["", "\nDone.", "  \n", "<function=get_balance>{}</function>"];

/// The corpus: every body under a rotating prefix, tag, closer and suffix, plus a few
/// completions without any tag. Deterministic.
fn corpus() -> Vec<String> {
    let mut out = vec![
        String::new(),
        "   ".into(),
        "The balance is 5.".into(),
        "function=get_balance {}".into(),
        "<function>{}</function>".into(),
        "😀".into(),
    ];
    // Two rounds, so each (tag, body) meets two different surroundings.
    let mut n = 0usize;
    for _round in 0..2 {
        for body in BODIES {
            for tag in TAGS {
                let prefix = PREFIXES[n % PREFIXES.len()];
                let closer = CLOSERS[(n / 3) % CLOSERS.len()];
                let suffix = SUFFIXES[(n / 7) % SUFFIXES.len()];
                out.push(format!("{prefix}{tag}{body}{closer}{suffix}"));
                n += 1;
            }
        }
    }
    out
}

/// AgentDojo's verdict on each completion: `{"content": text, "calls": [{function, args}]}`.
const AGENTDOJO: &str = r#"
import contextlib, json, sys
from agentdojo.agent_pipeline.llms.local_llm import _parse_model_output
from agentdojo.types import get_text_content_as_str
out = []
for completion in json.load(sys.stdin):
    with contextlib.redirect_stdout(sys.stderr):  # its "[debug] broken JSON" prints
        message = _parse_model_output(completion)
    calls = [{"function": c.function, "args": dict(c.args)} for c in (message["tool_calls"] or [])]
    out.append({"content": get_text_content_as_str(message["content"]), "calls": calls})
json.dump(out, sys.stdout)
"#;

#[test]
fn the_prompted_parser_agrees_with_agentdojos_on_a_messy_corpus() {
    let corpus = corpus();
    assert!(corpus.len() >= 200, "{} completions", corpus.len());
    let pyenv = pruefstand_gym::pyenv::PyEnv::ensure().expect("the managed venv (scripts/test creates it)");
    let mut child = std::process::Command::new(&pyenv.python)
        .args(["-c", AGENTDOJO])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python runs");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(serde_json::to_string(&corpus).unwrap().as_bytes()).unwrap();
    }
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "AgentDojo's parser failed");
    let theirs: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(theirs.len(), corpus.len());
    let (mut calls, mut finals, mut differ) = (0, 0, Vec::new());
    for (completion, theirs) in corpus.iter().zip(&theirs) {
        let answer = format::parse_prompted(completion, None, &mut || "id".to_string());
        let ours = match &answer.turn {
            Turn::Calls { calls: c, content } => {
                calls += 1;
                json!({"content": content, "calls": [{"function": c[0].function, "args": Value::Object(c[0].args.clone())}]})
            }
            Turn::Final(text) => {
                finals += 1;
                json!({"content": text, "calls": []})
            }
        };
        if &ours != theirs {
            differ.push(format!("{completion:?}\n  ours:   {ours}\n  theirs: {theirs}"));
        }
    }
    assert!(differ.is_empty(), "{} of {} differ:\n{}", differ.len(), corpus.len(), differ.join("\n"));
    // The corpus exercises both sides of the parser.
    assert!(calls >= 20 && finals >= 20, "{calls} calls, {finals} final answers");
}
