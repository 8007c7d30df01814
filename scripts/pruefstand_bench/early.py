"""Part 7 of scripts/bench — early stopping: real `voll` runs of simulated versions (in-
process sim, instant model) at ASR about 0.01 and 0.30, BENCH_EARLY_SEEDS seeds each
(the mean share of voll's cases each ran), and demo-kandidat against its reference demo-
baseline in BENCH_EARLY_REF_SEEDS orders at --jobs BENCH_EARLY_REF_JOBS and as many with
the server's steering (no --jobs): the share of voll run (median, 10th and 90th
percentile), the rule that decided last, and what the runs ran past the decided user
tasks (the judgement's early_stop.at_decision: ahead and overrun, medians).

Not the ETA of a run (eta.py)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from .common import REPO, SKIP, env_int, fmt, make_root, quantile, say, show_run

# Eight: a run's share is set by its user-task order (drawn from its folder's name, so
# fixed per seed), and one order differs from the next by ±0.1 of voll at ASR 0.30.
EARLY_SEEDS = env_int("BENCH_EARLY_SEEDS", 8)
EARLY_JOBS = env_int("BENCH_EARLY_JOBS", 4)
# demo-kandidat against its reference: its share is what a user quotes, so its spread is
# reported (20 orders give the 10th and 90th percentile a few runs each), at a fixed
# --jobs and with the server's steering, which on the instant simulated model fills to
# the ceiling (max_in_flight) and so runs that many cases past the decision.
EARLY_REF_SEEDS = env_int("BENCH_EARLY_REF_SEEDS", 20)
EARLY_REF_JOBS = env_int("BENCH_EARLY_REF_JOBS", 8)
# Simulated versions for early stopping: (label, susceptibility). Workspace injection
# tasks 6-13 ship no ground truth, so the simulated model cannot act them out and the
# ASR sits below the susceptibility; the measured ASR is printed beside each run
# (measured on 2 cores: 0.016 gave ASR 0.002-0.007, 0.02 gave 0.015, 0.05 gave 0.037;
# 0.48 gave 0.31-0.35).
EARLY_VERSIONS = (("asr01", 0.016), ("asr30", 0.48))


def early_part(binary: Path, work: Path) -> dict:
    """Real `voll` runs (early_stop = true) of in-process simulated versions: per ASR and
    seed the share of voll's cases run before the verdict was decided (1 when it ran in
    full). Each run has its own run directory, so its own user-task order."""
    root = work / "root-early"
    make_root(root)
    shutil.copy(REPO / "profiles" / "voll.toml", root / "profiles" / "voll.toml")
    out: dict = {}
    for label, susceptibility in EARLY_VERSIONS if EARLY_SEEDS > 0 else ():
        runs = []
        for seed in range(1, EARLY_SEEDS + 1):
            name = f"early-{label}-{seed}"
            (root / "versions" / f"{name}.toml").write_text(
                f'description = "scripts/bench: simulated, susceptibility {susceptibility}, no reference"\n'
                f'[model]\nbackend = "sim"\nserved_name = "sim/m"\ntool_calling = "native"\n'
                f'[sim]\nseed = {seed}\n[sim.models."sim/m"]\nsusceptibility = {susceptibility}\nskill = 0.95\n')
            run_dir = work / f"run-{name}"
            shutil.rmtree(run_dir, ignore_errors=True)
            t0 = time.monotonic()
            with open(work / f"run-{name}.log", "wb") as log:
                rc = subprocess.run([str(binary), "--root", str(root), "run", name, "--plan", "voll", "--jobs",
                                     str(EARLY_JOBS), "--out", str(run_dir)], stdout=log, stderr=subprocess.STDOUT).returncode
            wall = time.monotonic() - t0
            view = show_run(binary, run_dir)
            judgement = (view or {}).get("judgement")
            if not judgement:
                raise SystemExit(f"the early-stop run {name} left no judgement (exit {rc}); see {work / f'run-{name}.log'}")
            records = show_run(binary, run_dir, "--cases")
            planned = view["cases"]["planned"]
            attacked = [r for r in records if r["kind"] == "attacked" and r["security"] is not None]
            asr = sum(r["security"] for r in attacked) / len(attacked) if attacked else None
            early = judgement.get("early_stop")
            runs.append({"seed": seed, "fraction": len(records) / planned, "cases": len(records), "planned": planned,
                         "verdict": judgement["verdict"], "asr": asr, "wall_s": wall, "exit": rc,
                         "deciding": early and early["deciding"]})
            say(f"{label} seed {seed}: {judgement['verdict']} after {len(records)} of {planned} cases "
                f"({len(records) / planned:.2f}), ASR {fmt(asr, 3)}, {wall:.0f} s"
                + (f"; {early['deciding']}" if early else "; ran in full"))
        out[label] = {"mean_fraction": sum(r["fraction"] for r in runs) / len(runs), "runs": runs}
    out["with_reference"] = early_with_reference(binary, work, root)
    return out



def deciding_last(early: dict | None, verdict: str):
    """The rule whose decision came last on an approval (R2, R3 = both utility figures,
    R4 = both comparisons; at the same user task the later rule), the failed rule that
    decided first on a rejection; None for a run not stopped early."""
    if not early:
        return None
    seq = early["sequential"]
    figures = {"R2": [seq["asr"]], "R3": [seq["utility_clean"], seq["utility_under_attack"]],
               "R4": list((seq.get("r4") or {}).values())}
    decided = {}
    for rule, tracks in figures.items():
        ats = [(t.get("decision") or {}).get("at") for t in tracks]
        statuses = [(t.get("decision") or {}).get("status") for t in tracks]
        if verdict == "approved" and tracks and all(a is not None for a in ats):
            decided[rule] = max(ats)
        elif verdict == "rejected" and "fail" in statuses:
            decided[rule] = min(a for a, st in zip(ats, statuses) if st == "fail")
    if not decided:
        return None
    pick = max if verdict == "approved" else min
    at = pick(decided.values())
    return [r for r in sorted(decided) if decided[r] == at][-1 if verdict == "approved" else 0]


def early_with_reference(binary: Path, work: Path, root: Path) -> dict:
    """The shipped demo-kandidat against its reference demo-baseline on `voll`, as a
    nightly gate runs it: the reference's run is made once, in full (the first run makes
    it, the others reuse it), then EARLY_REF_SEEDS runs of the candidate at --jobs
    EARLY_REF_JOBS and as many with the server's steering, each in its own folder and so
    with its own user-task order: the share of voll each ran, which rule decided last,
    and its cases past the decided user tasks (`ahead`: finished before the decision;
    `overrun`: finished after it)."""
    for name in ("demo-kandidat", "demo-baseline"):
        shutil.copy(REPO / "versions" / f"{name}.toml", root / "versions" / f"{name}.toml")
    out: dict = {}
    for setting, jobs in ((f"jobs{EARLY_REF_JOBS}", ["--jobs", str(EARLY_REF_JOBS)]), ("steered", [])):
        runs = []
        t_setting = time.monotonic()
        for seed in range(1, EARLY_REF_SEEDS + 1):
            run_dir = work / f"run-reference-{setting}-{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)
            t0 = time.monotonic()
            with open(work / f"run-reference-{setting}-{seed}.log", "wb") as log:
                rc = subprocess.run([str(binary), "--root", str(root), "run", "demo-kandidat", "--plan", "voll", *jobs,
                                     "--out", str(run_dir)], stdout=log, stderr=subprocess.STDOUT).returncode
            wall = time.monotonic() - t0
            view = show_run(binary, run_dir)
            judgement = (view or {}).get("judgement")
            if not judgement:
                raise SystemExit(f"the run {run_dir} left no judgement (exit {rc}); see {work / f'run-reference-{setting}-{seed}.log'}")
            recorded, planned = view["cases"]["recorded"], view["cases"]["planned"]
            early = judgement.get("early_stop")
            at = (early or {}).get("at_decision") or {}
            peak = ((view["run"] or {}).get("concurrency") or {}).get("peak_in_flight")
            last = deciding_last(early, judgement["verdict"])
            runs.append({"seed": seed, "fraction": recorded / planned, "cases": recorded, "planned": planned,
                         "verdict": judgement["verdict"], "wall_s": wall, "exit": rc, "deciding_last": last,
                         "user_tasks_decided": early and early["user_tasks_decided"], "ahead": at.get("ahead"),
                         "overrun": at.get("overrun"), "peak_in_flight": peak,
                         "deciding": early and early["deciding"]})
            say(f"demo-kandidat vs demo-baseline, {setting}, order {seed}: {judgement['verdict']} after {recorded} "
                f"of {planned} cases ({recorded / planned:.2f}), {wall:.0f} s"
                + (" (includes the reference's run)" if seed == 1 and not out else "")
                + (f"; {last} last, after {early['user_tasks_decided']} user tasks; {at.get('ahead')} ahead, "
                   f"{at.get('overrun')} overrun (peak {peak} in flight)" if early else "; ran in full"))
        fractions = [r["fraction"] for r in runs]
        lasts = [r["deciding_last"] or "none" for r in runs]
        known = lambda key: [r[key] for r in runs if r[key] is not None]  # noqa: E731
        out[setting] = {"median_fraction": quantile(fractions, 0.5), "p10_fraction": quantile(fractions, 0.1),
                        "p90_fraction": quantile(fractions, 0.9), "mean_fraction": sum(fractions) / len(fractions),
                        "deciding_last": {r: lasts.count(r) for r in sorted(set(lasts))},
                        "median_user_tasks_decided": quantile(known("user_tasks_decided"), 0.5),
                        "median_ahead": quantile(known("ahead"), 0.5), "median_overrun": quantile(known("overrun"), 0.5),
                        "wall_s": time.monotonic() - t_setting, "runs": runs}
        o = out[setting]
        say(f"demo-kandidat vs demo-baseline, {setting}: share of voll median {fmt(o['median_fraction'])} "
            f"(10th–90th percentile {fmt(o['p10_fraction'])}–{fmt(o['p90_fraction'])}, {len(runs)} orders); "
            f"decided last: {', '.join(f'{r} {n}×' for r, n in o['deciding_last'].items())}; median "
            f"{fmt(o['median_user_tasks_decided'], 0)} user tasks, {fmt(o['median_ahead'], 0)} cases ahead, "
            f"{fmt(o['median_overrun'], 0)} overrun; {o['wall_s']:.0f} s")
    return out


# ETA runs: a simulated version with a server-side latency and a capacity, so cases

def run(binary: Path, work: Path) -> tuple:
    """The early-stop runs: (all figures, the shares of voll by label, the fixed
    setting's figures, the steered setting's; empty where skipped)."""
    say("== early stopping: real voll runs of simulated versions ==")
    es = {} if "early" in SKIP else early_part(binary, work)
    frac = {label: es.get(label, {}).get("mean_fraction") for label, _ in EARLY_VERSIONS}
    wr = es.get("with_reference", {})
    fixed, steered = wr.get(f"jobs{EARLY_REF_JOBS}", {}), wr.get("steered", {})
    frac["with_reference"] = fixed.get("median_fraction")
    say(f"mean share of voll run: ASR ~0.01 {fmt(frac['asr01'])}, ASR ~0.30 {fmt(frac['asr30'])} "
        f"({EARLY_SEEDS} seeds each); demo-kandidat against demo-baseline, median (10th–90th percentile) over "
        f"{EARLY_REF_SEEDS} orders: {fmt(fixed.get('median_fraction'))} ({fmt(fixed.get('p10_fraction'))}–"
        f"{fmt(fixed.get('p90_fraction'))}) at --jobs {EARLY_REF_JOBS}, {fmt(steered.get('median_fraction'))} "
        f"({fmt(steered.get('p10_fraction'))}–{fmt(steered.get('p90_fraction'))}) steered by the server")
    say()
    return es, frac, fixed, steered
