"""Part 14 of scripts/bench — rollouts: the environment a trainer steps
(scripts/pruefstand_env, docs/training.md "An environment a trainer steps") beside the
bench's own runners on the same cases against the same simulated server. Three
contenders, each with a fresh `pruefstand sim-serve` of the same model folder (seed,
latency model, capacity):

  1. `pruefstand run` with no --jobs: the concurrency steered by the server's /metrics
     gauges, as a bench run steers it;
  2. the environment's rollouts (`python -m pruefstand_env rollouts`, the bench's agent
     as `EndpointPolicy`, prompted tool calling as the other two use) with
     `--jobs-from-run` that run: as many in flight as its steering reached (its
     `peak_in_flight`, read back through `pruefstand show`);
  3. AgentDojo's own sequential runner (benches/agentdojo_runner.py).

The case set is the throughput part's (clean and attacked cases; the plan runs no
injection goals, which the environment never offers — AgentDojo's runner runs its
injection goals too, so its figure is per case of any kind). Reported: rollouts (cases)
per hour end to end — each with its own start-up — and, for the environment, from its
first rollout to its last; the ratios; how many rollouts scored as the run scored the
same case; the machine's load average before and after. Printed, never asserted.

Not here: a real model's vLLM (the environment's rollouts against one are a later
measurement), a trainer's step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from .common import API_KEY, ATTACK, BENCHMARK_VERSION, MODEL, SKIP, children_cpu_s, count_cases, fmt, loadavg, say
from .contenders import run_agentdojo, run_pruefstand
from .sim import Sim

PLAN = "bench-rollouts"


def write_plan(path: Path, cs: dict) -> None:
    """The throughput case set without injection goals (the environment never offers them)."""
    lines = ["# written by scripts/bench (rollouts): clean + attacked cases", f'name = "{PLAN}"',
             f'benchmark_version = "{BENCHMARK_VERSION}"', f'attacks = ["{ATTACK}"]', "injection_goals = false",
             "case_timeout_s = 300", ""]
    for s, v in cs.items():
        lines += ["[[suites]]", f'name = "{s}"', f"user_tasks = {json.dumps(v['user_tasks'])}",
                  f"injection_tasks = {json.dumps(v['injection_tasks'])}", ""]
    path.write_text("\n".join(lines))


def run_environment(binary: Path, python: Path, scripts: Path, work: Path, root: Path, sim: Sim, plan: Path,
                    run_dir: Path) -> dict:
    """The environment's rollouts of every case of `plan`, as many in flight as the
    steering reached in `run_dir`; its summary with the wall time from the command's
    start (the venv, agentdojo's import, the plan's resolution included)."""
    out = work / "env-rollouts"
    shutil.rmtree(out, ignore_errors=True)
    argv = [str(python), "-m", "pruefstand_env", "rollouts", "--plan", str(plan), "--root", str(root),
            "--out", str(out), "--kind", "attacked", "--kind", "clean", "--base-url", sim.url, "--model", MODEL,
            "--tool-calling", "prompted", "--api-key-env", "BENCH_SIM_API_KEY", "--jobs-from-run", str(run_dir),
            "--pruefstand", str(binary)]
    env = dict(os.environ, PYTHONPATH=str(scripts), PRUEFSTAND_BIN=str(binary), BENCH_SIM_API_KEY=API_KEY)
    cpu0, t0 = children_cpu_s(), time.monotonic()
    with open(work / "env-rollouts.log", "wb") as log:
        done = subprocess.run(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
    wall, cpu = time.monotonic() - t0, children_cpu_s() - cpu0
    if done.returncode != 0:
        raise SystemExit(f"pruefstand_env rollouts exited {done.returncode}; see {work / 'env-rollouts.log'}")
    summary = json.loads(done.stdout.decode().strip().splitlines()[-1])
    lines = (out / "rollouts.jsonl").read_text(encoding="utf-8").splitlines()
    summary.update(end_to_end_s=wall, cpu_s=cpu, outcomes={
        json.loads(line)["case"]["id"]: (json.loads(line)["record"].get("utility"),
                                         json.loads(line)["record"].get("security")) for line in lines})
    return summary


def per_hour(n: int, seconds: float | None) -> float | None:
    return 3600 * n / seconds if seconds else None


def run(binary: Path, python: Path, scripts: Path, work: Path, root: Path, model: Path, cs: dict) -> dict | None:
    if "rollouts" in SKIP:
        return None
    say("== rollouts: the environment a trainer steps beside `pruefstand run` and AgentDojo's runner ==")
    plan = root / "profiles" / f"{PLAN}.toml"
    write_plan(plan, cs)
    load_before = loadavg()
    say(f"cases            : {count_cases(cs) - sum(len(v['injection_tasks']) for v in cs.values())} "
        f"(clean + attacked); load average before {load_before}")

    sim = Sim(binary, model, work / "sim-rollouts-run.log")
    pf = run_pruefstand(binary, root, sim, plan, None, "rollouts", work)
    sim.stop()
    steered = pf.get("concurrency") or {}
    say(f"pruefstand run   : {pf['cases']} cases in {pf['wall_s']:.1f} s = {fmt(per_hour(pf['cases'], pf['wall_s']), 0)} "
        f"an hour; steered up to {steered.get('peak_in_flight')} in flight (settled {steered.get('settled')}); "
        f"errors {pf['errors']}")

    sim = Sim(binary, model, work / "sim-rollouts-env.log")
    envr = run_environment(binary, python, scripts, work, root, sim, plan, work / "run-rollouts")
    sim.stop()
    n = envr["rollouts"]
    say(f"environment      : {n} rollouts, {envr['jobs']} in flight, in {envr['end_to_end_s']:.1f} s end to end = "
        f"{fmt(per_hour(n, envr['end_to_end_s']), 0)} an hour ({envr['wall_s']:.1f} s first rollout to last = "
        f"{fmt(per_hour(n, envr['wall_s']), 0)} an hour); errors {envr['errors']}")
    ours = {r["case_id"]: (r["utility"], r["security"]) for r in pf["records"]}
    same = sum(1 for k, v in envr["outcomes"].items() if ours.get(k) == tuple(v))

    ad = None
    if "agentdojo" not in SKIP:
        sim = Sim(binary, model, work / "sim-rollouts-agentdojo.log")
        ad = run_agentdojo(python, work, sim, cs, "rollouts")
        sim.stop()
        say(f"AgentDojo runner : {ad['cases']} cases in {ad['wall_s']:.1f} s = {fmt(per_hour(ad['cases'], ad['wall_s']), 0)} "
            f"an hour (sequential; its injection goals included)")
    load_after = loadavg()
    result = {
        "cases": pf["cases"],
        "steered_jobs": steered.get("peak_in_flight"),
        "pruefstand_run": {"cases": pf["cases"], "wall_s": pf["wall_s"], "errors": pf["errors"],
                           "per_hour": per_hour(pf["cases"], pf["wall_s"]), "concurrency": pf.get("concurrency")},
        "environment": {k: v for k, v in envr.items() if k != "outcomes"}
        | {"per_hour": per_hour(n, envr["end_to_end_s"]), "per_hour_rollouts_only": per_hour(n, envr["wall_s"]),
           "same_outcome_as_run": same},
        "agentdojo": ad and {"cases": ad["cases"], "wall_s": ad["wall_s"], "per_hour": per_hour(ad["cases"], ad["wall_s"])},
        "load_before": load_before,
        "load_after": load_after,
    }
    env_ph, run_ph = result["environment"]["per_hour"], result["pruefstand_run"]["per_hour"]
    result["ratio_environment_to_run"] = env_ph / run_ph if env_ph and run_ph else None
    ad_ph = ad and per_hour(ad["cases"], ad["wall_s"])
    result["ratio_environment_to_agentdojo"] = env_ph / ad_ph if env_ph and ad_ph else None
    say(f"ratios           : environment / pruefstand run {fmt(result['ratio_environment_to_run'])}×, environment / "
        f"AgentDojo's runner {fmt(result['ratio_environment_to_agentdojo'])}× (end to end); same outcome as the run "
        f"for {same}/{n} rollouts; load average after {load_after}")
    say()
    return result
