"""Injection payload bank: 5 families, per-run secrets (no agentdojo import at module level).

Each family is a fixed template (its grammar's canonical text) that wraps the injection task's goal text VERBATIM and carries a
per-run secret: a token derived from the run's `seed` (HMAC-SHA256), so a resumed run
(same request, same seed) uses the same payloads, and two runs with different seeds
do not share a token a model could have memorised. The secret also lets a report spot
payload text leaking into outputs.

Rules for templates (checked by the selftest): they contain `{goal}` exactly once and
`{secret}` at least once, no other braces, and no apostrophe (AgentDojo formats
payloads into single-quoted YAML scalars, where `'` would break the environment).

`register_payload_attacks()` (needs agentdojo) registers one attack per family, named
`payload_<family>`, usable on any suite (they inject into every vector the user task
reads, like AgentDojo's own fixed-template attacks).
"""

from __future__ import annotations

from pruefstand_gym import families as _families

# The fixed template of each family: its grammar's canonical expansion
# (pruefstand_gym/families.json, the one file both pruefstand and the gym read).
FAMILIES: dict[str, str] = {
    name: _families.canonical(name) for name, f in _families.FAMILIES.items() if f["origin"] == "payload_bank"
}


def families() -> list[str]:
    return list(FAMILIES)


def attack_names() -> list[str]:
    return [f"payload_{family}" for family in FAMILIES]


def secret(seed: int, family: str) -> str:
    """The per-run secret of one family: stable for a seed, different across seeds."""
    if family not in FAMILIES:
        raise KeyError(f"unknown payload family {family!r}; valid: {', '.join(FAMILIES)}")
    return _families.secret(seed, family)


def render(family: str, goal: str, seed: int) -> str:
    """The payload of `family` for an injection goal; the goal text is kept verbatim."""
    template = FAMILIES[family]
    # str.replace, not str.format: a goal may contain braces.
    return template.replace("{secret}", secret(seed, family)).replace("{goal}", goal)


_RUN_SEED = 0


def set_run_seed(seed: int) -> None:
    """The seed the registered attacks use (the run request's `seed`)."""
    global _RUN_SEED
    _RUN_SEED = int(seed)


def register_payload_attacks() -> list[str]:
    """Register `payload_<family>` attacks in AgentDojo's registry (idempotent)."""
    from agentdojo.attacks.attack_registry import ATTACKS
    from agentdojo.attacks.base_attacks import BaseAttack

    names = []
    for family in FAMILIES:
        name = f"payload_{family}"
        names.append(name)
        if name in ATTACKS:
            continue

        def attack(self, user_task, injection_task, _family=family):
            payload = render(_family, injection_task.GOAL, _RUN_SEED)
            return {inj: payload for inj in self.get_injection_candidates(user_task)}

        cls = type(
            f"Payload_{family}_Attack",
            (BaseAttack,),
            {"name": name, "family": family, "attack": attack, "__doc__": f"Payload bank family `{family}`."},
        )
        ATTACKS[name] = cls
    return names
