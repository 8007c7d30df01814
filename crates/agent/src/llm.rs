//! The OpenAI chat-completions client of the agent runtime: one request per model call,
//! streamed, retries with exponential backoff on the server's transient failures, and
//! token and timing accounting for the case's `stats`. Every model call of the runtime —
//! the agent's own turns, the `llm` guardrail, the `llm` human — goes through here, so
//! all of them are counted.
//!
//! Time is the model's: every request carries a `max_tokens`, and a generation is
//! waited for while tokens keep coming — it is given up on *silence* (no token for
//! `idle_timeout_s`) or at a last bound derived from `max_tokens` and the decode rate
//! measured on earlier calls. Giving up closes the connection (vLLM then aborts the
//! generation) and ends the turn as the model's output so far, cut off: a scored
//! outcome, never re-sent unchanged (at temperature 0 it would ramble the same way),
//! never a bench error. What is retried is the server's failure: connect errors, 429,
//! 5xx, and a request that got no first token at all within `request_timeout_s`.
//! A server that does not stream (a plain JSON answer) is read whole.
//!
//! Not here: what goes into the request or how the answer is read (`format`), putting a
//! stream back together (`stream`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::stream::{Assembly, Fed};
use pruefstand_core::case::CANNOT_CONNECT;
use pruefstand_core::settings::url::SecretUrl;
use pruefstand_core::util;

/// Why a model call produced no usable turn. The `Display` text is the protocol's
/// `{"error": ...}` reason.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("model server: {0}")]
    Server(String),
    #[error("unusable model output: {0}")]
    Unusable(String),
    /// The server refused the request because the conversation outgrew the model's
    /// context: AgentDojo scores such a case (utility false, the injection counted as
    /// landed), so it is an outcome, not an error.
    #[error("context overflow: {0}")]
    ContextOverflow(String),
    /// Not the model's fault: the adapter sent something unreadable.
    #[error("agent protocol: {0}")]
    Protocol(String),
}

/// Token, call and timing counts since the last reset (a `case_start`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Usage {
    pub calls: u64,
    /// `None` until a response reports `usage` (counters never reported stay null).
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Generations cut off: stopped by the server at `max_tokens` (`finish_reason:
    /// "length"`) or given up on by the agent (silence, the time bound); scored.
    pub cut_generations: u64,
    /// Streamed calls that produced a first token, and their summed time to it and
    /// from it to the last token: time to first token and decode rate per case.
    pub streamed_calls: u64,
    pub ttft_ms: u64,
    pub decode_ms: u64,
}

/// `max_tokens` of an agent request when the version sets none: room for a tool call
/// with some reasoning before it, far below a context's end (vLLM also lowers it to the
/// context left). docs/real-server.md.
pub const DEFAULT_MAX_TOKENS: u32 = 2048;

/// The largest counter a case record carries (the gym refuses larger ones).
const MAX_COUNTER: u64 = i64::MAX as u64;

/// The most a model server's answer may hold (a turn of `max_tokens` is kilobytes): a
/// larger one is unusable output, not something to hold in memory.
pub(crate) const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// How a call's answer arrived.
struct Answered {
    response: Value,
    /// Given up on: the response holds what came before.
    cut: Option<String>,
}

pub struct Llm {
    http: reqwest::Client,
    /// Shown without credentials (`Display`); exposed only to send.
    url: SecretUrl,
    api_key: Option<String>,
    max_retries: u32,
    backoff: Duration,
    /// The wait for a first token, and the whole request when no decode rate is known.
    first_token: Duration,
    idle: Duration,
    stream: bool,
    pub temperature: f64,
    pub max_tokens: u32,
    usage: Mutex<Usage>,
    /// Tokens per second of this agent's earlier streamed calls (smoothed): with
    /// `max_tokens` it bounds a generation still producing tokens.
    decode_rate: Mutex<Option<f64>>,
}

