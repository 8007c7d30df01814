"""The contract with pruefstand as JSON Schemas generated from its Rust types
(`schemas/*.schema.json`, written by pruefstand's tests, never by hand), and a small
validator for the subset of JSON Schema those files use: type, properties, required,
items, minItems/maxItems, minimum/maximum, const, oneOf/anyOf, $ref into $defs.

Beside them, `schemas/constants.json` (generated the same way, src/gym/contract.rs)
holds what has no type to carry it: crates/core/src/case.rs's case-id scheme and the
names crates/store/src/files.rs gives the run files the gym writes.

The runner checks each request against its schema before anything else (`runner.
validate_request`, which restates no field's type); records and requests are checked
against them by the selftest and by `gym.py validate`;
`records` builds a record from them (its fields, their order, what an unset one holds,
the kinds and outcomes), takes the id scheme and the traces' folder from them, and the
in-flight bound is read from them, so nothing here restates the Rust side."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

DIR = Path(__file__).resolve().parent / "schemas"


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """`case-record` or `gym-request`."""
    return json.loads((DIR / f"{name}.schema.json").read_text(encoding="utf-8"))


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def problems(value: object, schema: dict, root: dict | None = None, where: str = "$") -> list[str]:
    """Where `value` breaks `schema`, as `path: why` lines (empty: it conforms)."""
    root = root if root is not None else schema
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            return [f"{where}: unsupported $ref {ref}"]
        return problems(value, root["$defs"][ref[len("#/$defs/"):]], root, where)
    found: list[str] = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            return [f"{where}: {value!r} is not {' or '.join(types)}"]
    if "const" in schema and value != schema["const"]:
        found.append(f"{where}: {value!r} is not {schema['const']!r}")
    for key in ("oneOf", "anyOf"):
        if key in schema:
            matching = [s for s in schema[key] if not problems(value, s, root, where)]
            if not matching or (key == "oneOf" and len(matching) > 1):
                found.append(f"{where}: {value!r} matches {len(matching)} of {key}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            found.append(f"{where}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            found.append(f"{where}: {value} > maximum {schema['maximum']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                found.append(f"{where}: `{key}` missing")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                found.extend(problems(value[key], sub, root, f"{where}.{key}"))
        if isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                if key not in schema.get("properties", {}):
                    found.extend(problems(item, schema["additionalProperties"], root, f"{where}.{key}"))
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            found.append(f"{where}: {len(value)} items < {schema['minItems']}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            found.append(f"{where}: {len(value)} items > {schema['maxItems']}")
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                found.extend(problems(item, schema["items"], root, f"{where}[{i}]"))
    return found


def record_fields() -> tuple[str, ...]:
    """The case record's fields in crates/core/src/case.rs order (the generator records it: the
    schema's own objects have their keys sorted)."""
    return tuple(load("case-record")["x-field-order"])


def record_required() -> tuple[str, ...]:
    """The fields every record has (the rest may be absent: null or their default)."""
    return tuple(load("case-record")["required"])


@lru_cache(maxsize=None)
def record_defaults() -> dict:
    """What each field a record may lack holds when it is not given: the schema's
    `default`, else null (serde reads an absent `Option` as None)."""
    properties = load("case-record")["properties"]
    required = record_required()
    return {field: properties[field].get("default") for field in record_fields() if field not in required}


def build_record(values: dict) -> dict:
    """The case record holding `values`, its fields in the schema's order, a field not
    given at its default. A required field not given, or a name that is no field, is a
    bug of the caller (ValueError)."""
    fields = record_fields()
    unknown = [key for key in values if key not in fields]
    missing = [field for field in record_required() if field not in values]
    if unknown or missing:
        raise ValueError(f"case record: unknown fields {unknown}, required fields missing {missing}")
    defaults = record_defaults()
    return {field: values[field] if field in values else defaults[field] for field in fields}


def choices(name: str, definition: str) -> tuple[str, ...]:
    """The values of an enum of schema `name` (`CaseKind` of `case-record`), in the Rust
    type's order."""
    return tuple(variant["const"] for variant in load(name)["$defs"][definition]["oneOf"])


@lru_cache(maxsize=None)
def constants() -> dict:
    """`schemas/constants.json`: `case_id` (the id scheme per kind), `run_files` and
    `agent_stats`."""
    return json.loads((DIR / "constants.json").read_text(encoding="utf-8"))


def agent_stats() -> tuple[str, ...]:
    """The counters an agent reports with each reply (crates/core/src/case.rs
    `AgentStats`), in its order; each is a record field of the same name."""
    return tuple(constants()["agent_stats"])


def case_id_format(kind: str) -> str:
    """crates/core/src/case.rs's id of a case of `kind`, as a format string over the
    case's fields (`{suite}/{user_task}/{attack}/{injection_task}`, …)."""
    return constants()["case_id"][kind]


def run_file(name: str) -> str:
    """The name crates/store/src/files.rs gives run file `name` (its `RunFile` variant:
    `Traces`), relative to the run directory."""
    return constants()["run_files"][name]


def max_in_flight() -> int:
    """The most cases in flight a request may ask for (pruefstand's bound)."""
    return int(load("gym-request")["properties"]["max_in_flight"]["maximum"])


def validate_file(name: str, path: str) -> list[str]:
    """Problems of a JSON file (`gym-request`) or of every line of a JSON-lines file
    (`case-record`), each prefixed with the file and line."""
    schema = load(name)
    text = Path(path).read_text(encoding="utf-8")
    if name == "case-record":
        found = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if list(record) != list(record_fields()):
                found.append(f"{path}:{number}: fields {list(record)} are not {list(record_fields())}")
            found.extend(f"{path}:{number}: {p}" for p in problems(record, schema))
        return found
    return [f"{path}: {p}" for p in problems(json.loads(text), schema)]
