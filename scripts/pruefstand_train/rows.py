"""Rows of `pruefstand export` files, rendered and tokenised exactly as the served model
sees them: with the version's served chat template (the spec's `chat_template`, else the
model folder's) and the row's tools, through transformers' `apply_chat_template` — the
call vLLM makes — then the tokenizer without added special tokens, as vLLM tokenises a
rendered chat.

A DPO row becomes `prompt_ids` (the prompt with the generation prompt, as the server
was asked), `chosen_ids` and `rejected_ids` (the rest of prompt+chosen and
prompt+rejected rendered whole). An SFT row becomes `input_ids` (the conversation
rendered whole) and `assistant_mask`: 1 on the tokens of each assistant turn, from the
end of the prompt the server was given for that turn (the conversation before it, with
the generation prompt) to the end of the turn — so the model learns its own turns, never
to write a tool's output or an injection.

Each such boundary must fall on a token boundary: the prompt's tokens a prefix of the
tokens of prompt+completion. If a template renders a prompt differently when a turn
follows it, or tokens merge across the cut, the row is refused naming it and the first
differing token (TRL would cut the prompt silently where the tokens part).

Also used by tests/fixtures/export/render.py (needs only transformers). Not here: the
comparison with the server (server.py) and training (train.py).
"""

import json

from .request import Refused

ROLES = ("system", "developer", "user", "assistant", "tool")


class Row:
    """One line of an export: where it is (`FILE:LINE`), its JSON, and once tokenised
    its token ids."""

    def __init__(self, where, data):
        self.where = where
        self.data = data
        self.tools = data["tools"]
        self.ids = {}

    def refuse(self, what):
        raise Refused(f"row {self.where}: {what}")


def _check_messages(where, messages, field):
    if not isinstance(messages, list) or not messages:
        raise Refused(f"row {where}: field `{field}` must be a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise Refused(f"row {where}: field `{field}[{i}]` is not a chat message (role one of {', '.join(ROLES)})")
        calls = m.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise Refused(f"row {where}: field `{field}[{i}].tool_calls` must be a list")
            for j, call in enumerate(calls):
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise Refused(f"row {where}: field `{field}[{i}].tool_calls[{j}]` has no function name")


def read(paths, kind):
    """Every row of the export files PATHS, checked to be of KIND ("dpo" or "sft")."""
    want = ("prompt", "chosen", "rejected") if kind == "dpo" else ("messages",)
    rows = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
        except OSError as e:
            raise Refused(f"export {path}: cannot read it: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise Refused(f"export {path}: not UTF-8 (byte {e.start})") from None
        if lines and lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, 1):
            where = f"{path}:{number}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise Refused(f"row {where}: not JSON: {e.msg} (column {e.colno})") from None
            if not isinstance(data, dict):
                raise Refused(f"row {where}: not a JSON object")
            other = ("messages",) if kind == "dpo" else ("prompt", "chosen", "rejected")
            if any(k in data for k in other) and not all(k in data for k in want):
                raise Refused(f"row {where}: an {'SFT' if kind == 'dpo' else 'DPO'} row, and this is {kind.upper()} training")
            for field in want:
                if field not in data:
                    raise Refused(f"row {where}: field `{field}` is missing")
                _check_messages(where, data[field], field)
            tools = data.get("tools")
            if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
                raise Refused(f"row {where}: field `tools` must be a list of tool schemas")
            rows.append(Row(where, data))
    return rows


def render(tokenizer, template, messages, tools, generation_prompt):
    """The text the server's chat template makes of MESSAGES and TOOLS. An empty tool
    list is passed as it stands: vLLM passes the request's list through."""
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )


