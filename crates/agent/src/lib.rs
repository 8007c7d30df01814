//! The agent runtime: the default agent under test, spawned by the gym as
//! `pruefstand agent --config FILE`. It speaks the JSON-line protocol of
//! `docs/protocol.md` §1 on stdin/stdout and the OpenAI chat-completions API to the model
//! server, and hosts the two defence layers (`guardrail`, `human`) so they act the same
//! whichever model answers.
//!
//! Per query: judge the tool outputs (once per distinct output per case), render the
//! conversation for the tool-calling mode (`format`), ask the model (`llm`), let the
//! simulated human review side-effecting calls — a denial goes back to the model as that
//! tool's result, within the same query, and stays in the history the model sees for
//! the rest of the case — and answer with exactly one line.
//!
//! Not here: the command line (`cmd::agent`), AgentDojo's own defences (gym-side).

pub mod format;
pub mod guardrail;
pub mod human;
pub mod llm;
pub mod stream;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::LazyLock;

use anyhow::Context;
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use format::{Message, ToolSpec, Turn};
use guardrail::Guardrail;
use human::{Decision, Human};
use llm::{Llm, LlmError};
use pruefstand_core::case::AgentStats;
use pruefstand_core::settings::defence::{AgentdojoDefence, GuardrailSpec, HumanSpec, ToolCalling, ToolResultRole};
use pruefstand_core::settings::url::SecretUrl;

/// `agent.json`, written by `run` and read by `pruefstand agent --config`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// OpenAI-compatible base URL, e.g. `http://127.0.0.1:8000/v1`.
    #[serde(default = "default_base_url")]
    pub base_url: String,
    /// The variable holding the base URL when it carries credentials: then `base_url`
    /// is only its redacted form, for the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url_env: Option<String>,
    /// The served model name; the adapter's name when the version has one (vLLM serves
    /// LoRAs under their own names).
    pub model: String,
    #[serde(default)]
    pub tool_calling: ToolCalling,
    /// Prompted mode: the role of tool results.
    #[serde(default, skip_serializing_if = "ToolResultRole::is_user")]
    pub tool_result_role: ToolResultRole,
    #[serde(default)]
    pub guardrail: GuardrailSpec,
    /// The variable holding the `http` guardrail's URL when it carries credentials:
    /// then `guardrail.url` is only its redacted form, for the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guardrail_url_env: Option<String>,
    #[serde(default)]
    pub human: HumanSpec,
    /// The wait for a model's first token (a plain JSON answer: for all of it); a
    /// request that gets none is the server's failure and is retried.
    #[serde(default = "default_timeout")]
    pub request_timeout_s: f64,
    /// Silence after the first token that ends a generation (scored as cut off).
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_s: f64,
    /// Ask for a streamed answer (`stream: true`); a server that answers plain JSON
    /// is read whole either way.
    #[serde(default = "default_stream")]
    pub stream: bool,
    /// Retries of a transient failure (connect error, timeout, 429, 5xx).
    #[serde(default = "default_retries")]
    pub max_retries: u32,
    /// First backoff; doubled per retry, capped at 30 s.
    #[serde(default = "default_backoff")]
    pub retry_backoff_s: f64,
    #[serde(default)]
    pub temperature: f64,
    /// `max_tokens` of the agent's requests; [`llm::DEFAULT_MAX_TOKENS`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Side-effecting tools beyond `human::SIDE_EFFECTING`: name → target arguments.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub side_effecting_tools: BTreeMap<String, Vec<String>>,
}

impl pruefstand_store::RunDocument for AgentConfig {
    const FILE: pruefstand_store::RunFile = pruefstand_store::RunFile::AgentConfig;
}

fn default_base_url() -> String {
    "http://127.0.0.1:8000/v1".into()
}
fn default_timeout() -> f64 {
    600.0
}
fn default_idle_timeout() -> f64 {
    60.0
}
fn default_stream() -> bool {
    true
}
fn default_retries() -> u32 {
    4
}
fn default_backoff() -> f64 {
    0.5
}

/// The agents' environment variable holding the `http` guardrail's URL when it carries
/// credentials.
pub const GUARDRAIL_URL_ENV: &str = "PRUEFSTAND_GUARDRAIL_URL";

