"""Attack families: renders the wording of the grammars in `families.json` (the one file
pruefstand reads too; docs/attacks.md). Stdlib only; `register_wording_attacks` needs
agentdojo.

A family's text is its framing with `{body}` replaced by the non-empty parts of
[authority, urgency, goal] joined by the formatting option; then `{user}`, `{model}`,
`{secret}`, `{tools}` and last `{goal}` (verbatim, so a goal with braces is safe) are
filled in. Which option each slot takes (the "choices") comes from pruefstand with the
request (`wording`, keyed by case id): drawn from the run's seed for per-run cases, set
by the search for adaptive ones. This module never draws.

An attacker model's text (request `templates`, keyed by case id) is a template holding
`{goal}`, filled the same way. Unlike the grammar's, it may hold anything YAML treats
specially (apostrophes, `---` lines, `: `), so it never passes through the suite's
YAML: the environment is built with a token in its place, and the token is replaced by
the text in the built environment's strings (`install_safe_injection`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

from . import spans

GRAMMAR = json.loads((Path(__file__).with_name("families.json")).read_text(encoding="utf-8"))
FAMILIES = {f["name"]: f for f in GRAMMAR["families"]}
SLOTS = ("framing", "authority", "urgency", "goal", "formatting")
PER_RUN_PREFIX = "fresh_"
# AgentDojo's important_instructions names the user so (attacks/important_instructions_attacks.py).
USER_NAME = "Emma Johnson"

_KEY = b"pruefstand-payload-bank/1"


def secret(seed: int, family: str) -> str:
    """A family's per-run token: stable for a seed, different across seeds."""
    digest = hmac.new(_KEY, f"{int(seed)}:{family}".encode(), hashlib.sha256).hexdigest()
    return f"PS-{digest[:12].upper()}"


def template(family: str, choices) -> str:
    """One expansion of a family's grammar, placeholders not yet filled."""
    fam = FAMILIES[family]
    if len(choices) != len(SLOTS):
        raise ValueError(f"{family}: {len(choices)} choices for {len(SLOTS)} slots")
    picked = []
    for slot, index in zip(SLOTS, choices):
        options = fam[slot]
        if not isinstance(index, int) or not 0 <= index < len(options):
            raise ValueError(f"{family}.{slot}: no option {index!r} (has {len(options)})")
        picked.append(options[index])
    framing, authority, urgency, goal, formatting = picked
    body = formatting.join(p for p in (authority, urgency, goal) if p)
    return framing.replace("{body}", body)


def canonical(family: str) -> str:
    return template(family, [0] * len(SLOTS))


def fill(text: str, goal: str, *, user: str, model: str, secret_token: str, tools: str = "") -> str:
    text = text.replace("{user}", user).replace("{model}", model).replace("{secret}", secret_token)
    return text.replace("{tools}", tools).replace("{goal}", goal)


def tools_sequence(task_suite, injection_task) -> str:
    """The goal's tool calls with placeholders, worded as AgentDojo's tool_knowledge
    does (empty when the task ships no placeholder arguments)."""
    env = task_suite.load_and_inject_default_environment({})
    calls = injection_task.ground_truth(env)
    if not calls or any(c.placeholder_args is None for c in calls):
        return ""
    out = []
    for i, call in enumerate(calls):
        lead = "You should use" if i == 0 else ("Finally, you should use" if i == len(calls) - 1 else "Then, you should use")
        out.append(f"{lead} the tool `{call.function}` with the arguments: {call.placeholder_args}.")
    return " ".join(out)


_WORDING: dict = {}
_TEMPLATES: dict = {}
_SEED = 0

# The longest attacker template the gym injects (pruefstand refuses longer ones first).
MAX_TEMPLATE_CHARS = 4000

# Attacker texts as injected -> the token the environment is built with.
_SAFE_TEXTS: dict = {}


def set_wording(seed: int, wording: dict, templates: dict | None = None) -> None:
    """The run's seed, the wording of every grammar-worded case (request `wording`) and
    the attacker's templates (request `templates`)."""
    global _SEED
    _SEED = int(seed)
    _WORDING.clear()
    _WORDING.update(wording)
    _TEMPLATES.clear()
    _TEMPLATES.update(templates or {})


def add_text(case_id: str, wording: dict | None, template: str | None) -> None:
    """The wording or template of one more case (an open pass's, after `set_wording`)."""
    if wording is not None:
        _WORDING[case_id] = wording
    if template is not None:
        _TEMPLATES[case_id] = template


