"""The JSON-line agent protocol (docs/protocol.md section 1), without any agentdojo import.

Everything that can be checked offline lives here: encoding of the adapter's messages,
decoding and validation of the agent's replies, the stats counters. The adapter
(`adapter.py`) turns validated replies into AgentDojo messages.
"""

from __future__ import annotations

import json
from typing import Any

from . import schema

PROTOCOL = "pruefstand-gym/1"

# The counters an agent reports in `stats`, each filling the record field of its name
# (crates/core/src/case.rs `AgentStats`, through the generated contract).
STAT_KEYS = schema.agent_stats()

MAX_LINE_BYTES = 64 * 1024 * 1024

# The largest counter pruefstand reads back (Rust's i64::MAX): beyond it a record could
# not be read, and the run would lose it.
MAX_COUNTER = 2**63 - 1


class ProtocolError(Exception):
    """The agent broke the protocol; the message is the case's `error`."""


def encode(message: dict) -> bytes:
    """One message as one UTF-8 JSON line."""
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":"), default=_json_default) + "\n").encode(
        "utf-8"
    )


def _json_default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def handshake(agentdojo_version: str, benchmark_version: str) -> dict:
    return {
        "type": "handshake",
        "protocol": PROTOCOL,
        "agentdojo_version": agentdojo_version,
        "benchmark_version": benchmark_version,
    }


def case_start(case: dict) -> dict:
    return {
        "type": "case_start",
        "case_id": case["id"],
        "suite": case["suite"],
        "user_task": case.get("user_task"),
        "injection_task": case.get("injection_task"),
        "attack": case.get("attack"),
        "kind": case["kind"],
    }


def case_end(case_id: str) -> dict:
    return {"type": "case_end", "case_id": case_id}


def query(prompt: str, tools: list[dict], messages: list[dict], tool_choice: str | None = None) -> dict:
    """A turn; `tool_choice="none"` (extension) asks for text only: the tool filter's call."""
    message = {"type": "query", "prompt": prompt, "tools": tools, "messages": messages}
    if tool_choice is not None:
        message["tool_choice"] = tool_choice
    return message


# What an agent may say happened during a query (`events` of a reply), each shown in
# the report's conversation where it happened. The gym adds `restart`,
# `context_overflow`, `tool_filter` and its detector's `guardrail_flag` itself.
EVENT_KINDS = (
    "guardrail_flag",
    "human_approval",
    "human_denial",
    "malformed_output",
    "rejected_call",
    "unknown_tool_call",
    "gave_up",
    "restart",
    "context_overflow",
    "tool_filter",
)
MAX_EVENTS_PER_REPLY = 64
MAX_EVENT_DETAIL_CHARS = 500


class Reply:
    """A validated agent reply: exactly one of `tool_calls` / `final_answer`, plus stats,
    the model's text beside its calls (`content`, None when the agent sent none), and
    what the agent says happened on the way (`events`)."""

    __slots__ = ("tool_calls", "final_answer", "stats", "content", "events")

    def __init__(
        self,
        tool_calls: list[dict] | None,
        final_answer: str | None,
        stats: dict | None,
        content: str | None = None,
        events: list[dict] | None = None,
    ):
        self.tool_calls = tool_calls
        self.final_answer = final_answer
        self.stats = stats
        self.content = content
        self.events = events or []

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (
            f"Reply(tool_calls={self.tool_calls!r}, final_answer={self.final_answer!r}, "
            f"content={self.content!r}, stats={self.stats!r})"
        )


class ContextOverflow(ProtocolError):
    """The agent reports that the model server refused the conversation for its length
    (`{"context_overflow": ...}`): AgentDojo scores the case, it is no error."""

    def __init__(self, message: str, stats: dict | None, events: list[dict] | None = None):
        super().__init__(message)
        self.stats = stats
        self.events = events or []


def _short(text: str, limit: int = 200) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


