"""Part 2 of scripts/bench — throughput: the same case set through AgentDojo's own
sequential runner (benches/agentdojo_runner.py: the `local` model, prompted tool
calling) and through `pruefstand run` (backend "external", tool_calling "prompted",
--jobs N).
A fresh simulated server per contender, same seed, same latency model.

Not the larger slice (capacity.py) nor the instant model (overhead.py)."""

from __future__ import annotations

from pathlib import Path

from .common import JOBS, SKIP, fmt, say
from .contenders import compare_outcomes, run_agentdojo, run_pruefstand
from .sim import Sim


def run(binary: Path, python: Path, work: Path, root: Path, model: Path, cs_tp: dict) -> tuple:
    """Both runners on the throughput case set: (AgentDojo's result or None, pruefstand's,
    the ratio of their cases per second or None)."""
    say("== throughput: the same case set through both runners ==")
    ad = None
    if "agentdojo" not in SKIP:
        sim = Sim(binary, model, work / "sim-agentdojo.log")
        ad = run_agentdojo(python, work, sim, cs_tp, "throughput")
        ad["server"] = sim.ideal(sim.metrics())
        ad["window_s"] = sim.busy_window()
        ad["server_cpu_s"] = sim.stop()
        say(f"AgentDojo runner : {ad['cases']} cases in {ad['wall_s']:.1f} s ({ad['import_s']:.1f} s imports) "
            f"= {ad['cases'] / ad['wall_s']:.3f} cases/s; {ad['server']['calls']} calls, "
            f"{ad['server']['per_call_ms']:.0f} ms/call; CPU {ad['cpu_s']:.1f} s")
    sim = Sim(binary, model, work / "sim-pruefstand.log")
    pf = run_pruefstand(binary, root, sim, root / "profiles" / "bench-throughput.toml", JOBS, "throughput", work)
    pf["server"] = sim.ideal(sim.metrics())
    pf["window_s"] = sim.busy_window()
    pf["server_cpu_s"] = sim.stop()
    say(f"pruefstand run   : {pf['cases']} cases in {pf['wall_s']:.1f} s = {pf['cases'] / pf['wall_s']:.3f} cases/s; "
        f"{pf['server']['calls']} calls, {pf['server']['per_call_ms']:.0f} ms/call; errors {pf['errors']}; "
        f"CPU {pf['cpu_s']:.1f} s")
    throughput_ratio = None
    if ad:
        throughput_ratio = (pf["cases"] / pf["wall_s"]) / (ad["cases"] / ad["wall_s"])
        same, total = compare_outcomes(ad, pf["records"])
        window_ratio = (ad["window_s"] / pf["window_s"]) if ad["window_s"] and pf["window_s"] else None
        say(f"ratio            : {throughput_ratio:.1f}× (end to end, each with its own start-up); "
            f"{fmt(window_ratio, 1)}× over the server's busy windows ({fmt(ad['window_s'], 1)} s vs "
            f"{fmt(pf['window_s'], 1)} s)")
        say(f"same outcomes    : {same}/{total} cases (utility, security per case; same seed)")
        if ad["server"]["calls"] != pf["server"]["calls"]:
            say(f"note             : LLM calls differ: AgentDojo {ad['server']['calls']}, pruefstand {pf['server']['calls']}")
    say()
    return ad, pf, throughput_ratio
