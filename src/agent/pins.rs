//! What pruefstand sends for AgentDojo's defences and its `local` format, against the
//! installed agentdojo 0.1.35 in the managed venv: one Python run builds the same
//! conversation as AgentDojo messages, runs AgentDojo's own elements with a client that
//! records the request (`LocalLLM` with `tool_delimiter` `tool` and `input`,
//! `OpenAILLMToolFilter`), and hands over what the gym's adapter makes of the same
//! messages (`message_to_plain`, the tool schemas as `_tools` sends them). The agent's
//! request for those must be the recorded one. The gym's own elements are compared with
//! AgentDojo's in the gym's selftest (`scripts/selftest.py`).

use serde_json::{Value, json};

use super::format::{self, Message, ToolSpec};
use crate::settings::defence::{ToolCalling, ToolResultRole};

const AGENTDOJO: &str = r#"
import json, sys
from types import SimpleNamespace
sys.path.insert(0, sys.argv[1])
from agentdojo.agent_pipeline.agent_pipeline import TOOL_FILTER_PROMPT
from agentdojo.agent_pipeline.llms.local_llm import LocalLLM
from agentdojo.agent_pipeline.llms.openai_llm import OpenAILLMToolFilter
from agentdojo.agent_pipeline.pi_detector import PromptInjectionDetector
from agentdojo.functions_runtime import FunctionCall, FunctionsRuntime
from agentdojo.task_suite.load_suites import get_suite
from agentdojo.types import (ChatAssistantMessage, ChatSystemMessage, ChatToolResultMessage,
                             ChatUserMessage, text_content_block_from_string as block)
from pruefstand_gym.adapter import message_to_plain

class Client:
    """Records `chat.completions.create`'s arguments; answers `text`."""
    def __init__(self, text):
        self.chat = self.completions = self
        self.text, self.sent = text, None
    def create(self, **kwargs):
        self.sent = kwargs
        message = SimpleNamespace(content=self.text, tool_calls=None)
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])

suite = get_suite("v1.2.2", "banking")
runtime = FunctionsRuntime(suite.tools)
get_balance = FunctionCall(function="get_balance", args={}, id="c1")
send = FunctionCall(function="send_money", args={"recipient": "DE89", "amount": 5}, id="c2")
conversation = [
    ChatSystemMessage(role="system", content=[block("You are a bank assistant.")]),
    ChatUserMessage(role="user", content=[block("  What is my balance? \n")]),
    ChatAssistantMessage(role="assistant", content=[block("<function=get_balance>{}</function>")], tool_calls=[get_balance]),
    ChatToolResultMessage(role="tool", content=[block("1810.0 \u00fc\n\"q\"")], tool_call_id="c1", tool_call=get_balance, error=None),
    ChatAssistantMessage(role="assistant", content=[block("<function=send_money>{\"recipient\": \"DE89\", \"amount\": 5}</function>")], tool_calls=[send]),
    ChatToolResultMessage(role="tool", content=[block("")], tool_call_id="c2", tool_call=send, error="ValueError: no such IBAN"),
    ChatAssistantMessage(role="assistant", content=[block("<function=send_money>{}</function>")], tool_calls=[send]),
    ChatToolResultMessage(role="tool", content=[block("None")], tool_call_id="c2", tool_call=send, error=None),
]
local = {}
for delimiter in ("tool", "input"):
    client = Client("Done.")
    LocalLLM(client, "m", tool_delimiter=delimiter).query("q", runtime, messages=conversation)
    local[delimiter] = client.sent["messages"]
client = Client("get_balance, send_money")
opening = conversation[:2]
_, kept, _, after, _ = OpenAILLMToolFilter(TOOL_FILTER_PROMPT, client, "m").query("q", FunctionsRuntime(suite.tools), messages=opening)
tools = [{"name": n, "description": f.description, "parameters_schema": f.parameters.model_json_schema()}
         for n, f in runtime.functions.items()]
json.dump({
    "tools": tools,
    "plain": [message_to_plain(m) for m in conversation],
    "local": local,
    "filter": {"prompt": TOOL_FILTER_PROMPT, "sent": client.sent, "kept": sorted(kept.functions),
               "plain": [message_to_plain(m) for m in after[:-1]]},
    "replacement": PromptInjectionDetector().transform([block("x")])[0]["content"],
}, sys.stdout, default=str)
"#;