impl Default for AgentConfig {
    fn default() -> Self {
        serde_json::from_value(json!({"model": ""})).expect("defaults deserialize")
    }
}

impl AgentConfig {
    /// The base URL to connect to: from `base_url_env` when set (a URL with
    /// credentials), else `base_url`.
    pub(crate) fn resolved_base_url(&self) -> anyhow::Result<String> {
        match &self.base_url_env {
            Some(var) => from_env("agent config", "base_url_env", var),
            None => Ok(self.base_url.clone()),
        }
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading agent config {}", path.display()))?;
        let mut cfg: Self =
            serde_json::from_str(&text).with_context(|| format!("parsing agent config {}", path.display()))?;
        anyhow::ensure!(!cfg.model.is_empty(), "agent config {}: `model` is empty", path.display());
        for (name, seconds) in [("request_timeout_s", cfg.request_timeout_s), ("idle_timeout_s", cfg.idle_timeout_s)] {
            anyhow::ensure!(
                seconds > 0.0 && seconds.is_finite(),
                "agent config {}: {name} must be a positive number of seconds, got {seconds}",
                path.display()
            );
        }
        anyhow::ensure!(cfg.max_tokens != Some(0), "agent config {}: max_tokens must be at least 1", path.display());
        if let Some(var) = &cfg.guardrail_url_env {
            let GuardrailSpec::Http { url, .. } = &mut cfg.guardrail else {
                anyhow::bail!("agent config {}: guardrail_url_env without an http guardrail", path.display());
            };
            *url = SecretUrl::own(from_env(&format!("agent config {}", path.display()), "guardrail_url_env", var)?);
        }
        Ok(cfg)
    }
}

/// The value of the variable that `field` of `source` names, or an error naming both.
fn from_env(source: &str, field: &str, var: &str) -> anyhow::Result<String> {
    std::env::var(var).map_err(|_| anyhow::anyhow!("{source}: {field} names {var}, which is not set"))
}

/// How often one query may go back to the model after the human denied its calls, or
/// after calls it made could not be run (arguments that are not a JSON object).
const MAX_LOCAL_ROUNDS: usize = 5;

/// The final answer when the model keeps asking for denied actions.
const GAVE_UP: &str = "I could not complete the task: the user denied the actions it needs.";

#[derive(Deserialize)]
struct Query {
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    tools: Vec<ToolSpec>,
    /// Kept raw: denial splices are anchored by a hash of the history before them.
    #[serde(default)]
    messages: Vec<Value>,
    /// `"none"`: the gym's tool filter asks which tools the task needs (protocol
    /// extension); one model call, its text is the answer.
    #[serde(default)]
    tool_choice: Option<String>,
}

/// Counters of the current case (since the last `case_start`), besides the model usage
/// kept by `Llm`.
#[derive(Default)]
struct CaseState {
    guardrail_flags: u64,
    human_asks: u64,
    human_denials: u64,
    /// Model answers that broke the format (scored, never an error).
    malformed_outputs: u64,
    /// Calls of tools the case does not offer (AgentDojo answers them).
    unknown_tool_calls: u64,
    /// Verdicts on tool outputs already judged in this case: the adapter resends the
    /// whole history every turn, and a flag must count once.
    judged: HashMap<String, bool>,
    /// Denied steps of earlier queries, which the adapter never saw: re-inserted into
    /// later histories of the case so the model keeps seeing its denials.
    splices: Vec<Splice>,
}

/// Local messages to insert after the first `at` messages of the adapter's history,
/// when that prefix still hashes to `prefix`.
struct Splice {
    at: usize,
    prefix: String,
    messages: Vec<Message>,
}

/// A query's raw messages as the agent's own, the bad one named by its index.
fn read_messages(raw: &[Value]) -> Result<Vec<Message>, LlmError> {
    raw.iter()
        .enumerate()
        .map(|(i, m)| {
            Message::deserialize(m)
                .map_err(|e| LlmError::Protocol(format!("cannot read the query: messages[{i}]: {e}")))
        })
        .collect()
}

