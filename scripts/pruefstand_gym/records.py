"""Cases, trace paths and case records (crates/core/src/case.rs `CaseRecord`), without agentdojo.

What the Rust side defines is read from the generated contract (`schema.py`): a
record's fields, their order and defaults, the kinds and outcomes, the case-id scheme
and the traces' folder. This module says only where each value comes from."""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import schema
from .protocol import STAT_KEYS, empty_counters

# What a case measures (crates/core/src/case.rs `CaseKind`).
KINDS = schema.choices("case-record", "CaseKind")

# The record's fields in crates/core/src/case.rs order, from the schema generated from that type.
RECORD_FIELDS = schema.record_fields()

# How a case ended: scored by AgentDojo's rules, scored as a context overflow (utility
# false, the injection counted as landed), or an error of the bench (no scores).
OUTCOMES = schema.choices("case-record", "Outcome")

# The run directory's folder of AgentDojo's traces (crates/store/src/files.rs `RunFile::Traces`).
TRACES_DIR = schema.run_file("Traces")

# The most of a case's error text a record keeps: an agent's `{"error": …}` of 20 MB
# would otherwise be stored whole in cases.jsonl and events.jsonl.
MAX_ERROR_CHARS = 4096


def cut_error(text: str) -> str:
    """The error as stored: at most MAX_ERROR_CHARS characters, the rest counted."""
    text = str(text)
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return f"{text[:MAX_ERROR_CHARS]}… {len(text) - MAX_ERROR_CHARS} characters more"

PIPELINE_NAME = "pruefstand-gym"


class RequestError(Exception):
    """Bad input in a request: exit 2 before `start`."""


def pipeline_name(defence: str | None) -> str:
    return PIPELINE_NAME if defence is None else f"{PIPELINE_NAME}-{defence}"


def default_case_id(case: dict) -> str:
    """The id crates/core/src/case.rs gives a case of this shape (the request's id is kept)."""
    return schema.case_id_format(case["kind"]).format_map(case)


def trace_relpath(case: dict, defence: str | None) -> str:
    """AgentDojo's trace path of a case, relative to run_dir. AgentDojo 0.1.35 writes
    `<logdir>/<pipeline name, '/'→'_'>/<suite>/<user task or injection task>/<attack or
    none>/<injection task or none>.json`."""
    pipe = pipeline_name(defence).replace("/", "_")
    if case["kind"] == "injection_goal":
        task, attack, inj = case["injection_task"], "none", "none"
    elif case["kind"] == "clean":
        task, attack, inj = case["user_task"], "none", "none"
    else:
        task, attack, inj = case["user_task"], case["attack"], case["injection_task"]
    return f"{TRACES_DIR}/{pipe}/{case['suite']}/{task}/{attack}/{inj}.json"


def check_case_shape(i: int, case: object) -> dict:
    """Validate a case's fields and kind-specific nulls (not the names: that needs agentdojo)."""
    where = f"cases[{i}]"
    if not isinstance(case, dict):
        raise RequestError(f"{where}: must be an object")
    for key in ("id", "kind", "suite"):
        if not isinstance(case.get(key), str) or not case.get(key):
            raise RequestError(f"{where}: `{key}` must be a non-empty string")
    kind = case["kind"]
    if kind not in KINDS:
        raise RequestError(f"{where} ({case['id']}): unknown kind {kind!r}; valid: {', '.join(KINDS)}")
    c = {
        "id": case["id"],
        "kind": kind,
        "suite": case["suite"],
        "user_task": case.get("user_task"),
        "injection_task": case.get("injection_task"),
        "attack": case.get("attack"),
    }
    for key in ("user_task", "injection_task", "attack"):
        if c[key] is not None and (not isinstance(c[key], str) or not c[key]):
            raise RequestError(f"{where} ({c['id']}): `{key}` must be a non-empty string or null")
    if c["attack"] == "none":
        c["attack"] = None
    # A kind needs exactly the fields its id is made of (crates/core/src/case.rs's scheme).
    id_format = schema.case_id_format(kind)
    need = {key: "{" + key + "}" in id_format for key in ("user_task", "injection_task", "attack")}
    for key, required in need.items():
        if required and c[key] is None:
            raise RequestError(f"{where} ({c['id']}): kind {kind} needs `{key}`")
        if not required and c[key] is not None:
            raise RequestError(f"{where} ({c['id']}): kind {kind} must have `{key}` null, got {c[key]!r}")
    return c


def make_record(
    case: dict,
    *,
    utility: bool | None,
    security: bool | None,
    error: str | None,
    duration_s: float,
    counters: dict | None,
    trace: str | None,
    context_overflow: bool = False,
    restarts: int = 0,
) -> dict:
    """A case record of `case` (its fields, in the schema's order: `schema.build_record`).
    Errors null utility/security."""
    counters = counters if counters is not None else empty_counters()
    if error is not None:
        utility, security = None, None
        outcome = "error"
        error = cut_error(error)
    else:
        outcome = "context_overflow" if context_overflow else "scored"
    return schema.build_record(
        {
            # The case's own fields that the record repeats, and its id as `case_id`.
            **{key: value for key, value in case.items() if key in RECORD_FIELDS},
            "case_id": case["id"],
            "utility": utility,
            "security": security,
            "outcome": outcome,
            "error": error,
            "duration_s": round(float(duration_s), 4),
            # The agent's counters (the protocol's stats, each a record field).
            **{key: counters.get(key) for key in STAT_KEYS},
            "restarts": int(restarts),
            "trace": trace,
        }
    )


def check_record(record: dict) -> list[str]:
    """Problems with a record's shape (empty list = fine). Used by the selftest."""
    problems = []
    if list(record) != list(RECORD_FIELDS):
        problems.append(f"fields {list(record)} != {list(RECORD_FIELDS)}")
    if record.get("kind") not in KINDS:
        problems.append(f"kind {record.get('kind')!r}")
    if record.get("outcome") not in OUTCOMES:
        problems.append(f"outcome {record.get('outcome')!r}")
    if (record.get("outcome") == "error") != (record.get("error") is not None):
        problems.append("outcome and error disagree")
    if record.get("error") is not None and (record.get("utility") is not None or record.get("security") is not None):
        problems.append("errored record with utility/security set")
    for key in ("utility", "security"):
        if record.get(key) is not None and not isinstance(record[key], bool):
            problems.append(f"{key} not bool/null")
    for key in STAT_KEYS:
        v = record.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            problems.append(f"{key} not a non-negative int/null")
    if not isinstance(record.get("duration_s"), (int, float)):
        problems.append("duration_s not a number")
    return problems


def read_trace_status(path: Path) -> str | None:
    """None when the trace file is intact JSON; else the reason it is not."""
    if not path.exists():
        return "trace missing"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"trace corrupt: {e}"
    if not isinstance(data, dict):
        return "trace corrupt: not a JSON object"
    return None


def write_json_atomic(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=4)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
