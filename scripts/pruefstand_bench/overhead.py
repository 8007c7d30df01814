"""Part 4 of scripts/bench — framework overhead with an instant model (latency 0):
pruefstand at jobs 1 and 2, AgentDojo's runner with its shipped YAML loader and with the
C loader.
CPU per case is what each costs when the model costs nothing.

Not a figure of the model server: its latency is 0 here."""

from __future__ import annotations

from pathlib import Path

from .common import SKIP, say
from .contenders import run_agentdojo, run_pruefstand
from .sim import Sim


def run(binary: Path, python: Path, work: Path, root: Path, cs_ovh: dict) -> dict:
    """The overhead case set on the instant model, by contender name."""
    say("== framework overhead: instant model (latency 0), C YAML loader in the gym ==")
    ovh = {}
    if "overhead" not in SKIP:
        for jobs in (1, 2):
            sim = Sim(binary, work / "model-instant", work / f"sim-overhead-j{jobs}.log")
            r = run_pruefstand(binary, root, sim, root / "profiles" / "bench-overhead.toml", jobs, f"overhead-j{jobs}", work)
            r["server_cpu_s"] = sim.stop()
            ovh[f"pruefstand jobs {jobs}"] = r
        if "agentdojo" not in SKIP:
            for fast in (False, True):
                sim = Sim(binary, work / "model-instant", work / f"sim-overhead-ad{int(fast)}.log")
                r = run_agentdojo(python, work, sim, cs_ovh, f"overhead-{'cyaml' if fast else 'shipped'}", fast)
                r["server_cpu_s"] = sim.stop()
                ovh["AgentDojo, " + ("C YAML loader" if fast else "shipped YAML loader")] = r
        for name, r in ovh.items():
            extra = f" (imports {r['import_s']:.1f} s wall, {r['cpu_import_s']:.1f} s CPU)" if "import_s" in r else ""
            say(f"{name:<34}: {r['cases']} cases, {r['wall_s']:.1f} s = {r['cases'] / r['wall_s']:.2f} cases/s; "
                f"CPU {r['cpu_s']:.1f} s = {r['cpu_s'] / r['cases']:.3f} s/case{extra}; server CPU {r['server_cpu_s']:.2f} s")
    say()
    return ovh