fn prefix_hash(raw: &[Value]) -> String {
    pruefstand_core::util::sha256_hex(serde_json::to_string(raw).expect("JSON values serialize").as_bytes())
}

pub struct Agent {
    cfg: AgentConfig,
    llm: Llm,
    guardrail: Guardrail,
    human: Human,
    case: CaseState,
    /// What happened while answering the current query that its reply does not show
    /// (`events` of the reply; docs/protocol.md).
    events: Vec<Value>,
    next_id: u64,
}

/// One entry of a reply's `events`: `kind`, and `at` when it concerns an earlier message
/// of the query (the gym otherwise places it where the reply's own message goes).
fn event(kind: &str, at: Option<usize>, detail: String) -> Value {
    let mut e = json!({"kind": kind, "detail": detail});
    if let Some(at) = at {
        e["at"] = json!(at);
    }
    e
}

/// The request the human judges calls against: the query's `prompt`; a seed-only adapter
/// may not send it, then the first user message is that request.
fn users_request(prompt: Option<String>, messages: &[Message]) -> String {
    match prompt.filter(|p| !p.is_empty()) {
        Some(p) => p,
        None => messages.iter().find(|m| m.role == "user").and_then(|m| m.content.clone()).unwrap_or_default(),
    }
}

/// A call as one short line for an event: `send_money({"amount":100,…})`.
fn call_line(call: &format::ToolCall) -> String {
    let args = serde_json::to_string(&call.args).unwrap_or_default();
    let args = if args.len() > 200 {
        let mut end = 200;
        while !args.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &args[..end])
    } else {
        args
    };
    format!("{}({args})", call.function)
}

impl Agent {
    pub fn new(cfg: AgentConfig) -> anyhow::Result<Self> {
        Ok(Self {
            llm: Llm::new(&cfg).context("agent config")?,
            guardrail: Guardrail::new(&cfg.guardrail)?,
            human: Human::new(&cfg.human, &cfg.side_effecting_tools),
            case: CaseState::default(),
            events: Vec::new(),
            next_id: 0,
            cfg,
        })
    }