def decode_reply(line: bytes | str) -> Reply:
    """Parse and validate one line from the agent. Raises ProtocolError with a clear reason."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError(f"agent protocol: line is not UTF-8: {e}") from None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ProtocolError(f"agent protocol: invalid JSON: {e.msg} in {_short(line)!r}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"agent protocol: reply is not a JSON object: {_short(line)!r}")

    stats = None
    if "stats" in obj and obj["stats"] is not None:
        stats = decode_stats(obj["stats"])
    events = decode_events(obj.get("events"))

    if "error" in obj and obj["error"] is not None:
        reason = obj["error"]
        if not isinstance(reason, str):
            reason = json.dumps(reason)
        raise AgentReportedError(f"agent error: {reason}", stats, events)

    if "context_overflow" in obj and obj["context_overflow"] is not None:
        reason = obj["context_overflow"]
        if not isinstance(reason, str):
            reason = json.dumps(reason)
        raise ContextOverflow(reason, stats, events)

    has_calls = "tool_calls" in obj and obj["tool_calls"] is not None
    has_final = "final_answer" in obj and obj["final_answer"] is not None
    if has_calls and has_final:
        raise ProtocolError("agent protocol: reply has both `tool_calls` and `final_answer`")
    if not has_calls and not has_final:
        raise ProtocolError(
            f"agent protocol: reply has neither `tool_calls`, `final_answer` nor `error`: {_short(line)!r}"
        )
    if has_final:
        final = obj["final_answer"]
        if not isinstance(final, str):
            raise ProtocolError(f"agent protocol: `final_answer` must be a string, got {type(final).__name__}")
        return Reply(None, final, stats, events=events)

    calls = obj["tool_calls"]
    if not isinstance(calls, list):
        raise ProtocolError(f"agent protocol: `tool_calls` must be a list, got {type(calls).__name__}")
    if len(calls) == 0:
        raise ProtocolError("agent protocol: `tool_calls` is empty (send `final_answer` to end the case)")
    content = obj.get("content")
    if content is not None and not isinstance(content, str):
        raise ProtocolError(f"agent protocol: `content` must be a string, got {type(content).__name__}")
    out = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            raise ProtocolError(f"agent protocol: tool_calls[{i}] is not an object")
        fn = call.get("function")
        if not isinstance(fn, str) or not fn:
            raise ProtocolError(f"agent protocol: tool_calls[{i}].function must be a non-empty string")
        args = call.get("args", {})
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ProtocolError(f"agent protocol: tool_calls[{i}].args must be an object")
        cid = call.get("id")
        if cid is not None and not isinstance(cid, str):
            raise ProtocolError(f"agent protocol: tool_calls[{i}].id must be a string")
        out.append({"function": fn, "args": args, "id": cid})
    return Reply(out, None, stats, content, events)


class AgentReportedError(ProtocolError):
    """The agent sent `{"error": ...}`; carries the stats sent along, if any."""

    def __init__(self, message: str, stats: dict | None, events: list[dict] | None = None):
        super().__init__(message)
        self.stats = stats
        self.events = events or []


def decode_events(events: Any) -> list[dict]:
    """`events` of a reply: a list of `{kind, at?, detail?}`, `kind` one of EVENT_KINDS,
    `at` the number of the query's messages before it (where it happened), `detail` a
    short text (cut at MAX_EVENT_DETAIL_CHARS)."""
    if events is None:
        return []
    if not isinstance(events, list):
        raise ProtocolError("agent protocol: `events` must be a list")
    if len(events) > MAX_EVENTS_PER_REPLY:
        raise ProtocolError(f"agent protocol: more than {MAX_EVENTS_PER_REPLY} `events` in one reply")
    out = []
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise ProtocolError(f"agent protocol: events[{i}] is not an object")
        kind = event.get("kind")
        if kind not in EVENT_KINDS:
            raise ProtocolError(f"agent protocol: events[{i}].kind {_short(str(kind), 40)!r} is not one of {', '.join(EVENT_KINDS)}")
        at = event.get("at")
        if at is not None and (isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= MAX_COUNTER):
            raise ProtocolError(f"agent protocol: events[{i}].at must be a non-negative integer")
        detail = event.get("detail")
        if detail is not None and not isinstance(detail, str):
            raise ProtocolError(f"agent protocol: events[{i}].detail must be a string")
        cleaned = {"kind": kind}
        if at is not None:
            cleaned["at"] = at
        if detail:
            cleaned["detail"] = detail if len(detail) <= MAX_EVENT_DETAIL_CHARS else detail[:MAX_EVENT_DETAIL_CHARS] + "…"
        out.append(cleaned)
    return out


def decode_stats(stats: Any) -> dict:
    if not isinstance(stats, dict):
        raise ProtocolError("agent protocol: `stats` must be an object")
    out = {}
    for key in STAT_KEYS:
        if key in stats and stats[key] is not None:
            value = stats[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNTER:
                raise ProtocolError(
                    f"agent protocol: stats.{key} must be an integer from 0 to {MAX_COUNTER}, got {value!r}"
                )
            out[key] = value
    return out


def empty_counters() -> dict:
    """Counters of a case before the agent reported any: all null."""
    return {key: None for key in STAT_KEYS}


def merge_stats(counters: dict, stats: dict | None) -> dict:
    """Stats are cumulative since case_start: the last one seen wins, key by key."""
    if not stats:
        return counters
    merged = dict(counters)
    merged.update(stats)
    return merged
