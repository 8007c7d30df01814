//! A streamed chat completion put back together: the server-sent events of `stream:
//! true` (`data: {chunk}` lines, `data: [DONE]` at the end) folded into the one
//! `choices[0].message` a non-streamed answer would have carried, with its finish
//! reason and usage. A generation cut off midway still yields the message received so
//! far — the partial text is the model's output, scored as such.
//!
//! Pure: no HTTP and no clock (`llm` reads the body and times the chunks).

use serde_json::{Map, Value, json};

/// Chunks folded so far.
#[derive(Debug, Default)]
pub(crate) struct Assembly {
    /// Bytes of an event line not yet complete.
    pending: Vec<u8>,
    content: String,
    reasoning: String,
    /// Tool calls by their `index`, fragments appended.
    calls: Vec<Map<String, Value>>,
    pub finish_reason: Option<String>,
    pub usage: Option<Value>,
    /// Chunks that carried generated text or call fragments: about one token each.
    pub token_chunks: u64,
    pub done: bool,
    received: usize,
}

/// What one piece of the body held.
#[derive(Debug, PartialEq)]
pub(crate) enum Fed {
    /// Nothing generated in it (keep-alives, the role chunk, usage).
    Nothing,
    /// Generated text or a call fragment arrived.
    Tokens,
}

impl Assembly {
    /// Folds in one piece of the body, which may end mid-line. An error event the
    /// server sends in the stream (`data: {"error": …}`) is returned as its message.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Fed, String> {
        self.received = self.received.saturating_add(bytes.len());
        let seen = self.pending.len();
        self.pending.extend_from_slice(bytes);
        let mut fed = Fed::Nothing;
        // Only the new bytes are searched for the line's end: a long line arriving in
        // many pieces costs its length once, not once per piece.
        let mut from = seen;
        while let Some(offset) = self.pending[from..].iter().position(|&b| b == b'\n') {
            let end = from + offset;
            from = 0;
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if self.line(line.trim())? {
                fed = Fed::Tokens;
            }
        }
        Ok(fed)
    }

    /// Bytes of the body received so far: what a limit on the answer's size counts.
    pub fn size(&self) -> usize {
        self.received
    }

    /// One event line; true when it carried generated tokens.
    fn line(&mut self, line: &str) -> Result<bool, String> {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else { return Ok(false) };
        if data == "[DONE]" {
            self.done = true;
            return Ok(false);
        }
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| format!("a stream event is not JSON ({e}): {data}"))?;
        if let Some(error) = chunk.get("error") {
            let message = error.get("message").and_then(Value::as_str).map_or_else(|| error.to_string(), str::to_owned);
            return Err(message);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        let Some(choice) = chunk.pointer("/choices/0") else { return Ok(false) };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_owned());
        }
        let Some(delta) = choice.get("delta") else { return Ok(false) };
        let mut tokens = false;
        let text = |key: &str| delta.get(key).and_then(Value::as_str).filter(|t| !t.is_empty());
        if let Some(t) = text("content") {
            self.content.push_str(t);
            tokens = true;
        }
        // vLLM's reasoning parsers stream the thinking apart (`reasoning_content`, or
        // `reasoning` in newer versions).
        if let Some(t) = text("reasoning_content").or_else(|| text("reasoning")) {
            self.reasoning.push_str(t);
            tokens = true;
        }
        for fragment in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            self.call_fragment(fragment);
            tokens = true;
        }
        self.token_chunks += u64::from(tokens);
        Ok(tokens)
    }

    fn call_fragment(&mut self, fragment: &Value) {
        let index = fragment.get("index").and_then(Value::as_u64).map_or(self.calls.len().max(1) - 1, |i| i as usize);
        while self.calls.len() <= index {
            self.calls.push(Map::new());
        }
        let call = &mut self.calls[index];
        for key in ["id", "type"] {
            if let Some(v) = fragment.get(key).and_then(Value::as_str).filter(|v| !v.is_empty()) {
                call.insert(key.into(), json!(v));
            }
        }
        let function = call.entry("function").or_insert_with(|| json!({})).as_object_mut().expect("an object");
        for key in ["name", "arguments"] {
            if let Some(piece) = fragment.pointer(&format!("/function/{key}")).and_then(Value::as_str) {
                let so_far = function.get(key).and_then(Value::as_str).unwrap_or("");
                let joined = format!("{so_far}{piece}");
                function.insert(key.into(), json!(joined));
            }
        }
    }

    /// The message as a non-streamed answer carries it: content (an empty string beside
    /// calls, as vLLM's), `tool_calls` only when there are calls, the reasoning apart.
    pub fn message(&self) -> Value {
        let content = if self.calls.is_empty() { &self.content } else { without_leaked_call(&self.content) };
        let mut message = json!({"role": "assistant", "content": content});
        if !self.reasoning.is_empty() {
            message["reasoning_content"] = json!(self.reasoning);
        }
        if !self.calls.is_empty() {
            let calls: Vec<Value> = self
                .calls
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    c.entry("type").or_insert_with(|| json!("function"));
                    Value::Object(c)
                })
                .collect();
            message["tool_calls"] = json!(calls);
        }
        message
    }
}

