"""The training request: `request.json` as `pruefstand train` writes it, read and checked
field by field. A missing, unknown or mistyped field is a refusal naming the field.

Not here: whether the files it names hold good rows (rows.py) or the checkpoints
belong to it (train.py).
"""

import json
import math
import os
from dataclasses import dataclass


class Refused(Exception):
    """Bad input, found before the first step: the trainer says why and exits 2."""


@dataclass(frozen=True)
class Request:
    path: str
    kind: str
    base_model: str
    base_model_name: str
    chat_template: str | None
    rows: list
    tokenize_url: str | None
    served_model: str | None
    out: str
    checkpoints: str
    seed: int
    steps: int
    learning_rate: float
    lora_r: int
    lora_alpha: float
    max_length: int
    beta: float
    batch_size: int
    # kind "grpo" only (grpo.py): the environment, the policy's server, the sampling.
    online: dict | None = None

    @property
    def adapter(self):
        return os.path.join(self.out, "adapter")

    def fingerprint(self):
        """What a checkpoint must have been made by to be resumed: everything that
        changes the steps, not where the server listens or where the adapter goes."""
        return {
            "kind": self.kind,
            "base_model": self.base_model,
            "seed": self.seed,
            "steps": self.steps,
            "learning_rate": self.learning_rate,
            "lora_r": self.lora_r,
            "lora_alpha": self.lora_alpha,
            "max_length": self.max_length,
            "beta": self.beta,
            "batch_size": self.batch_size,
        }


# field: (types, required non-null)
_FIELDS = {
    "kind": ((str,), True),
    "base_model": ((str,), True),
    "base_model_name": ((str,), True),
    "chat_template": ((str,), False),
    "rows": ((list,), True),
    "tokenize_url": ((str,), False),
    "served_model": ((str,), False),
    "out": ((str,), True),
    "checkpoints": ((str,), True),
    "seed": ((int,), True),
    "steps": ((int,), True),
    "learning_rate": ((int, float), True),
    "lora_r": ((int,), True),
    "lora_alpha": ((int, float), True),
    "max_length": ((int,), True),
    "beta": ((int, float), True),
    "batch_size": ((int,), True),
}

# kind "grpo": the `online` object's fields (grpo.py says what each is for).
_ONLINE = {
    "env_url": str,
    "policy_url": str,
    "served_model": str,
    "adapter_name": str,
    "live_dir": str,
    "live_dir_server": str,
    "num_generations": int,
    "prompts_per_step": int,
    "max_completion_length": int,
    "temperature": float,
    "prefix": str,
    "cases": list,
}


def load(path):
    """Reads and checks the request at PATH; raises Refused naming the field."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise Refused(f"request {path}: cannot read it: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise Refused(f"request {path}: line {e.lineno}: not JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise Refused(f"request {path}: not a JSON object")
    online = data.pop("online", None)
    if data.get("kind") == "grpo":
        online = _online(path, online)
        # Online training has no export rows: the environment is its data.
        data["rows"] = data.get("rows") or ["-"]
    elif online is not None:
        raise Refused(f"request {path}: field `online` is for kind \"grpo\" only")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise Refused(f"request {path}: unknown field `{unknown[0]}`")
    values = {}
    for name, (types, required) in _FIELDS.items():
        if name not in data:
            raise Refused(f"request {path}: field `{name}` is missing")
        value = data[name]
        if value is None and not required:
            values[name] = None
            continue
        # JSON true/false are ints to Python; no field here is a boolean.
        if isinstance(value, bool) or not isinstance(value, types):
            want = " or ".join("a number" if t is float else {str: "a string", int: "an integer", list: "a list"}[t] for t in types)
            if want == "an integer or a number":
                want = "a number"
            raise Refused(f"request {path}: field `{name}` must be {want}{'' if required else ' or null'}, not {json.dumps(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise Refused(f"request {path}: field `{name}` must be finite")
        values[name] = value
    r = values
    if r["kind"] not in ("dpo", "sft", "grpo"):
        raise Refused(f"request {path}: field `kind` must be \"dpo\", \"sft\" or \"grpo\", not {json.dumps(r['kind'])}")
    if not r["rows"]:
        raise Refused(f"request {path}: no rows: field `rows` names no export file")
    for i, item in enumerate(r["rows"]):
        if not isinstance(item, str) or not item:
            raise Refused(f"request {path}: field `rows[{i}]` must be a path, not {json.dumps(item)}")
    for name in ("steps", "lora_r", "max_length", "batch_size"):
        if r[name] < 1:
            raise Refused(f"request {path}: field `{name}` must be at least 1, not {r[name]}")
    for name in ("learning_rate", "lora_alpha", "beta"):
        if r[name] <= 0:
            raise Refused(f"request {path}: field `{name}` must be above 0, not {r[name]}")
    if r["seed"] < 0:
        raise Refused(f"request {path}: field `seed` must be 0 or more, not {r['seed']}")
    for name in ("base_model_name", "out", "checkpoints", "base_model"):
        if not r[name]:
            raise Refused(f"request {path}: field `{name}` is empty")
    if r["tokenize_url"] is not None:
        if not r["tokenize_url"].startswith(("http://", "https://")):
            raise Refused(f"request {path}: field `tokenize_url` must be an http(s) URL, not {json.dumps(r['tokenize_url'])}")
        if not r["served_model"]:
            raise Refused(f"request {path}: field `served_model` must name the served model when `tokenize_url` is given")
    if not os.path.isdir(r["base_model"]):
        raise Refused(f"request {path}: field `base_model`: {r['base_model']} is not a folder")
    if r["chat_template"] is not None and not os.path.isfile(r["chat_template"]):
        raise Refused(f"request {path}: field `chat_template`: {r['chat_template']} is not a file")
    if r["kind"] == "grpo":
        r["rows"] = []
    for i, item in enumerate(r["rows"]):
        if not os.path.isfile(item):
            raise Refused(f"request {path}: field `rows[{i}]`: {item} is not a file")
    return Request(path=path, online=online, **{k: (float(v) if k in ("learning_rate", "lora_alpha", "beta") else v) for k, v in r.items()})


def _online(path, online):
    """The `online` object of a grpo request, each field checked."""
    if not isinstance(online, dict):
        raise Refused(f"request {path}: kind \"grpo\" needs the object `online`")
    unknown = sorted(set(online) - set(_ONLINE))
    if unknown:
        raise Refused(f"request {path}: unknown field `online.{unknown[0]}`")
    for name, kind in _ONLINE.items():
        if name not in online:
            raise Refused(f"request {path}: field `online.{name}` is missing")
        value = online[name]
        ok = isinstance(value, (int, float)) if kind is float else isinstance(value, kind)
        if isinstance(value, bool) or not ok:
            raise Refused(f"request {path}: field `online.{name}` must be {kind.__name__}, not {json.dumps(value)}")
    for name in ("num_generations", "prompts_per_step", "max_completion_length"):
        if online[name] < 1:
            raise Refused(f"request {path}: field `online.{name}` must be at least 1, not {online[name]}")
    if online["num_generations"] < 2:
        raise Refused(f"request {path}: field `online.num_generations` must be at least 2 (GRPO compares a group)")
    if not online["temperature"] > 0:
        raise Refused(f"request {path}: field `online.temperature` must be above 0")
    return dict(online, temperature=float(online["temperature"]))
