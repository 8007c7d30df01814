//! The OpenAI chat-completions client of the agent runtime: one POST per model call,
//! retries with exponential backoff on transient failures, and token accounting for the
//! case's `stats`. Every model call of the runtime — the agent's own turns, the `llm`
//! guardrail, the `llm` human — goes through here, so all of them are counted.
//!
//! Not here: what goes into the request or how the answer is read (`format`).

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

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

/// Token and call counts since the last reset (a `case_start`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Usage {
    pub calls: u64,
    /// `None` until a response reports `usage` (counters never reported stay null).
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

pub struct Llm {
    http: reqwest::Client,
    url: String,
    api_key: Option<String>,
    max_retries: u32,
    backoff: Duration,
    pub temperature: f64,
    pub max_tokens: Option<u32>,
    usage: Mutex<Usage>,
}

impl Llm {
    pub fn new(cfg: &super::AgentConfig) -> anyhow::Result<Self> {
        let timeout = Duration::try_from_secs_f64(cfg.request_timeout_s)
            .map_err(|e| anyhow::anyhow!("request_timeout_s {}: {e}", cfg.request_timeout_s))?;
        let backoff = Duration::try_from_secs_f64(cfg.retry_backoff_s)
            .map_err(|e| anyhow::anyhow!("retry_backoff_s {}: {e}", cfg.retry_backoff_s))?;
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .build()?;
        Ok(Self {
            http,
            url: format!("{}/chat/completions", cfg.base_url.trim_end_matches('/')),
            api_key: std::env::var("PRUEFSTAND_API_KEY").ok().filter(|k| !k.is_empty()),
            max_retries: cfg.max_retries,
            backoff,
            temperature: cfg.temperature,
            max_tokens: cfg.max_tokens,
            usage: Mutex::default(),
        })
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn usage(&self) -> Usage {
        self.usage.lock().unwrap().clone()
    }

    pub fn reset_usage(&self) {
        *self.usage.lock().unwrap() = Usage::default();
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

    /// One chat completion; returns `choices[0].message` and its `finish_reason`.
    pub async fn complete(
        &self,
        model: &str,
        messages: Vec<Value>,
        tools: Option<Vec<Value>>,
        max_tokens: Option<u32>,
    ) -> Result<(Value, Option<String>), LlmError> {
        let mut body = json!({"model": model, "messages": messages, "temperature": self.temperature});
        if let Some(tools) = tools {
            body["tools"] = json!(tools);
        }
        if let Some(n) = max_tokens.or(self.max_tokens) {
            body["max_tokens"] = json!(n);
        }
        let text = self.post_with_retries(&body).await?;
        let response: Value = serde_json::from_str(&text)
            .map_err(|e| LlmError::Unusable(format!("response is not JSON ({e}): {}", snippet(&text))))?;
        self.count(&response);
        let finish_reason = response.pointer("/choices/0/finish_reason").and_then(Value::as_str).map(str::to_owned);
        match response.pointer("/choices/0/message") {
            Some(m) if m.is_object() => Ok((m.clone(), finish_reason)),
            _ => Err(LlmError::Unusable(format!("no choices[0].message in the response: {}", snippet(&text)))),
        }
    }

    async fn post_with_retries(&self, body: &Value) -> Result<String, LlmError> {
        let mut attempt = 0;
        loop {
            let last_error = match self.post(body).await {
                Ok(text) => return Ok(text),
                Err(Attempt::Fatal(e)) => return Err(LlmError::Server(e)),
                Err(Attempt::Overflow(e)) => return Err(LlmError::ContextOverflow(e)),
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

    async fn post(&self, body: &Value) -> Result<String, Attempt> {
        let mut req = self.http.post(&self.url).json(body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.map_err(|e| {
            let msg = error_chain(&e); // names the URL already
            if e.is_builder() { Attempt::Fatal(msg) } else { Attempt::Transient(msg) }
        })?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| Attempt::Transient(format!("reading the response of {}: {}", self.url, error_chain(&e))))?;
        if status.is_success() {
            Ok(text)
        } else if let Some(message) = context_overflow(status.as_u16(), &text) {
            Err(Attempt::Overflow(message))
        } else if status.as_u16() == 429 || status.is_server_error() {
            Err(Attempt::Transient(format!("HTTP {status}: {}", snippet(&text))))
        } else {
            Err(Attempt::Fatal(format!("HTTP {status}: {}", snippet(&text))))
        }
    }

    fn count(&self, response: &Value) {
        let mut u = self.usage.lock().unwrap();
        u.calls += 1;
        let field = |name: &str| response.get("usage").and_then(|x| x.get(name)).and_then(Value::as_u64);
        if let Some(p) = field("prompt_tokens") {
            u.prompt_tokens = Some(u.prompt_tokens.unwrap_or(0) + p);
        }
        if let Some(c) = field("completion_tokens") {
            u.completion_tokens = Some(u.completion_tokens.unwrap_or(0) + c);
        }
    }
}

enum Attempt {
    Transient(String),
    Fatal(String),
    Overflow(String),
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

pub fn snippet(text: &str) -> String {
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