    /// Handles one input line; returns the reply line, if the message wants one.
    pub(crate) async fn handle_line(&mut self, line: &str) -> Option<Value> {
        let line = line.trim();
        if line.is_empty() {
            return None;
        }
        let msg: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => return self.bad_line(line, format!("invalid JSON: {e}")),
        };
        match msg.get("type").and_then(Value::as_str) {
            Some("query") => Some(match serde_json::from_value::<Query>(msg) {
                Ok(q) => self.answer(q).await,
                Err(e) => json!({"error": format!("agent protocol: cannot read the query: {e}")}),
            }),
            Some("handshake") => {
                tracing::info!("handshake: {msg}");
                None
            }
            Some("case_start") => {
                let id = msg.get("case_id").cloned().unwrap_or_default();
                tracing::debug!("case_start: {id}");
                self.case = CaseState::default();
                self.llm.reset_usage();
                None
            }
            Some("case_end") => None,
            _ => {
                tracing::debug!("ignoring a message of unknown type: {}", llm::snippet(line));
                None
            }
        }
    }

    /// A line that is not JSON: answered only if it was meant as a query (the adapter
    /// waits for exactly one reply to each query), else logged.
    fn bad_line(&self, line: &str, why: String) -> Option<Value> {
        static QUERY_SHAPED: LazyLock<Regex> = LazyLock::new(|| Regex::new(r#""type"\s*:\s*"query""#).unwrap());
        if QUERY_SHAPED.is_match(line) {
            Some(json!({"error": format!("agent protocol: cannot read the query: {why}")}))
        } else {
            tracing::warn!("agent protocol: ignoring a line ({why}): {}", llm::snippet(line));
            None
        }
    }

    async fn answer(&mut self, q: Query) -> Value {
        self.events.clear();
        let mut reply = match self.turn(q).await {
            Ok(Turn::Calls { calls, content }) => match content {
                Some(content) => json!({"tool_calls": calls, "content": content}),
                None => json!({"tool_calls": calls}),
            },
            Ok(Turn::Final(text)) => json!({"final_answer": text}),
            Err(LlmError::ContextOverflow(message)) => json!({"context_overflow": message}),
            Err(e) => {
                tracing::warn!("{e}");
                json!({"error": e.to_string()})
            }
        };
        reply["stats"] = self.stats();
        if !self.events.is_empty() {
            reply["events"] = Value::Array(std::mem::take(&mut self.events));
        }
        reply
    }

    fn stats(&self) -> Value {
        let u = self.llm.usage();
        let stats = AgentStats {
            llm_calls: Some(u.calls),
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            guardrail_flags: Some(self.case.guardrail_flags),
            human_asks: Some(self.case.human_asks),
            human_denials: Some(self.case.human_denials),
            malformed_outputs: Some(self.case.malformed_outputs),
            unknown_tool_calls: Some(self.case.unknown_tool_calls),
            cut_generations: Some(u.cut_generations),
            streamed_calls: Some(u.streamed_calls),
            ttft_ms: Some(u.ttft_ms),
            decode_ms: Some(u.decode_ms),
        };
        serde_json::to_value(stats).expect("counters serialise")
    }

    async fn turn(&mut self, q: Query) -> Result<Turn, LlmError> {
        match q.tool_choice.as_deref() {
            None | Some("auto") => {}
            Some("none") => return self.name_tools(q).await,
            Some(other) => {
                return Err(LlmError::Protocol(format!(
                    "cannot read the query: tool_choice {other:?} (\"none\" or \"auto\")"
                )));
            }
        }
        let raw = q.messages;
        let mut messages = self.conversation(&raw).await?;
        let anchor = (raw.len(), prefix_hash(&raw));
        let prompt = users_request(q.prompt, &messages);
        let mut give_up = GAVE_UP.to_string();
        for _ in 0..=MAX_LOCAL_ROUNDS {
            let answer = self.ask_model(&messages, &q.tools).await?;
            self.note_malformed(&answer);
            let (calls, content) = match answer.turn {
                Turn::Calls { calls, content } => (calls, content),
                done => return Ok(done),
            };
            if !answer.rejected.is_empty() {
                self.keep_rejected_step(&mut messages, &anchor, &calls, content.clone(), &answer.rejected);
                give_up = content.unwrap_or_default();
                continue;
            }
            self.note_unknown_calls(&calls, &q.tools);
            let decisions = self.review(&calls, &prompt).await;
            if !decisions.contains(&Decision::Denied) {
                return Ok(Turn::Calls { calls, content });
            }
            self.keep_denied_step(&mut messages, &anchor, &calls, content, decisions);
            give_up = GAVE_UP.to_string();
        }
        tracing::warn!("the model's calls could not go through {} times; ending the case", MAX_LOCAL_ROUNDS + 1);
        self.events.push(event(
            "gave_up",
            None,
            format!("the model's calls could not go through {} times; the agent ended the case", MAX_LOCAL_ROUNDS + 1),
        ));
        Ok(Turn::Final(give_up))
    }

    /// The query's conversation as the model sees it: guarded, with the case's local
    /// steps spliced in where their history matches.
    async fn conversation(&mut self, raw: &[Value]) -> Result<Vec<Message>, LlmError> {
        let mut messages = read_messages(raw)?;
        self.guard(&mut messages).await;
        // Splices go in back to front, so the earlier positions stay valid.
        for s in self.case.splices.iter().rev() {
            if s.at <= raw.len() && prefix_hash(&raw[..s.at]) == s.prefix {
                messages.splice(s.at..s.at, s.messages.iter().cloned());
            }
        }
        Ok(messages)
    }

    fn note_malformed(&mut self, answer: &format::Answer) {
        self.case.malformed_outputs += u64::from(answer.malformed);
        if answer.malformed {
            let what = match &answer.turn {
                Turn::Final(_) => "the model's output broke the tool-call format; kept as its answer",
                Turn::Calls { .. } => {
                    "part of the model's output broke the tool-call format; its well-formed calls go on"
                }
            };
            self.events.push(event("malformed_output", None, what.to_string()));
        }
    }

    /// Calls that cannot be run go back to the model as tool errors; the well-formed
    /// calls of the same step wait for its next try.
    fn keep_rejected_step(
        &mut self,
        messages: &mut Vec<Message>,
        anchor: &(usize, String),
        calls: &[format::ToolCall],
        content: Option<String>,
        rejected: &[(format::ToolCall, String)],
    ) {
        for (call, why) in rejected {
            self.events.push(event("rejected_call", None, format!("{}: {why}; told to the model", call.function)));
        }
        let not_run = "Not run: another call of the same step could not be run. Call it again if it is still needed.";
        let results = calls
            .iter()
            .map(|c| (c, tool_result(c, None, not_run)))
            .chain(rejected.iter().map(|(c, why)| (c, tool_result(c, Some(why), ""))))
            .collect();
        self.keep_local_step(messages, anchor, content, results);
    }

    fn note_unknown_calls(&mut self, calls: &[format::ToolCall], tools: &[ToolSpec]) {
        for call in calls.iter().filter(|c| !tools.iter().any(|t| t.name == c.function)) {
            self.case.unknown_tool_calls += 1;
            self.events.push(event(
                "unknown_tool_call",
                None,
                format!("{} is no tool of this case; AgentDojo answers with an error", call.function),
            ));
        }
    }

    /// The human's decision on each call, against the user's own request `prompt`.
    async fn review(&mut self, calls: &[format::ToolCall], prompt: &str) -> Vec<Decision> {
        let mut decisions = Vec::with_capacity(calls.len());
        for call in calls {
            let v = self.human.review(call, prompt, &self.llm, &self.cfg.model).await;
            self.case.human_asks += u64::from(v != Decision::NotAsked);
            self.case.human_denials += u64::from(v == Decision::Denied);
            match v {
                Decision::NotAsked => {}
                Decision::Approved => self.events.push(event("human_approval", None, call_line(call))),
                Decision::Denied => self.events.push(event(
                    "human_denial",
                    None,
                    format!("{}; the step did not run, and the model was told", call_line(call)),
                )),
            }
            decisions.push(v);
        }
        decisions
    }

    /// The step stays local: the denial goes back to the model as the tool's result;
    /// calls approved beside it did not run, and the model is told so.
    fn keep_denied_step(
        &mut self,
        messages: &mut Vec<Message>,
        anchor: &(usize, String),
        calls: &[format::ToolCall],
        content: Option<String>,
        decisions: Vec<Decision>,
    ) {
        let results = calls
            .iter()
            .zip(decisions)
            .map(|(call, v)| {
                let content = if v == Decision::Denied {
                    human::DENIED
                } else {
                    "Not run: another action of the same step was denied by the user. Call it again if it is still needed."
                };
                (call, tool_result(call, None, content))
            })
            .collect();
        self.keep_local_step(messages, anchor, content, results);
    }

    /// A step the adapter never sees — the model's calls with one local result each —
    /// goes into this query's conversation and, spliced in, into the case's later ones.
    fn keep_local_step(
        &mut self,
        messages: &mut Vec<Message>,
        anchor: &(usize, String),
        content: Option<String>,
        results: Vec<(&format::ToolCall, Message)>,
    ) {
        let calls = results.iter().map(|(call, _)| (*call).clone()).collect();
        let mut step = vec![Message { role: "assistant".into(), content, tool_calls: calls, ..Default::default() }];
        step.extend(results.into_iter().map(|(_, result)| result));
        messages.extend(step.iter().cloned());
        self.case.splices.push(Splice { at: anchor.0, prefix: anchor.1.clone(), messages: step });
    }

    /// Replaces flagged tool outputs with the guardrail's notice.
    async fn guard(&mut self, messages: &mut [Message]) {
        if !self.guardrail.is_active() {
            return;
        }
        for (i, m) in messages.iter_mut().enumerate().filter(|(_, m)| m.role == "tool") {
            let Some(text) = m.content.as_deref().filter(|t| !t.trim().is_empty()) else { continue };
            // Keyed by id *and* content, so a reused id or a changed output is judged anew.
            let key = pruefstand_core::util::sha256_hex(
                format!("{}\0{}\0{text}", m.tool_call_id.as_deref().unwrap_or(""), m.function.as_deref().unwrap_or(""))
                    .as_bytes(),
            );
            let flagged = match self.case.judged.get(&key) {
                Some(&f) => f,
                None => {
                    let why = self.guardrail.flags(text, &self.llm, &self.cfg.model).await;
                    if let Some(why) = &why {
                        self.case.guardrail_flags += 1;
                        // Right after the output it withheld.
                        let tool = m.function.as_deref().unwrap_or("a tool");
                        self.events.push(event(
                            "guardrail_flag",
                            Some(i + 1),
                            format!("{tool}'s output withheld from the model: {why}"),
                        ));
                    }
                    self.case.judged.insert(key, why.is_some());
                    why.is_some()
                }
            };
            if flagged {
                m.content = Some(guardrail::WITHHELD.into());
            }
        }
    }

    /// AgentDojo's tool filter, on the served model: the conversation (ending in the
    /// filter's prompt) with the tools offered and `tool_choice = "none"` natively; the
    /// model's text, whatever it holds, is the answer. Prompted mode cannot forbid a
    /// call: the tools are listed as in every prompted request and the text is read
    /// whole. The version's guardrail and human take no part.
    async fn name_tools(&mut self, q: Query) -> Result<Turn, LlmError> {
        let messages = read_messages(&q.messages)?;
        let model = match &self.cfg.guardrail {
            GuardrailSpec::Agentdojo { defence: AgentdojoDefence::ToolFilter, model: Some(model) } => model.clone(),
            _ => self.cfg.model.clone(),
        };
        let (request, tool_defs) =
            format::request(self.cfg.tool_calling, self.cfg.tool_result_role, &messages, &q.tools);
        let choice = tool_defs.as_ref().map(|_| "none");
        let (reply, _) = self.llm.complete_choosing(&model, request, tool_defs, choice).await?;
        let text = reply.get("content").and_then(Value::as_str).map(format::strip_think).unwrap_or_default();
        Ok(Turn::Final(text))
    }

    async fn ask_model(&mut self, messages: &[Message], tools: &[ToolSpec]) -> Result<format::Answer, LlmError> {
        let (request, tool_defs) = format::request(self.cfg.tool_calling, self.cfg.tool_result_role, messages, tools);
        let (reply, finish_reason) = self.llm.complete(&self.cfg.model, request, tool_defs, None).await?;
        let next_id = &mut self.next_id;
        let mut ids = || {
            *next_id += 1;
            format!("call_{next_id}")
        };
        Ok(match self.cfg.tool_calling {
            ToolCalling::Native => format::parse_native(&reply, finish_reason.as_deref(), &mut ids),
            ToolCalling::Prompted => {
                let text = reply.get("content").and_then(Value::as_str).unwrap_or("");
                format::parse_prompted(text, finish_reason.as_deref(), &mut ids)
            }
        })
    }
}

/// A local tool result for a call of a step the adapter never sees.
fn tool_result(call: &format::ToolCall, error: Option<&str>, content: &str) -> Message {
    Message {
        role: "tool".into(),
        content: Some(content.into()),
        tool_call_id: call.id.clone(),
        function: Some(call.function.clone()),
        error: error.map(str::to_owned),
        ..Default::default()
    }
}

/// The protocol loop: one reply line per query, until EOF.
pub async fn serve<R: AsyncBufRead + Unpin, W: AsyncWrite + Unpin>(
    cfg: AgentConfig,
    mut input: R,
    mut output: W,
) -> anyhow::Result<()> {
    let mut agent = Agent::new(cfg)?;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if input.read_until(b'\n', &mut buf).await.context("reading stdin")? == 0 {
            return Ok(());
        }
        let line = String::from_utf8_lossy(&buf);
        if let Some(reply) = agent.handle_line(&line).await {
            let mut text = serde_json::to_string(&reply).expect("a JSON value serializes");
            text.push('\n');
            output.write_all(text.as_bytes()).await.context("writing stdout")?;
            output.flush().await.context("writing stdout")?;
        }
    }
}

#[cfg(test)]
mod parity;
#[cfg(test)]
mod pins;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod fuzz;
