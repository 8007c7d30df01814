"""The environment's dataset: a plan's cases as the bench resolves them, the held-out
families left out, and the manifest that says what was offered (docs/training.md, "An
environment a trainer steps").

The plan is resolved by the binary, never here: `pruefstand gym --plan P --dataset
--seed S` prints the cases the gym would be handed — ids, each case's attack family, the
wording of per-run families drawn from S, a found family's templates, the families the
plan holds out (its `held_out` and the `[[found]]` families marked held out). This
module only takes cases out: the held-out ones (counted per family, as an export counts
the rows it refuses), and the kinds the trainer did not ask for. Not here: running a
case (`rollout`), rewards (`rubric`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# What an environment offers by default: the attacked cases (the agent's task under an
# injection). Clean cases may be asked for; injection goals never (the attacker's task
# given as the user's: a policy rewarded for it would learn to follow it).
DEFAULT_KINDS = ("attacked",)
KINDS = ("attacked", "clean")

DATASET_FILE = "dataset.jsonl"
MANIFEST_SUFFIX = ".manifest.json"


class DatasetError(Exception):
    """The plan could not be resolved, or what it resolved to is unusable; str(e) names why."""


def pruefstand_binary(given: str | None = None) -> str:
    """The binary that resolves plans: `given`, else $PRUEFSTAND_BIN, else `pruefstand`
    on PATH."""
    name = given or os.environ.get("PRUEFSTAND_BIN") or "pruefstand"
    found = shutil.which(name) if os.sep not in name else (name if os.access(name, os.X_OK) else None)
    if found is None:
        raise DatasetError(f"pruefstand binary {name!r} not found (give `pruefstand=` or set PRUEFSTAND_BIN)")
    return found


def resolve(plan: str, *, seed: int = 0, root: str | None = None, pruefstand: str | None = None,
            filters: dict | None = None) -> dict:
    """The plan's cases as `pruefstand gym --dataset` prints them. `filters` narrows the
    plan as the gym's flags do: {"suite": [...], "user_task": [...], "injection_task":
    [...], "attack": [...]}."""
    argv = [pruefstand_binary(pruefstand)]
    if root is not None:
        argv += ["--root", str(root)]
    argv += ["gym", "--plan", str(plan), "--dataset", "--seed", str(int(seed))]
    for key, values in (filters or {}).items():
        if key not in ("suite", "user_task", "injection_task", "attack"):
            raise DatasetError(f"unknown filter {key!r}; valid: suite, user_task, injection_task, attack")
        for value in values:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise DatasetError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    try:
        resolved = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as e:
        raise DatasetError(f"{' '.join(argv)}: its output is no dataset: {e}") from None
    for key in ("plan", "plan_hash", "benchmark_version", "seed", "held_out", "cases", "wording", "templates"):
        if key not in resolved:
            raise DatasetError(f"{' '.join(argv)}: its dataset lacks `{key}` (a pruefstand without `gym --dataset`?)")
    return resolved


@dataclass
class Dataset:
    """The cases an environment offers, and what it left out."""

    plan: str
    plan_hash: str
    plan_file: str | None
    benchmark_version: str
    seed: int
    case_timeout_s: float
    held_out: list[str]
    cases: list[dict]
    wording: dict
    templates: dict
    refused_held_out: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.cases)

    def families(self) -> dict:
        """Cases offered per attack family (what the held-out guard reads)."""
        out: dict = {}
        for case in self.cases:
            if case.get("family"):
                out[case["family"]] = out.get(case["family"], 0) + 1
        return dict(sorted(out.items()))

    def case(self, case_id: str) -> dict:
        for case in self.cases:
            if case["id"] == case_id:
                return case
        raise KeyError(f"case {case_id!r} is not in the environment's dataset")


def build(resolved: dict, kinds=DEFAULT_KINDS) -> Dataset:
    """The dataset of a resolved plan: only `kinds`, never a case whose family the plan
    holds out. A case of a held-out family is refused before anything of it is kept (its
    wording and template included), and counted."""
    kinds = tuple(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise DatasetError(f"kinds {list(kinds)!r}: each must be one of {', '.join(KINDS)}")
    held_out = set(resolved["held_out"])
    offered, refused, skipped = [], {}, {}
    for case in resolved["cases"]:
        family = case.get("family")
        if family is not None and family in held_out:
            refused[family] = refused.get(family, 0) + 1
            continue
        if case["kind"] not in kinds:
            reason = f"kind {case['kind']} not offered"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        if case["kind"] == "attacked" and family is None:
            # An attack outside the families (AgentDojo's `direct`, a DoS attack): the
            # held-out guard could not tell what it is, so it is not offered.
            skipped["attack of no family"] = skipped.get("attack of no family", 0) + 1
            continue
        offered.append(dict(case))
    if not offered:
        raise DatasetError(
            f"plan {resolved['plan']}: no case left to offer (kinds {list(kinds)}, held out: "
            f"{', '.join(sorted(held_out)) or 'none'})"
        )
    ids = {c["id"] for c in offered}
    return Dataset(
        plan=resolved["plan"],
        plan_hash=resolved["plan_hash"],
        plan_file=resolved.get("plan_file"),
        benchmark_version=resolved["benchmark_version"],
        seed=int(resolved["seed"]),
        case_timeout_s=float(resolved.get("case_timeout_s") or 300.0),
        held_out=sorted(held_out),
        cases=offered,
        wording={k: v for k, v in resolved["wording"].items() if k in ids},
        templates={k: v for k, v in resolved["templates"].items() if k in ids},
        refused_held_out=dict(sorted(refused.items())),
        skipped=dict(sorted(skipped.items())),
    )


def module_sha256() -> str:
    """A sha256 over this package's files (what wrote a manifest)."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for path in sorted(here.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def write(dataset: Dataset, out_dir: str | os.PathLike, *, kinds, weights: dict) -> Path:
    """`out_dir/dataset.jsonl` (one offered case a line, with its wording or template) and
    its manifest beside it, as an export writes FILE and FILE.manifest.json: the families
    offered and refused, the plan, the seed. Both atomically. Returns the manifest's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in dataset.cases:
        row = {"case": case}
        if case["id"] in dataset.wording:
            row["wording"] = dataset.wording[case["id"]]
        if case["id"] in dataset.templates:
            row["template"] = dataset.templates[case["id"]]
        rows.append(json.dumps(row, ensure_ascii=False, sort_keys=True))
    text = ("\n".join(rows) + "\n").encode("utf-8")
    path = out / DATASET_FILE
    _write_atomic(path, text)
    plan_file = Path(dataset.plan_file) if dataset.plan_file else None
    manifest = {
        "format": "environment",
        "sha256": hashlib.sha256(text).hexdigest(),
        "rows": len(dataset.cases),
        "families": dataset.families(),
        "clean_rows": sum(1 for c in dataset.cases if c["kind"] == "clean"),
        "held_out": dataset.held_out,
        "refused_held_out": dataset.refused_held_out,
        "skipped": dataset.skipped,
        "sources": [{
            "plan": dataset.plan,
            "plan_file": str(plan_file) if plan_file else None,
            "plan_file_sha256": _sha256_file(plan_file) if plan_file else None,
            "plan_hash": dataset.plan_hash,
            "benchmark_version": dataset.benchmark_version,
        }],
        "seeds": [dataset.seed],
        "kinds": list(kinds),
        "weights": weights,
        "written_by": f"pruefstand_env {module_sha256()}",
    }
    manifest_path = out / (DATASET_FILE + MANIFEST_SUFFIX)
    _write_atomic(manifest_path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return manifest_path


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