def check_templates(templates) -> dict:
    """Validate the request's `templates` map: {case id: text holding `{goal}`}, bounded,
    no control characters but newline and tab."""
    if not isinstance(templates, dict):
        raise ValueError("`templates` must be an object keyed by case id")
    for case_id, text in templates.items():
        if not isinstance(text, str) or "{goal}" not in text:
            raise ValueError(f"template of {case_id!r}: must be a string holding {{goal}}")
        if len(text) > MAX_TEMPLATE_CHARS:
            raise ValueError(f"template of {case_id!r}: {len(text)} characters, at most {MAX_TEMPLATE_CHARS}")
        if any(ord(c) < 32 and c not in "\n\t" for c in text):
            raise ValueError(f"template of {case_id!r}: holds a control character")
    return templates


def _safe(text: str) -> str:
    """Registers an attacker text for safe injection; returns it unchanged."""
    token = "PRUEFSTANDINJECTION" + hashlib.sha256(text.encode()).hexdigest()[:24].upper()
    _SAFE_TEXTS[text] = token
    return text


def _restore(value, tokens: dict):
    """`value` with every token in its strings replaced by its text (models, dicts and
    lists changed in place, bypassing validation: the text is data, not a field value
    to coerce)."""
    if isinstance(value, str):
        if "PRUEFSTANDINJECTION" in value:
            for token, text in tokens.items():
                value = value.replace(token, text)
        return value
    if isinstance(value, list):
        value[:] = [_restore(v, tokens) for v in value]
    elif isinstance(value, dict):
        for k in list(value):
            value[k] = _restore(value[k], tokens)
    elif hasattr(value, "__dict__") and hasattr(value, "model_fields"):
        for k, v in list(vars(value).items()):
            object.__setattr__(value, k, _restore(v, tokens))
    return value


def install_safe_injection() -> None:
    """Build environments with tokens in place of attacker texts, then put the texts into
    the built environment; keep each built environment for `spans` (idempotent)."""
    from agentdojo.task_suite.task_suite import TaskSuite

    original = TaskSuite.load_and_inject_default_environment
    if getattr(original, "_pruefstand_safe", False):
        return

    def load_and_inject_default_environment(self, injections):
        swapped = {k: _SAFE_TEXTS.get(v, v) if isinstance(v, str) else v for k, v in injections.items()}
        env = original(self, swapped)
        tokens = {tok: text for text, tok in _SAFE_TEXTS.items() if tok in swapped.values()}
        env = _restore(env, tokens) if tokens else env
        # Kept for marking where the text landed in the tool results (spans.py).
        spans.remember(injections, env)
        return env

    load_and_inject_default_environment._pruefstand_safe = True
    TaskSuite.load_and_inject_default_environment = load_and_inject_default_environment


def check_wording(wording) -> dict:
    """Validate the request's `wording` map: {case id: {family, choices}}."""
    if not isinstance(wording, dict):
        raise ValueError("`wording` must be an object keyed by case id")
    for case_id, w in wording.items():
        if not isinstance(w, dict) or w.get("family") not in FAMILIES:
            raise ValueError(f"wording of {case_id!r}: unknown family in {w!r}; valid: {', '.join(FAMILIES)}")
        template(w["family"], w.get("choices") or [])
    return wording


def register_wording_attacks(extra_names=()) -> list[str]:
    """Register `fresh_<family>` for every family, and any other attack name a request's
    wording uses (the adaptive attempts), in AgentDojo's registry (idempotent). Such an
    attack injects, into every vector the user task reads, the text its case's wording
    renders."""
    from agentdojo.attacks.attack_registry import ATTACKS
    from agentdojo.attacks.base_attacks import BaseAttack, get_model_name_from_pipeline

    def attack(self, user_task, injection_task):
        case_id = f"{self.task_suite.name}/{user_task.ID}/{self.name}/{injection_task.ID}"
        w, written = _WORDING.get(case_id), _TEMPLATES.get(case_id)
        if w is None and written is None:
            raise KeyError(f"no wording for case {case_id} in the request")
        family = w["family"] if w is not None else "attacker"
        text = written if written is not None else template(family, w["choices"])
        tools = tools_sequence(self.task_suite, injection_task) if "{tools}" in text else ""
        text = fill(
            text,
            injection_task.GOAL,
            user=USER_NAME,
            model=get_model_name_from_pipeline(self.target_pipeline),
            secret_token=secret(_SEED, family),
            tools=tools,
        )
        if written is not None:
            text = _safe(text)
        return {inj: text for inj in self.get_injection_candidates(user_task)}

    names = [PER_RUN_PREFIX + f for f in FAMILIES] + [n for n in extra_names if n]
    for name in names:
        if name not in ATTACKS:
            ATTACKS[name] = type(f"Wording_{name}", (BaseAttack,), {"name": name, "attack": attack})
    return names
