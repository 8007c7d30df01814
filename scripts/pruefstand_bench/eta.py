"""Part 7b of scripts/bench, the ETA against the real end: `run` on schnell of a
simulated version with latency (BENCH_ETA_BASE_MS per call, BENCH_ETA_CAPACITY), steered
and at --jobs 4 and 16: how far the ETA its progress lines promise is from the real end,
for the recent rate the line says and for the run's average rate.

Not early stopping (early.py): these runs go in full."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

from .common import REPO, SKIP, env_float, env_int, fmt, make_root, quantile, say

# ETA runs: a simulated version with a server-side latency and a capacity, so cases
# queue and the rate changes as steering opens or holds the cases in flight.
ETA_LATENCY = {"base_ms": env_float("BENCH_ETA_BASE_MS", 600.0), "capacity": env_int("BENCH_ETA_CAPACITY", 8)}
ETA_SETTINGS = (("steered", []), ("jobs4", ["--jobs", "4"]), ("jobs16", ["--jobs", "16"]))
PROGRESS_LINE = re.compile(r"progress: (\d+)/(\d+) cases, (\d+) in flight, \d+ errors, ETA (estimating|(\d+) s)")
START_LINE = re.compile(r"(\d+) of (\d+) cases to run")


def eta_part(binary: Path, work: Path) -> dict:
    """`run` on schnell of a simulated version with latency, its plain progress lines
    stamped as they arrive: at each line between a tenth and nine tenths of the run, how
    far the end its ETA promised was from the real end (as a share of the run's time),
    for the ETA the line says (the recent rate) and for the run's average rate worked
    out from the same line (the ETA before). The ETA is to the plan's end; a run that
    stops early (voll) ends before any ETA, so these runs are on schnell, which runs in
    full."""
    root = work / "root-eta"
    make_root(root)
    shutil.copy(REPO / "profiles" / "schnell.toml", root / "profiles" / "schnell.toml")
    (root / "versions" / "eta.toml").write_text(
        'description = "scripts/bench: simulated, with latency, no reference"\n'
        '[model]\nbackend = "sim"\nserved_name = "sim/m"\ntool_calling = "native"\n[sim]\nseed = 1\n'
        f'[sim.latency]\nbase_ms = {ETA_LATENCY["base_ms"]}\ncapacity = {ETA_LATENCY["capacity"]}\n'
        '[sim.models."sim/m"]\nsusceptibility = 0.3\nskill = 0.95\n')
    out: dict = {}
    for setting, jobs in ETA_SETTINGS:
        run_dir = work / f"run-eta-{setting}"
        shutil.rmtree(run_dir, ignore_errors=True)
        proc = subprocess.Popen([str(binary), "--root", str(root), "run", "eta", "--plan", "schnell", *jobs,
                                 "--out", str(run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        start, lines = None, []
        with open(work / f"run-eta-{setting}.log", "w") as log:
            for line in proc.stderr:
                now = time.monotonic()
                log.write(line)
                if start is None and START_LINE.search(line):
                    start = now
                m = PROGRESS_LINE.search(line)
                if m and start is not None:
                    done, total = int(m[1]), int(m[2])
                    lines.append({"t": now - start, "done": done, "total": total, "in_flight": int(m[3]),
                                  "eta_s": None if m[5] is None else float(m[5])})
        proc.wait()
        finished = [l for l in lines if l["done"] == l["total"]]
        if start is None or not finished:
            raise SystemExit(f"the ETA run {setting} did not finish (exit {proc.returncode}); see "
                             f"{work / f'run-eta-{setting}.log'}")
        end = finished[0]["t"]
        recent, average = [], []
        for l in lines:
            if not (0.1 * end <= l["t"] <= 0.9 * end) or l["done"] == 0:
                continue
            real_left = end - l["t"]
            before = (l["total"] - l["done"]) * l["t"] / l["done"]
            average.append(abs(before - real_left) / end)
            if l["eta_s"] is not None:
                recent.append(abs(l["eta_s"] - real_left) / end)
        o = {"wall_s": end, "lines": lines, "median_error_recent": quantile(recent, 0.5),
             "max_error_recent": max(recent, default=None), "median_error_average": quantile(average, 0.5),
             "max_error_average": max(average, default=None), "estimating_lines": sum(l["eta_s"] is None for l in lines)}
        out[setting] = o
        say(f"ETA {setting}: {end:.0f} s; off the real end by median {fmt(o['median_error_recent'])} (max "
            f"{fmt(o['max_error_recent'])}) of the run's time with the recent rate, {fmt(o['median_error_average'])} "
            f"(max {fmt(o['max_error_average'])}) with the run's average; {len(lines)} lines, "
            f"{o['estimating_lines']} still estimating")
    recents = [o["median_error_recent"] for o in out.values() if o["median_error_recent"] is not None]
    averages = [o["median_error_average"] for o in out.values() if o["median_error_average"] is not None]
    out["eta_error_recent"] = quantile(recents, 0.5)
    out["eta_error_average"] = quantile(averages, 0.5)
    return out


def run(binary: Path, work: Path) -> dict:
    """The ETA runs' figures (None where skipped), printed."""
    say("== the ETA against the real end: recent rate vs the run's average ==")
    et = {"eta_error_recent": None, "eta_error_average": None} if "eta" in SKIP else eta_part(binary, work)
    say(f"ETA off the real end (median over runs of the median over lines, share of the run's time): "
        f"{fmt(et['eta_error_recent'])} recent rate, {fmt(et['eta_error_average'])} the run's average")
    say()
    return et
