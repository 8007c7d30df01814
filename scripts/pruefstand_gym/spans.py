"""Where the injected text sits in each tool result of a case: marked by the gym, which
knows where it injected, for the report to highlight — not found again by pattern in
text that AgentDojo re-rendered (YAML folding and quoting, a Python dict's repr).

How. When AgentDojo builds a case's environment, the gym keeps a copy (`remember`).
After the case it builds a *shadow* of that environment: in each field an injection
vector filled, the injected part has every ASCII letter's case swapped and every digit
rotated by five — nothing else changes. It replays the trace's tool calls on the shadow
and renders each result as the executor did. Letters and digits change neither YAML's
nor repr's choices (quoting, folding, escapes), so the shadow's rendering has the
recorded one's length, and the characters where the two differ are the injected ones.
Runs of them, joined across gaps without a letter (spaces, punctuation, a line break's
indentation) and widened by the injection's own leading and trailing punctuation, are
the spans, stored in the trace as `pruefstand_injected`:
`[{"message": i, "spans": [[start, end], …]}]`, UTF-8 byte offsets into message i's
text (its text blocks joined by a line break, as AgentDojo joins them).

A tool result the replay does not reproduce — a call the real run did not execute (a
denied step), a tool that searches or sorts by the injected words, a timestamp — gets
no entry: the report then falls back to matching the injections' lines. A result
reproduced without a difference gets an empty list (nothing injected there) — unless
some vector's field could not be split back, when it gets no entry either.

Not for: scoring (security is AgentDojo's check) or the agent — the model never sees
the shadow, and the real environment is never touched.
"""

from __future__ import annotations

import os
import re
import threading

_LOCAL = threading.local()

_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER = _UPPER.lower()
_DIGITS = "0123456789"
_SHADOW = str.maketrans(_UPPER + _LOWER + _DIGITS, _LOWER + _UPPER + _DIGITS[5:] + _DIGITS[:5])
_LETTER = re.compile(r"[A-Za-z]")
_LEAD = re.compile(r"^[^A-Za-z0-9]*")
_TRAIL = re.compile(r"[^A-Za-z0-9]*$")

# Per suite: vector → [(path to the string holding it, text before, text after)].
_SITES: dict[str, dict[str, list[tuple[tuple, str, str]]]] = {}
_SITES_LOCK = threading.Lock()


def remember(injections: dict, env) -> None:
    """Keeps (a copy of) the environment just built for this thread's case: the run
    changes the one it gets. An environment without injections is never marked."""
    if not injections or getattr(_LOCAL, "busy", False):
        return
    _LOCAL.last = (dict(injections), env.model_copy(deep=True))