fn agentdojo() -> Value {
    let pyenv = crate::pyenv::PyEnv::ensure().expect("the managed venv (scripts/test creates it)");
    let output = std::process::Command::new(&pyenv.python)
        .args(["-c", AGENTDOJO])
        .arg(&pyenv.scripts)
        .output()
        .expect("python runs");
    assert!(output.status.success(), "AgentDojo's elements failed:\n{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A prompted system prompt as (text around the tool list, each tool's JSON). The JSON
/// is compared as values: AgentDojo lists a tool's parameters in their definition
/// order, and pruefstand — whose JSON objects keep their keys sorted — alphabetically.
/// That is the one difference left (a model reads `amount` before `recipient`), and it
/// is native mode's too; everything else must be equal byte for byte.
fn tool_blocks(system: &Value) -> (String, Vec<Value>, String) {
    let text = system.as_str().unwrap();
    let (head, rest) = text.split_once("## Currently Available Functions\n").unwrap();
    let (functions, tail) = rest.split_once("\n\n\n## Function Calling").unwrap();
    let blocks = functions.split("\n\n").map(|b| serde_json::from_str(b).unwrap()).collect();
    (head.to_string(), blocks, tail.to_string())
}

fn messages(v: &Value) -> Vec<Message> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn requests_match_agentdojos_own_elements() {
    let theirs = agentdojo();
    let tools: Vec<ToolSpec> = serde_json::from_value(theirs["tools"].clone()).unwrap();
    let plain = messages(&theirs["plain"]);

    // Prompted mode in AgentDojo's `local` format: every message, role and byte of
    // content — system prompt with the tools, the results' dumped blocks, the error.
    for (role, delimiter) in [(ToolResultRole::Tool, "tool"), (ToolResultRole::Input, "input")] {
        let (ours, none) = format::request(ToolCalling::Prompted, role, &plain, &tools);
        assert!(none.is_none());
        let local = theirs["local"][delimiter].as_array().unwrap();
        assert_eq!(ours.len(), local.len(), "{delimiter}");
        assert_eq!(ours[0]["role"], local[0]["role"]);
        let (ours_system, local_system) = (tool_blocks(&ours[0]["content"]), tool_blocks(&local[0]["content"]));
        assert_eq!(ours_system, local_system, "{delimiter}: the system prompt differs");
        for (i, (ours, local)) in ours.iter().zip(local).enumerate().skip(1) {
            assert_eq!(ours, local, "{delimiter}: message {i} differs");
        }
    }
    // The adapter keeps a tool's error apart, as AgentDojo's local element dumps it.
    assert_eq!(theirs["plain"][5]["error"], "ValueError: no such IBAN");

    // The tool filter: AgentDojo's prompt (the simulator recognises it by this text),
    // as the last user message, every tool offered, tool_choice "none".
    let filter = &theirs["filter"];
    assert_eq!(filter["prompt"], crate::sim::openai::TOOL_FILTER_PROMPT);
    assert_eq!(filter["sent"]["tool_choice"], "none");
    assert_eq!(filter["kept"], json!(["get_balance", "send_money"]));
    let (ours, ours_tools) =
        format::request(ToolCalling::Native, ToolResultRole::User, &messages(&filter["plain"]), &tools);
    let sent = filter["sent"]["messages"].as_array().unwrap();
    assert_eq!(ours.len(), sent.len());
    for (ours, sent) in ours.iter().zip(sent) {
        // AgentDojo's OpenAI element says `developer` for system and sends text parts.
        let role = match sent["role"].as_str().unwrap() {
            "developer" => "system",
            other => other,
        };
        let text: String = sent["content"].as_array().unwrap().iter().filter_map(|p| p["text"].as_str()).collect();
        assert_eq!((ours["role"].as_str().unwrap(), ours["content"].as_str().unwrap()), (role, text.as_str()));
    }
    let names = |tools: &[Value]| -> Vec<String> {
        tools.iter().map(|t| t["function"]["name"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names(&ours_tools.unwrap()), names(filter["sent"]["tools"].as_array().unwrap()));

    // The detector's replacement, which the simulated model must not mistake for data.
    assert_eq!(theirs["replacement"], "<Data omitted because a prompt injection was detected>");
}