/// The content of a streamed answer with calls, less the beginning of the call's own
/// text that the server's tool parser streamed as content before it knew a call had
/// begun. vLLM's parsers decide on the text so far: `xlam` recognises a call in a code
/// fence only once `"name"` and `"arguments"` have arrived, so a model that writes
/// prose and then a ```json block streams `Checking. ```json [{"name": "f",
/// "arguments"` as content, which the same answer unstreamed does not hold (the parser
/// removes the block); `hermes` likewise with an opening `<tool_call>`. Left in, that
/// fragment goes back into the conversation and the model copies it. An opener still
/// open at the end of the content is the leak: the text from it on is cut.
fn without_leaked_call(content: &str) -> &str {
    let fences = content.matches("```").count();
    let open_fence = (fences % 2 == 1).then(|| content.rfind("```")).flatten();
    let open_tag = content.rfind("<tool_call>").filter(|&at| !content[at..].contains("</tool_call>"));
    let marker = content.rfind("[TOOL_CALLS]");
    match [open_fence, open_tag, marker].into_iter().flatten().min() {
        Some(at) => content[..at].trim_end(),
        None => content,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[Value]) -> String {
        chunks.iter().map(|c| format!("data: {c}\n\n")).collect::<String>() + "data: [DONE]\n\n"
    }

    #[test]
    fn a_streamed_call_is_the_message_a_plain_answer_carries() {
        // The shape vLLM 0.32 streams: a role chunk, the call's name with its id, the
        // arguments in pieces, the finish reason, then usage with empty choices.
        let body = events(&[
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "chatcmpl-tool-1", "type": "function", "function": {"name": "send_money"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"amount\""}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 5}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 900, "completion_tokens": 12}}),
        ]);
        let mut a = Assembly::default();
        // fed in awkward pieces: a line may end in the next piece
        for piece in body.as_bytes().chunks(7) {
            a.feed(piece).unwrap();
        }
        assert!(a.done);
        assert_eq!(a.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(a.usage.as_ref().unwrap()["completion_tokens"], 12);
        assert_eq!(a.token_chunks, 3);
        assert_eq!(
            a.message(),
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "chatcmpl-tool-1", "type": "function",
                "function": {"name": "send_money", "arguments": "{\"amount\": 5}"}}]})
        );
    }

    #[test]
    fn text_and_reasoning_accumulate_and_a_cut_stream_keeps_what_came() {
        let mut a = Assembly::default();
        let fed = a.feed(b"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n").unwrap();
        assert_eq!(fed, Fed::Tokens);
        a.feed(b": keep-alive\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"The bal\"}}]}\n").unwrap();
        assert_eq!(a.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"ance is\"").unwrap(), Fed::Nothing);
        assert!(!a.done && a.finish_reason.is_none());
        assert_eq!(a.message(), json!({"role": "assistant", "content": "The bal", "reasoning_content": "hmm"}));
    }

    #[test]
    fn the_call_text_a_parser_streamed_as_content_before_the_call_is_not_kept() {
        // vLLM 0.32's xlam parser on Qwen2.5-Coder: prose, then a fenced call whose
        // first tokens went out as content before the parser saw "name" and "arguments".
        let leaked = "To get it, call `f`: ```json\n[{\"name\": \"f\", \"arguments\"";
        let call = json!({"index": 0, "id": "call_0_1", "type": "function", "function": {"name": "f"}});
        let body = events(&[
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": leaked}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"a\": 1}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        let mut a = Assembly::default();
        a.feed(body.as_bytes()).unwrap();
        let m = a.message();
        assert_eq!(m["content"], "To get it, call `f`:");
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
        // hermes' opening tag likewise; a closed fence or plain text is the model's own.
        assert_eq!(without_leaked_call("Sure.\n<tool_call>\n{\"name\": \"f\""), "Sure.");
        assert_eq!(without_leaked_call("Use ```x``` here."), "Use ```x``` here.");
        assert_eq!(without_leaked_call("Paying the bill."), "Paying the bill.");
        // Without calls nothing is cut: an unclosed fence is then the model's answer.
        let mut text = Assembly::default();
        text.feed(events(&[json!({"choices": [{"index": 0, "delta": {"content": leaked}}]})]).as_bytes()).unwrap();
        assert_eq!(text.message()["content"], leaked);
    }

    #[test]
    fn an_error_event_in_the_stream_is_reported() {
        let mut a = Assembly::default();
        let err = a.feed(b"data: {\"error\": {\"message\": \"engine dead\", \"code\": 500}}\n").unwrap_err();
        assert_eq!(err, "engine dead");
        assert!(a.feed(b"data: {not json\n").unwrap_err().contains("not JSON"));
    }
}
