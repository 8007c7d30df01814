"""Part 5 of scripts/bench — concurrency steered by the server: the capacity slice with
no --jobs on simulated servers of capacity 8, 32 and 128 (capacity fraction each, from a
cold start: no stored capacity), and the gym's own memory (PSS of its processes, agents
not counted) with 96 cases in flight (the capacity run, --jobs 96).

Not the ETA under steering (eta.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .common import JOBS, LATENCY, SKIP, fmt, say, write_model_dir
from .contenders import run_pruefstand
from .sim import Sim

AUTO_CAPACITIES = [int(c) for c in os.environ.get("BENCH_AUTO_CAPACITIES", "8,32,128").split(",") if c.strip()]


def run(binary: Path, work: Path, root: Path, truth_text: str, cap: dict, ovh: dict) -> tuple:
    """The no---jobs runs per capacity and the gym's memory from the capacity and overhead
    runs: (runs by capacity, PSS MiB at 96 in flight, MiB per further case, CPU s per
    case at jobs 1; None where not measured)."""
    say("== concurrency from the server: no --jobs, cold start (no stored capacity) ==")
    auto = {}
    if "auto" not in SKIP:
        for c in AUTO_CAPACITIES:
            model_c = work / f"model-cap{c}"
            write_model_dir(model_c, truth_text, dict(LATENCY, capacity=c))
            shutil.rmtree(root / "state" / "capacity", ignore_errors=True)
            sim = Sim(binary, model_c, work / f"sim-auto{c}.log")
            r = run_pruefstand(binary, root, sim, root / "profiles" / "bench-auto.toml", None, f"auto{c}", work)
            r["server"] = sim.ideal(sim.metrics())
            r["window_s"] = sim.busy_window()
            r["server_cpu_s"] = sim.stop()
            r["capacity_fraction"] = r["server"]["ideal_s"] / r["window_s"] if r["window_s"] else None
            auto[c] = r
            cc = r["concurrency"] or {}
            say(f"capacity {c:<4}    : fraction {fmt(r['capacity_fraction'])}; {r['cases']} cases, wall {r['wall_s']:.1f} s, "
                f"busy {fmt(r['window_s'], 1)} s, ideal {r['server']['ideal_s']:.1f} s; in flight {cc.get('start')} → "
                f"settled {cc.get('settled')} (peak {cc.get('peak_in_flight')}, {cc.get('mode')}); server peak "
                f"running {cc.get('peak_running')}, waiting {cc.get('peak_waiting')}; CPU {r['cpu_s']:.1f} s")
    pss_96 = cap.get("gym_pss_mib") if JOBS == 96 and "capacity" not in SKIP else None
    one = ovh.get("pruefstand jobs 1", {})
    per_case = None
    if pss_96 is not None and one.get("gym_pss_mib"):
        # What the 95 further cases add to the gym at jobs 1 — an upper bound, since it
        # also holds the further worker processes (PSS shares pages, so a process's own
        # part cannot be told apart).
        per_case = (pss_96 - one["gym_pss_mib"]) / 95
    say(f"gym memory       : {fmt(pss_96, 0)} MiB PSS with 96 in flight on {cap.get('gym_processes')} gym processes "
        f"(the capacity run; agents not counted); {fmt(one.get('gym_pss_mib'), 0)} MiB at jobs 1 on "
        f"{one.get('gym_processes')}; ≤ {fmt(per_case, 1)} MiB per further case in flight (further worker "
        f"processes included)")
    cpu_per_case = one["cpu_s"] / one["cases"] if one else None
    say()
    return auto, pss_96, per_case, cpu_per_case
