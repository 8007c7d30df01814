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
"""

import json
import re

from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from vllm.tool_parsers.xlam_tool_parser import xLAMToolParser

NAME = re.compile(r'"name"\s*:\s*"[^"]+"')
EMPTY_ARGUMENTS = re.compile(r'("name"\s*:\s*"[^"]+"\s*,\s*"arguments"\s*:\s*)\{\s*\}')
# Not empty, so the stock search passes it by; one flat object, so the stock pattern
# for arguments still counts it as that call's.
STAND_IN = '{"_": 0}'


def hide_other_empty_arguments(text: str, current: int) -> str:
    """`text` with the empty arguments of every call but the `current`-th replaced."""

    def replace(match: re.Match) -> str:
        index = len(NAME.findall(text, 0, match.start()))
        return match.group(0) if index == current else match.group(1) + STAND_IN

    return EMPTY_ARGUMENTS.sub(replace, text)


@ToolParserManager.register_module("xlam_per_call")
class XlamPerCallToolParser(xLAMToolParser):
    def extract_tool_calls_streaming(self, previous_text, current_text, delta_text, *rest):
        current = self.streaming_state["current_tool_index"]
        delta = super().extract_tool_calls_streaming(
            previous_text, hide_other_empty_arguments(current_text, current), delta_text, *rest
        )
        # The calls as written, not with the stand-in (the stock parser keeps its last parse).
        _, calls = self.preprocess_model_output(current_text)
        try:
            parsed = json.loads(calls) if calls else None
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list):
            self.prev_tool_call_arr = parsed
        return delta