impl Llm {
    pub fn new(cfg: &super::AgentConfig) -> anyhow::Result<Self> {
        let seconds =
            |name: &str, s: f64| Duration::try_from_secs_f64(s).map_err(|e| anyhow::anyhow!("{name} {s}: {e}"));
        let first_token = seconds("request_timeout_s", cfg.request_timeout_s)?;
        // No overall client timeout: each call bounds its own wait (first token,
        // silence, the decode bound).
        let http = reqwest::Client::builder().connect_timeout(first_token.min(Duration::from_secs(10))).build()?;
        Ok(Self {
            http,
            url: SecretUrl::own(cfg.resolved_base_url()?).join("chat/completions"),
            api_key: std::env::var("PRUEFSTAND_API_KEY").ok().filter(|k| !k.is_empty()),
            max_retries: cfg.max_retries,
            backoff: seconds("retry_backoff_s", cfg.retry_backoff_s)?,
            first_token,
            idle: seconds("idle_timeout_s", cfg.idle_timeout_s)?,
            stream: cfg.stream,
            temperature: cfg.temperature,
            max_tokens: cfg.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            usage: Mutex::default(),
            decode_rate: Mutex::default(),
        })
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn usage(&self) -> Usage {
        util::lock(&self.usage).clone()
    }

    pub(crate) fn reset_usage(&self) {
        *util::lock(&self.usage) = Usage::default();
    }

    /// One chat completion; returns `choices[0].message`.
    pub async fn chat(
        &self,
        model: &str,
        messages: Vec<Value>,
        tools: Option<Vec<Value>>,
        max_tokens: Option<u32>,
    ) -> Result<Value, LlmError> {
        Ok(self.complete(model, messages, tools, max_tokens).await?.0)
    }

    /// One chat completion; returns `choices[0].message` and its `finish_reason` —
    /// `"length"` for a generation given up on, with the text received until then.
    pub async fn complete(
        &self,
        model: &str,
        messages: Vec<Value>,
        tools: Option<Vec<Value>>,
        max_tokens: Option<u32>,
    ) -> Result<(Value, Option<String>), LlmError> {
        self.request(model, messages, tools, max_tokens, None).await
    }

    /// [`Llm::complete`] with the agent's `max_tokens` and an explicit `tool_choice`
    /// (`"none"`: the tools are shown, none may be called).
    pub(crate) async fn complete_choosing(
        &self,
        model: &str,
        messages: Vec<Value>,
        tools: Option<Vec<Value>>,
        tool_choice: Option<&str>,
    ) -> Result<(Value, Option<String>), LlmError> {
        self.request(model, messages, tools, None, tool_choice).await
    }

    async fn request(
        &self,
        model: &str,
        messages: Vec<Value>,
        tools: Option<Vec<Value>>,
        max_tokens: Option<u32>,
        tool_choice: Option<&str>,
    ) -> Result<(Value, Option<String>), LlmError> {
        let max_tokens = max_tokens.unwrap_or(self.max_tokens);
        let mut body = json!({"model": model, "messages": messages, "temperature": self.temperature,
                              "max_tokens": max_tokens});
        if let Some(tools) = tools {
            body["tools"] = json!(tools);
        }
        if let Some(choice) = tool_choice {
            body["tool_choice"] = json!(choice);
        }
        if self.stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        let answered = self.post_with_retries(&body, max_tokens).await?;
        self.count(&answered.response);
        let response = &answered.response;
        if let Some(why) = &answered.cut {
            tracing::warn!("model server: {why}; the turn ends with the output so far (scored as cut off)");
            util::lock(&self.usage).cut_generations += 1;
            let message = response.pointer("/choices/0/message").cloned().unwrap_or_else(|| json!({}));
            return Ok((message, Some("length".into())));
        }
        let finish_reason = response.pointer("/choices/0/finish_reason").and_then(Value::as_str).map(str::to_owned);
        if finish_reason.as_deref() == Some("length") {
            // Stopped by the server at max_tokens: a long generation, counted as cut too.
            util::lock(&self.usage).cut_generations += 1;
        }
        match response.pointer("/choices/0/message") {
            Some(m) if m.is_object() => Ok((m.clone(), finish_reason)),
            _ => Err(LlmError::Unusable(format!(
                "no choices[0].message in the response: {}",
                snippet(&response.to_string())
            ))),
        }
    }

    async fn post_with_retries(&self, body: &Value, max_tokens: u32) -> Result<Answered, LlmError> {
        let mut attempt = 0;
        loop {
            let last_error = match self.post(body, max_tokens).await {
                Ok(answered) => return Ok(answered),
                Err(Attempt::Fatal(e)) => return Err(LlmError::Server(e)),
                Err(Attempt::Overflow(e)) => return Err(LlmError::ContextOverflow(e)),
                Err(Attempt::Unusable(e)) => return Err(LlmError::Unusable(e)),
                Err(Attempt::Transient(e)) => e,
            };
            if attempt >= self.max_retries {
                let tries = attempt + 1;
                return Err(LlmError::Server(format!(
                    "{last_error} (gave up after {tries} attempt{})",
                    if tries == 1 { "" } else { "s" }
                )));
            }
            // Exponential backoff, capped: vLLM answers 429/503 while its queue is full.
            let wait = (self.backoff * 2u32.saturating_pow(attempt)).min(Duration::from_secs(30));
            tracing::warn!("model server: {last_error}; retry {} of {} in {wait:?}", attempt + 1, self.max_retries);
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    async fn post(&self, body: &Value, max_tokens: u32) -> Result<Answered, Attempt> {
        let sent = Instant::now();
        let mut req = self.http.post(self.url.expose()).json(body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let resp = match tokio::time::timeout(self.first_token, req.send()).await {
            Ok(resp) => resp.map_err(|e| {
                // reqwest's message names the URL whole: ours, redacted, instead.
                let (builder, connect) = (e.is_builder(), e.is_connect());
                let msg = format!("{} (url {})", error_chain(&e.without_url()), self.url);
                if builder {
                    Attempt::Fatal(msg)
                } else if connect {
                    Attempt::Transient(format!("{CANNOT_CONNECT}: {msg}"))
                } else {
                    Attempt::Transient(msg)
                }
            })?,
            // A plain JSON answer comes with its headers, after the whole generation:
            // running past the bound is the model's time. A stream's headers come first.
            Err(_) if !self.stream => return Ok(self.no_answer()),
            Err(_) => return Err(Attempt::Transient(self.no_first_token())),
        };
        let status = resp.status();
        if !status.is_success() {
            let text = tokio::time::timeout(self.idle, resp.text()).await.ok().and_then(Result::ok).unwrap_or_default();
            return Err(if let Some(message) = context_overflow(status.as_u16(), &text) {
                Attempt::Overflow(message)
            } else if status.as_u16() == 429 || status.is_server_error() {
                Attempt::Transient(format!("HTTP {status}: {}", snippet(&text)))
            } else {
                Attempt::Fatal(format!("HTTP {status}: {}", snippet(&text)))
            });
        }
        let streamed = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        if streamed { self.read_stream(resp, sent, max_tokens).await } else { self.read_whole(resp, sent).await }
    }

    /// A plain JSON answer: the whole generation arrives at once, so its wait is the
    /// first-token bound; running past it is the model's time, not the server's.
    async fn read_whole(&self, mut resp: reqwest::Response, sent: Instant) -> Result<Answered, Attempt> {
        let deadline = tokio::time::Instant::from_std(sent + self.first_token);
        let mut body = Vec::new();
        loop {
            match tokio::time::timeout_at(deadline, resp.chunk()).await {
                Ok(Ok(Some(chunk))) => {
                    body.extend_from_slice(&chunk);
                    if body.len() > MAX_RESPONSE_BYTES {
                        return Err(Attempt::Unusable(too_large()));
                    }
                }
                Ok(Ok(None)) => break,
                Ok(Err(e)) => {
                    return Err(Attempt::Transient(format!(
                        "reading the response of {}: {}",
                        self.url,
                        error_chain(&e.without_url())
                    )));
                }
                Err(_) => return Ok(self.no_answer()),
            }
        }
        let text = String::from_utf8_lossy(&body);
        let response: Value = serde_json::from_str(&text)
            .map_err(|e| Attempt::Unusable(format!("response is not JSON ({e}): {}", snippet(&text))))?;
        Ok(Answered { response, cut: None })
    }

    /// Server-sent events: waited for while tokens keep coming.
    async fn read_stream(
        &self,
        mut resp: reqwest::Response,
        sent: Instant,
        max_tokens: u32,
    ) -> Result<Answered, Attempt> {
        let mut assembly = Assembly::default();
        let mut first: Option<Instant> = None;
        let mut last = Instant::now();
        let cut = loop {
            // Before the first token: the server may still be queueing the request.
            // After it: silence, or the bound on a generation that keeps talking.
            let wait = match first {
                None => self.first_token.saturating_sub(sent.elapsed()),
                Some(t) => self.idle.min(self.decode_bound(max_tokens).saturating_sub(t.elapsed())),
            };
            let chunk = match tokio::time::timeout(wait, resp.chunk()).await {
                Ok(Ok(Some(chunk))) => chunk,
                Ok(Ok(None)) => break None,
                Ok(Err(e)) if first.is_none() => {
                    return Err(Attempt::Transient(format!(
                        "reading the stream of {}: {}",
                        self.url,
                        error_chain(&e.without_url())
                    )));
                }
                Ok(Err(e)) => break Some(format!("the stream broke off ({})", error_chain(&e.without_url()))),
                Err(_) if first.is_none() => return Err(Attempt::Transient(self.no_first_token())),
                Err(_) => {
                    let t = first.expect("after the first token");
                    break Some(if last.elapsed() >= self.idle {
                        format!("no token for {:?} (idle_timeout_s)", self.idle)
                    } else {
                        format!("still generating after {:?}, the bound for {max_tokens} tokens", t.elapsed())
                    });
                }
            };
            if assembly.size() > MAX_RESPONSE_BYTES {
                return Err(Attempt::Unusable(too_large()));
            }
            match assembly.feed(&chunk) {
                Ok(Fed::Tokens) => {
                    first.get_or_insert_with(Instant::now);
                    last = Instant::now();
                }
                Ok(Fed::Nothing) => {}
                Err(message) if first.is_none() => return Err(Attempt::Transient(format!("in the stream: {message}"))),
                Err(message) => break Some(format!("the server ended the stream: {}", snippet(&message))),
            }
            if assembly.done {
                break None;
            }
        };
        // Dropping the response closes the connection: vLLM aborts the generation.
        drop(resp);
        if let Some(t) = first {
            self.timed(sent, t, last, &assembly, cut.is_none());
        } else if cut.is_none() && assembly.finish_reason.is_none() {
            return Err(Attempt::Transient(format!("the stream of {} ended before any answer", self.url)));
        }
        let mut response = cut_response(assembly.message());
        response["choices"][0]["finish_reason"] = json!(assembly.finish_reason);
        if let Some(usage) = &assembly.usage {
            response["usage"] = usage.clone();
        } else if cut.is_some() {
            // Cut off before the server's count: about one token per chunk.
            response["usage"] = json!({"completion_tokens": assembly.token_chunks});
        }
        Ok(Answered { response, cut })
    }

    /// How long a generation may run after its first token: four times what the
    /// measured decode rate needs for `max_tokens` (a busy server slows every
    /// request), at least the silence bound; the first-token bound until a rate is known.
    fn decode_bound(&self, max_tokens: u32) -> Duration {
        match *util::lock(&self.decode_rate) {
            Some(rate) if rate > 0.0 => {
                Duration::from_secs_f64((4.0 * f64::from(max_tokens) / rate).min(86_400.0)).max(self.idle)
            }
            _ => self.first_token,
        }
    }

    /// A plain JSON answer that did not come within the first-token bound: the
    /// model's time, cut off with nothing to show.
    fn no_answer(&self) -> Answered {
        let why = format!("no answer within {:?} (request_timeout_s)", self.first_token);
        Answered { response: cut_response(json!({"role": "assistant", "content": ""})), cut: Some(why) }
    }

    fn no_first_token(&self) -> String {
        format!("no first token from {} within {:?} (request_timeout_s)", self.url, self.first_token)
    }

    /// Time to first token and decode time into the case's counts; a finished
    /// generation of some length updates the decode rate.
    fn timed(&self, sent: Instant, first: Instant, last: Instant, assembly: &Assembly, finished: bool) {
        let decode = last.saturating_duration_since(first);
        let mut u = util::lock(&self.usage);
        u.streamed_calls += 1;
        u.ttft_ms += first.saturating_duration_since(sent).as_millis() as u64;
        u.decode_ms += decode.as_millis() as u64;
        let tokens =
            assembly.usage.as_ref().and_then(|u| u["completion_tokens"].as_u64()).unwrap_or(assembly.token_chunks);
        if finished && tokens >= 8 && decode.as_secs_f64() > 0.0 {
            let rate = tokens as f64 / decode.as_secs_f64();
            let mut known = util::lock(&self.decode_rate);
            *known = Some(known.map_or(rate, |r| 0.7 * r + 0.3 * rate));
        }
    }

    fn count(&self, response: &Value) {
        let mut u = util::lock(&self.usage);
        u.calls += 1;
        let field = |name: &str| response.get("usage").and_then(|x| x.get(name)).and_then(Value::as_u64);
        // A server's count is not trusted to be sane: sums saturate, never wrap.
        if let Some(p) = field("prompt_tokens") {
            u.prompt_tokens = Some(u.prompt_tokens.unwrap_or(0).saturating_add(p).min(MAX_COUNTER));
        }
        if let Some(c) = field("completion_tokens") {
            u.completion_tokens = Some(u.completion_tokens.unwrap_or(0).saturating_add(c).min(MAX_COUNTER));
        }
    }
}

fn too_large() -> String {
    format!(
        "the model server's answer is over {} MiB (a turn is kilobytes); not read further",
        MAX_RESPONSE_BYTES >> 20
    )
}

/// A response envelope around one message.
fn cut_response(message: Value) -> Value {
    json!({"choices": [{"index": 0, "message": message, "finish_reason": null}]})
}

enum Attempt {
    Transient(String),
    Fatal(String),
    Overflow(String),
    Unusable(String),
}

/// The server's message when it refused a request for its length, by AgentDojo's rule
/// (`BadRequestError` with code `context_length_exceeded`, param `max_tokens`, or "reduce
/// the length of the messages."; an unprocessable request naming `max_new_tokens`) and
/// vLLM's wording ("maximum context length"). A 5xx is never one: that is the server's
/// failure.
pub fn context_overflow(status: u16, body: &str) -> Option<String> {
    if status != 400 && status != 413 && status != 422 {
        return None;
    }
    let json: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let error = json.get("error").filter(|e| e.is_object()).unwrap_or(&json);
    let field = |name: &str| error.get(name).and_then(Value::as_str).unwrap_or("");
    let message = error.get("message").and_then(Value::as_str).map_or_else(|| body.trim().to_owned(), str::to_owned);
    let overflow = match status {
        422 => body.contains("max_new_tokens"),
        _ => {
            field("code") == "context_length_exceeded"
                || field("param") == "max_tokens"
                || body.contains("reduce the length of the messages")
                || body.contains("maximum context length")
        }
    };
    overflow.then(|| snippet(&message))
}

/// reqwest's top-level message rarely says why ("error sending request"): add the causes.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

pub(crate) fn snippet(text: &str) -> String {
    let t = text.trim();
    match t.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_owned(),
    }
}

/// The first word of a yes/no answer: `Some(true)` for yes, `Some(false)` for no.
/// Reasoning models may think first: a `<think>…</think>` block is skipped.
pub fn yes_no(answer: &str) -> Option<bool> {
    let a = answer.rsplit("</think>").next().unwrap_or(answer);
    let word: String = a
        .trim_start_matches(|c: char| !c.is_alphanumeric())
        .chars()
        .take_while(|c| c.is_alphanumeric())
        .collect::<String>()
        .to_lowercase();
    match word.as_str() {
        "yes" | "y" => Some(true),
        "no" | "n" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yes_no_reads_the_first_word() {
        assert_eq!(yes_no("Yes."), Some(true));
        assert_eq!(yes_no(" **NO** — it is data"), Some(false));
        assert_eq!(yes_no("<think>hmm, yes or no</think>\nno"), Some(false));
        assert_eq!(yes_no("Maybe"), None);
    }

    /// Bodies the real vLLM 0.32 sent (CPU build, measured): the overflow has no
    /// `context_length_exceeded` code; a `max_tokens` above the context is the request's
    /// fault too; an unknown model is not an overflow.
    #[test]
    fn the_real_servers_refusals_are_told_apart() {
        let overflow = r#"{"error":{"message":"This model's maximum context length is 2048 tokens. However, your prompt contains at least 2049 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=2049)","type":"BadRequestError","param":"input_tokens","code":400}}"#;
        assert!(context_overflow(400, overflow).unwrap().contains("maximum context length is 2048"));
        let too_long = r#"{"error":{"message":"max_tokens=10000 cannot be greater than max_model_len=8192. Please request fewer output tokens. (parameter=max_tokens, value=10000)","type":"BadRequestError","param":"max_tokens","code":400}}"#;
        assert!(context_overflow(400, too_long).is_some());
        let unknown = r#"{"error":{"message":"The model `nope` does not exist. Valid aliases: smollm2.","type":"NotFoundError","param":"model","code":404}}"#;
        assert_eq!(context_overflow(404, unknown), None);
        assert_eq!(context_overflow(401, r#"{"error":"Unauthorized"}"#), None);
    }
}