def _strings(value, path=()):
    """(path, text) of every string in an environment (models, lists, dicts)."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, (*path, i))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, (*path, ("key", k)))
    elif hasattr(value, "model_fields"):
        for name in type(value).model_fields:
            yield from _strings(getattr(value, name, None), (*path, ("attr", name)))


def _get(value, path):
    for step in path:
        if isinstance(step, int):
            value = value[step]
        elif step[0] == "key":
            value = value[step[1]]
        else:
            value = getattr(value, step[1])
    return value


def _set(value, path, text: str) -> None:
    parent, step = _get(value, path[:-1]), path[-1]
    if isinstance(step, int):
        parent[step] = text
    elif step[0] == "key":
        parent[step[1]] = text
    else:
        # Data, not a field value to validate again (as families._restore).
        object.__setattr__(parent, step[1], text)


def _sites(suite) -> dict:
    """Where each injection vector of `suite` lands: built once per suite from an
    environment whose vectors hold unique tokens."""
    with _SITES_LOCK:
        if suite.name in _SITES:
            return _SITES[suite.name]
        tokens = {v: f"PRUEFSTANDVECTOR{i:04d}X" for i, v in enumerate(suite.get_injection_vector_defaults())}
        _LOCAL.busy = True
        try:
            env = suite.load_and_inject_default_environment(tokens)
        finally:
            _LOCAL.busy = False
        sites: dict[str, list] = {}
        for path, text in _strings(env):
            held = [v for v, t in tokens.items() if t in text]
            # A string holding two vectors cannot be split back exactly: left unmarked.
            if len(held) == 1 and text.count(tokens[held[0]]) == 1:
                before, after = text.split(tokens[held[0]])
                sites.setdefault(held[0], []).append((path, before, after))
        _SITES[suite.name] = sites
        return sites


def _split(real: str, before: str, after: str) -> tuple[int, int] | None:
    """Where the injected part of `real` starts and ends, given the text around the
    vector. The injected text's own line breaks can change how YAML folds the break
    next to it, so the surroundings are matched up to whitespace at the seams."""
    start = len(os.path.commonprefix([real, before]))
    end = len(real) - len(os.path.commonprefix([real[::-1], after[::-1]]))
    if before[start:].strip() or after[: len(after) - (len(real) - end)].strip() or end < start:
        return None
    return start, end


def _shadow(env, injections: dict, sites: dict):
    """A copy of `env` with each injected part letter-swapped; those parts; and whether
    every vector was found (else a result without a difference proves nothing). Read
    from `env`, written to the copy: one object can sit at two paths (an inbox's email
    in `initial_emails` and `emails`), and swapping it twice in place would undo it."""
    shadow = env.model_copy(deep=True)
    parts = []
    complete = True
    for vector in injections:
        found = sites.get(vector, [])
        complete = complete and bool(found)
        for path, before, after in found:
            real = _get(env, path)
            where = _split(real, before, after) if isinstance(real, str) else None
            if where is None:
                complete = False
                continue
            start, end = where
            part = real[start:end]
            _set(shadow, path, real[:start] + part.translate(_SHADOW) + real[end:])
            parts.append(part)
    return shadow, parts, complete


def _runs(real: str, diffs: list[int]) -> list[list[int]]:
    """Differing positions joined into [start, end) runs across letterless gaps."""
    runs: list[list[int]] = []
    for i in diffs:
        if runs and not _LETTER.search(real, runs[-1][1], i):
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return runs


def _widen(real: str, run: list[int], parts: list[str]) -> None:
    """Widens a run by an injected part's own leading and trailing punctuation (`<` of
    `<INFORMATION>`, `###(`), where the rendering kept it."""
    for part in parts:
        lead = _LEAD.match(part).group().lstrip()
        if lead and run[0] >= len(lead) and real[run[0] - len(lead) : run[0]] == lead:
            run[0] -= len(lead)
            break
    for part in parts:
        trail = _TRAIL.search(part).group().rstrip()
        if trail and real[run[1] : run[1] + len(trail)] == trail:
            run[1] += len(trail)
            break


def _spans_of(text: str, rendered: str, parts: list[str]) -> list[list[int]] | None:
    """The injected spans of a recorded tool result `text`, given the shadow's rendering
    of the same call; None where the shadow does not reproduce it."""
    # spotlighting_with_delimiting wraps each result in << >>.
    for pad in (0, 2):
        if pad and not (text.startswith("<<") and text.endswith(">>")):
            continue
        real = text[pad : len(text) - pad]
        if len(real) != len(rendered):
            continue
        diffs = [i for i, (a, b) in enumerate(zip(real, rendered)) if a != b]
        if any(real[i].translate(_SHADOW) != rendered[i] for i in diffs):
            continue
        spans = []
        for run in _runs(real, diffs):
            _widen(real, run, parts)
            start, end = run[0] + pad, run[1] + pad
            spans.append([len(text[:start].encode()), len(text[:end].encode())])
        return spans
    return None


def injected(trace: dict, suite, task) -> list[dict] | None:
    """`pruefstand_injected` for a finished case's trace (see the module's docstring), or
    None where the case injected nothing or its environment was not kept."""
    from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
    from agentdojo.base_tasks import BaseUserTask
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.types import get_text_content_as_str

    last = getattr(_LOCAL, "last", None)
    _LOCAL.last = None
    injections = trace.get("injections")
    if not injections or last is None or last[0] != injections:
        return None
    shadow, parts, complete = _shadow(last[1], injections, _sites(suite))
    if isinstance(task, BaseUserTask):
        shadow = task.init_environment(shadow)
    runtime = FunctionsRuntime(suite.tools)
    marked = []
    for index, message in enumerate(trace.get("messages") or []):
        call = message.get("tool_call") if message.get("role") == "tool" else None
        if not call or call.get("function") not in runtime.functions:
            continue
        result, _ = runtime.run_function(shadow, call["function"], call.get("args") or {}, raise_on_error=False)
        content = message.get("content")
        text = get_text_content_as_str(content) if isinstance(content, list) else content or ""
        spans = _spans_of(text, tool_result_to_str(result), parts) if parts else []
        # Where a vector was not found, a result without a difference is unknown.
        if spans is not None and (spans or complete):
            marked.append({"message": index, "spans": spans})
    return marked