def encode(tokenizer, text):
    """Token ids of rendered chat TEXT, as vLLM tokenises it: the template wrote the
    special tokens, none is added."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def token_text(tokenizer, token_id):
    return repr(tokenizer.decode([token_id]))


def first_difference(a, b):
    """Index of the first position where A and B differ, or None when one is a prefix of
    the other and they are equally long."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class Renderer:
    """Renders and tokenises rows with one tokenizer and template, and collects every
    (messages, generation prompt, token ids) the server should agree with."""

    def __init__(self, tokenizer, template):
        self.tokenizer = tokenizer
        self.template = template

    def _render(self, row, messages, generation_prompt, what):
        try:
            return render(self.tokenizer, self.template, messages, row.tools, generation_prompt)
        except Exception as e:  # jinja2's TemplateError and whatever the template raises
            row.refuse(f"the chat template does not render {what} with the row's tools: {type(e).__name__}: {e}")

    def _boundary(self, row, prompt_text, prompt_ids, full_text, full_ids, what, more=True):
        """PROMPT must be where FULL begins, in text and in tokens (and, with MORE, FULL
        must go on after it)."""
        if not full_text.startswith(prompt_text):
            at = first_difference(prompt_text, full_text)
            row.refuse(
                f"the prompt/completion boundary: {what} does not begin with the prompt as rendered alone "
                f"(character {at}: {prompt_text[at:at + 20]!r} vs {full_text[at:at + 20]!r})"
            )
        at = first_difference(prompt_ids, full_ids[: len(prompt_ids)])
        if at is not None:
            ours = token_text(self.tokenizer, prompt_ids[at])
            theirs = "nothing" if at >= len(full_ids) else f"{full_ids[at]} ({token_text(self.tokenizer, full_ids[at])})"
            row.refuse(
                f"the prompt/completion boundary is not a token boundary: token {at} differs: "
                f"the prompt's {prompt_ids[at]} ({ours}) vs {what}'s {theirs}"
            )
        if more and len(full_ids) == len(prompt_ids):
            row.refuse(f"{what} renders no token after the prompt")

    def tokenise(self, row):
        """Fills ROW.ids and returns the server checks [(what, messages, generation
        prompt, ids)] for it."""
        d = row.data
        checks = []
        if "prompt" in d:
            prompt_text = self._render(row, d["prompt"], True, "the prompt")
            prompt_ids = encode(self.tokenizer, prompt_text)
            checks.append(("prompt", d["prompt"], True, prompt_ids))
            row.ids["prompt_ids"] = prompt_ids
            for side in ("chosen", "rejected"):
                messages = d["prompt"] + d[side]
                what = f"prompt+{side}"
                full_text = self._render(row, messages, False, what)
                full_ids = encode(self.tokenizer, full_text)
                self._boundary(row, prompt_text, prompt_ids, full_text, full_ids, what)
                checks.append((what, messages, False, full_ids))
                row.ids[f"{side}_ids"] = full_ids[len(prompt_ids):]
            return checks
        messages = d["messages"]
        full_text = self._render(row, messages, False, "the conversation")
        full_ids = encode(self.tokenizer, full_text)
        mask = [0] * len(full_ids)
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            row.refuse("the conversation has no assistant turn to learn")
        for i in turns:
            what = f"the prompt of message {i}"
            if i == 0:
                row.refuse("the conversation begins with an assistant turn: it has no prompt")
            prompt_text = self._render(row, messages[:i], True, what)
            prompt_ids = encode(self.tokenizer, prompt_text)
            turn_text = self._render(row, messages[: i + 1], False, f"the conversation up to message {i}")
            turn_ids = encode(self.tokenizer, turn_text)
            self._boundary(row, prompt_text, prompt_ids, turn_text, turn_ids, f"the conversation up to message {i}")
            self._boundary(row, turn_text, turn_ids, full_text, full_ids, "the conversation", more=False)
            for k in range(len(prompt_ids), len(turn_ids)):
                mask[k] = 1
            checks.append((what, messages[:i], True, prompt_ids))
        checks.append(("the conversation", messages, False, full_ids))
        row.ids["input_ids"] = full_ids
        row.ids["assistant_mask"] = mask
        return checks


def load_tokenizer(base_model, chat_template_path):
    """The model folder's tokenizer and the template the server applies: the file given,
    else the folder's own (refused when it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model)
    if chat_template_path is not None:
        with open(chat_template_path, encoding="utf-8") as f:
            template = f.read()
        if not template.strip():
            raise Refused(f"chat template {chat_template_path} is empty")
    else:
        template = tokenizer.chat_template
        if isinstance(template, dict):
            template = template.get("default")
        if not template:
            raise Refused(f"the model folder {base_model} has no chat template, and the request names none")
    return tokenizer, template
