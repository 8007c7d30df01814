"""vLLM's `xlam` tool-call parser with each call's arguments streamed as its own.

A tool-parser plugin for vLLM 0.32 (`--tool-parser-plugin`, registered as
`xlam_per_call`); versions/real-qwen.toml mounts it with `model.tool_parser_plugin`.

Why: the stock parser, streaming, looks for a call with empty arguments anywhere in the
text (`"name": …, "arguments": {}`), not in the call it is streaming. In a turn of
several calls where one has no arguments, every other call not yet sent gets `{}` as
its arguments — measured: Qwen2.5-Coder-1.5B's `[{"name": "get_balance", "arguments":
{}}, {"name": "send_money", "arguments": {"recipient": …}}]` streamed as
`send_money({})`, while the same answer unstreamed carries the recipient. The fix hides
the empty arguments of every other call from that search (a stand-in object the search
does not match), so the stock code streams each call's own; everything else is the
stock parser's. tests/fixtures/xlam_stream.py checks both parsers on such turns.

And: the stock parser counts calls by their `"name": "…"` keys anywhere in the text, so
an argument called `name` (every tool of the counter suite has one) became a call of
its own — `[{"name": "delete_counter", "arguments": {"name": "tickets"}}]` streamed as
`delete_counter({})` and `tickets({})`. While this parser streams, the stock module's
`re` sees only the keys at the calls' own depth (`_CallNames`); the text is unchanged,
so the arguments streamed are the model's bytes.
"""

import json
import re

from vllm.tool_parsers import xlam_tool_parser as stock_module
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from vllm.tool_parsers.xlam_tool_parser import xLAMToolParser

NAME = re.compile(r'"name"\s*:\s*"[^"]+"')
EMPTY_ARGUMENTS = re.compile(r'("name"\s*:\s*"[^"]+"\s*,\s*"arguments"\s*:\s*)\{\s*\}')
# Not empty, so the stock search passes it by; one flat object, so the stock pattern
# for arguments still counts it as that call's.
STAND_IN = '{"_": 0}'


def hide_other_empty_arguments(text: str, current: int) -> str:
    """`text` with the empty arguments of every call but the `current`-th replaced."""

    starts = [m.start() for m in CALL_NAMES.finditer(NAME.pattern, text)]

    def replace(match: re.Match) -> str:
        index = sum(1 for start in starts if start < match.start())
        return match.group(0) if index == current else match.group(1) + STAND_IN

    return EMPTY_ARGUMENTS.sub(replace, text)


def depth_at(text: str, end: int) -> int:
    """How many JSON objects and lists are open at `end` (strings skipped)."""
    depth, in_string, escaped = 0, False, False
    for ch in text[:end]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
    return depth


class _CallNames:
    """`re` as the stock parser's module sees it while this parser streams: matches of a
    pattern that begins with the `"name"` key are kept only at the depth of the first
    (a call's own name comes before its arguments), so a key `name` inside a call's
    arguments is no call."""

    def __getattr__(self, attr):
        return getattr(re, attr)

    def finditer(self, pattern, string, flags=0):
        matches = list(re.finditer(pattern, string, flags))
        if not str(pattern).startswith('"name"') or len(matches) < 2:
            return iter(matches)
        depths = [depth_at(string, m.start()) for m in matches]
        return iter(m for m, d in zip(matches, depths) if d == depths[0])


CALL_NAMES = _CallNames()


@ToolParserManager.register_module("xlam_per_call")
class XlamPerCallToolParser(xLAMToolParser):
    def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, *rest):
        current = self.streaming_state["current_tool_index"]
        # Synchronous, on the server's one event loop: nothing else parses meanwhile.
        stock_re, stock_module.re = stock_module.re, CALL_NAMES
        try:
            delta = super().extract_tool_calls_streaming(
                previous_text, hide_other_empty_arguments(current_text, current), delta_text, *rest
            )
        finally:
            stock_module.re = stock_re
        # The calls as written, not with the stand-in (the stock parser keeps its last parse).
        _, calls = self.preprocess_model_output(current_text)
        try:
            parsed = json.loads(calls) if calls else None
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list):
            self.prev_tool_call_arr = parsed
        return delta
