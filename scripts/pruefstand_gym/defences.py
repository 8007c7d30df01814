"""AgentDojo's two defences that 0.1.35 ties to a cloud model or a local torch install,
run on what a bench has: the tool filter on the agent under test (its own served model),
and the prompt-injection detector with its classifier behind an HTTP endpoint.

Both keep AgentDojo's semantics (agent_pipeline.py, llms/openai_llm.py, pi_detector.py):
the same prompt, roles, replacement text and threshold direction, in the same place of
the pipeline, so the trace holds what AgentDojo's would. The selftest pins them against
the installed package's own elements. Not here: composing the pipeline (`dojo`), the
agent protocol (`adapter`, `protocol`).

Import only where agentdojo is wanted.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.agent_pipeline.pi_detector import PromptInjectionDetector
from agentdojo.functions_runtime import EmptyEnv, Env, FunctionsRuntime
from agentdojo.types import (
    ChatAssistantMessage,
    ChatMessage,
    ChatUserMessage,
    get_text_content_as_str,
    text_content_block_from_string,
)


class ToolFilter(BasePipelineElement):
    """`OpenAILLMToolFilter` with the agent under test as the model: the filter prompt is
    appended as a user message, the agent asks its model with every tool offered and
    `tool_choice="none"`, only the tools whose names appear in the answer stay in the
    runtime, and both messages stay in the conversation."""

    def __init__(self, prompt: str, element) -> None:
        self.prompt = prompt
        self.element = element

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        messages = [*messages, ChatUserMessage(role="user", content=[text_content_block_from_string(self.prompt)])]
        text = self.element.name_tools(query, runtime, messages)
        output = ChatAssistantMessage(
            role="assistant",
            content=[text_content_block_from_string(text)] if text is not None else None,
            tool_calls=None,
        )
        offered = list(runtime.functions)
        kept = keep_named(runtime.functions, output)
        runtime.update_functions(kept)
        self.element.note_gym_event(
            "tool_filter",
            len(messages) + 1,
            f"kept {len(kept)} of {len(offered)} tools: {', '.join(kept) or 'none'}",
        )
        return query, runtime, env, [*messages, output], extra_args


def keep_named(functions: dict, output: ChatAssistantMessage) -> dict:
    """AgentDojo's rule: a tool stays when its name is a substring of the answer."""
    new_tools = {}
    for tool_name, tool in functions.items():
        if output["content"] is not None and tool_name in get_text_content_as_str(output["content"]):
            new_tools[tool_name] = tool
    return new_tools


class DetectorError(Exception):
    """The classifier could not answer: the case is a bench error (run again on resume),
    never a silent "not flagged"."""


# Attempts of one classification before the case fails: a restarting server or a
# dropped connection is not the version's fault.
_ATTEMPTS = 3


def classify(detector: dict, text: str, api_key: str | None) -> tuple[str, float]:
    """(label, score) of the top class, as Hugging Face's `text-classification` pipeline
    gives them: POST `{"model", "input": [text]}` to `detector["url"]` (or the whole URL
    in `connect_url`, which is never said), answered with vLLM's
    `{"data": [{"label", "probs"}]}`; score = max(probs)."""
    body = json.dumps({"model": detector["model"], "input": [text]}).encode("utf-8")
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    url = detector["url"]
    connect, basic = without_userinfo(detector.get("connect_url") or url)
    if basic and not api_key:
        headers["authorization"] = f"Basic {basic}"
    last = ""
    for attempt in range(_ATTEMPTS):
        if attempt:
            time.sleep(0.5 * 2 ** (attempt - 1))
        request = urllib.request.Request(connect, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=detector["timeout_s"]) as resp:
                answer = json.loads(resp.read(1 << 20))
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
            if e.code < 500 and e.code != 429:
                break
            continue
        except (OSError, ValueError) as e:
            last = f"{type(e).__name__}: {e}"
            continue
        try:
            first = answer["data"][0]
            label, probs = first["label"], [float(p) for p in first["probs"]]
            if not isinstance(label, str) or not probs or not all(0.0 <= p <= 1.0 for p in probs):
                raise ValueError("label or probs out of shape")
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise DetectorError(
                f"classifier {url}: the answer is not vLLM's classification shape ({type(e).__name__}: {e})"
            ) from None
        return label, max(probs)
    raise DetectorError(f"classifier {url}: {last} after {_ATTEMPTS} attempts")


def without_userinfo(url: str) -> tuple[str, str | None]:
    """`url` without `user:password@`, and those as HTTP basic credentials (urllib would
    take them for part of the host name; the agent's HTTP client sends them so)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, None
    host = parts.netloc.rsplit("@", 1)[1]
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    basic = base64.b64encode(f"{user}:{password}".encode("utf-8")).decode("ascii")
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), basic


class HttpPIDetector(PromptInjectionDetector):
    """AgentDojo's `PromptInjectionDetector` — which tool outputs it checks, and the
    replacement `transform` writes into the conversation — deciding as
    `TransformersBasedPIDetector.detect` does: safety = score of the top label when it
    is `safe_label`, else 1 − score; an injection when safety < threshold."""

    def __init__(self, detector: dict, element, api_key: str | None = None) -> None:
        super().__init__(mode="message", raise_on_injection=False)
        self.detector = detector
        self.safe_label = detector["safe_label"]
        self.threshold = detector["threshold"]
        self.element = element
        self.api_key = api_key
        self._verdicts: list[tuple[bool, float]] = []

    def detect(self, tool_output: str) -> tuple[bool, float]:
        # Every output is classified, an empty one (a tool error's content) too, as
        # AgentDojo's detector does: what it counts is what AgentDojo would count.
        label, score = classify(self.detector, tool_output, self.api_key)
        safety_score = score if label == self.safe_label else 1 - score
        verdict = (safety_score < self.threshold, safety_score)
        self._verdicts.append(verdict)
        return verdict

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        self._verdicts = []
        out = super().query(query, runtime, env, messages, extra_args)
        # AgentDojo checks the trailing tool messages last first: the verdicts are in
        # that order.
        checked = []
        for i in range(len(messages) - 1, -1, -1):
            if messages[i]["role"] != "tool":
                break
            checked.append(i)
        for i, (flagged, safety) in zip(checked, self._verdicts):
            if flagged:
                call = messages[i].get("tool_call")
                tool = call.function if call is not None else "a tool"
                self.element.count_gym_flag()
                self.element.note_gym_event(
                    "guardrail_flag",
                    i + 1,
                    f"{tool}'s output replaced in the conversation: classifier {self.detector['model']} "
                    f"P({self.safe_label}) = {safety:.3f} < threshold {self.threshold:g}",
                )
        return out
