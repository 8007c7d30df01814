"""Part 3 of scripts/bench — capacity: a larger voll-shaped slice through `pruefstand
run` alone, compared with the server's ideal time (its own /metrics: calls and tokens ×
the latency model ÷ capacity).
Where the time goes per call (served, queued, client side), and what AgentDojo's
sequential runner would need for the same slice, projected from part 2.

Not the runs without --jobs (steering.py)."""

from __future__ import annotations

from pathlib import Path

from .common import JOBS, LATENCY, SKIP, env_int, fmt, say
from .contenders import run_pruefstand
from .sim import Sim


def run(binary: Path, work: Path, root: Path, model: Path, ad: dict | None, pf: dict) -> tuple:
    """The capacity slice (or the throughput run again, BENCH_SCALE_USERS=0 or skipped):
    (its result, the fraction of the server's busy window its ideal time fills or None)."""
    say("== capacity: a voll-shaped slice through pruefstand alone ==")
    if "capacity" in SKIP or env_int("BENCH_SCALE_USERS", 16) == 0:
        cap = pf
        say("(reusing the throughput run)")
    else:
        sim = Sim(binary, model, work / "sim-capacity.log")
        cap = run_pruefstand(binary, root, sim, root / "profiles" / "bench-capacity.toml", JOBS, "capacity", work)
        cap["server"] = sim.ideal(sim.metrics())
        cap["window_s"] = sim.busy_window()
        cap["ramp_drain"] = sim.ramp_drain()
        cap["server_cpu_s"] = sim.stop()
    s = cap["server"]
    capacity_fraction = s["ideal_s"] / cap["window_s"] if cap["window_s"] else None
    e2e_fraction = s["ideal_s"] / cap["wall_s"]
    say(f"server           : {s['calls']} calls, {s['prompt_tokens']} prompt + {s['completion_tokens']} completion "
        f"tokens; service {s['service_s']:.1f} s ({s['per_call_ms']:.0f} ms/call), e2e sum {s['e2e_sum_s']:.1f} s "
        f"(incl. queueing)")
    say(f"ideal            : {s['ideal_s']:.1f} s (service ÷ capacity {LATENCY['capacity']})")
    say(f"pruefstand       : {cap['cases']} cases, wall {cap['wall_s']:.1f} s (start-up and judgement included), "
        f"server busy {fmt(cap['window_s'], 1)} s; errors {cap['errors']}; CPU {cap['cpu_s']:.1f} s "
        f"({cap['cpu_s'] / cap['cases']:.3f} s/case), server CPU {cap['server_cpu_s']:.1f} s")
    say(f"capacity fraction: {fmt(capacity_fraction)} of the server's busy window; {e2e_fraction:.2f} of the whole "
        f"command's wall time")
    calls = max(s["calls"], 1)
    case_time = sum(r["duration_s"] for r in cap["records"])
    say(f"where time goes  : per LLM call {1000 * s['service_s'] / calls:.0f} ms served, "
        f"{1000 * (s['e2e_sum_s'] - s['service_s']) / calls:.0f} ms queued at the server, "
        f"{1000 * (case_time - s['e2e_sum_s']) / calls:.0f} ms client side (gym, AgentDojo, agent; of which "
        f"{1000 * cap['cpu_s'] / calls:.0f} ms CPU, the rest waiting for a CPU); "
        f"{cap['wall_s'] - (cap['window_s'] or 0):.1f} s before the first and after the last call (start-up, judgement)")
    if cap.get("ramp_drain"):
        ramp, full, drain = cap["ramp_drain"]
        say(f"busy window      : {ramp:.1f} s until the server first held {LATENCY['capacity']} requests, "
            f"~{full:.0f} s of samples at capacity, {drain:.1f} s of drain after the last time it did")
    if ad and ad["server"]["calls"]:
        # AgentDojo's runner is sequential: its time is additive per call
        projected = ad["import_s"] + ad["cases_s"] / ad["server"]["calls"] * s["calls"]
        say(f"projection       : AgentDojo's runner would need ~{projected:.0f} s for this slice "
            f"({ad['cases_s'] / ad['server']['calls'] * 1000:.0f} ms per call, measured above) = "
            f"{projected / cap['wall_s']:.1f}× pruefstand's {cap['wall_s']:.0f} s")
    say()
    return cap, capacity_fraction
