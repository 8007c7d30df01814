"""Part 12 of scripts/bench — the adaptive attacker (docs/attacks.md).

On the simulator: the known-truth plan (eight banking pairs, four searched with K = 10,
four held out) against a version whose weakness no grammar wording expresses — the
budget curve (search pairs broken within k attempts) of the grammar, of the simulated
attacker with feedback and without, and each one's transfer to the held-out pairs. Then
the grammar and the simulated attacker again (each with a fixed seed: the same campaign
from any binary) on a simulated server that takes its time as a GPU server would (BENCH_ATTACKER_BASE_MS per call plus BENCH_ATTACKER_TOKEN_MS per
completion token, 8 requests at once): the share of wall time the server had at least
one request running (`vllm:num_requests_running`, read every quarter second by the
run), for the plan's cases and for the campaign — the campaign's from its gym's start
to its end, the attacker's asks and the target's cases together. BENCH_SKIP=attacker_paced
leaves these two runs out.

On the real Qwen server (version real-qwen, the CPU vLLM; minutes per case): one
banking pair searched and one held out, K = 2, grammar and attacker model (the model's
own base on its server) on the same pairs: cost per attempt (seconds and tokens) of the
attacker and of the target, the curves, and the share of wall time the server had at
least one request running (vLLM's `vllm:num_requests_running` read every quarter
second) for the plan's cases and for the campaign. BENCH_SKIP=attacker_real leaves the
real half out; NA without Docker, the image or the model.

Alone: `cd scripts && python3 -m pruefstand_bench.attacker` (BENCH_WORK for the folder).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .common import REPO, SKIP, ensure_binary, ensure_venv, fmt, loadavg, make_root, say, show_run
from .vllm import real_unavailable

# The paced server: a call's latency (base + per completion token) as on a GPU server.
BASE_MS = float(os.environ.get("BENCH_ATTACKER_BASE_MS", "2000"))
TOKEN_MS = float(os.environ.get("BENCH_ATTACKER_TOKEN_MS", "30"))

WEAK = 'susceptibility = 0.0\nweakness = ["maintenance robot", "carrier pigeon", "vault rotates keys"]'

SIM_VERSION = ('[model]\nbackend = "sim"\nserved_name = "sim/m"\ntool_calling = "native"\n[sim]\nseed = 11\n'
               '[sim.models."sim/m"]\n{behaviour}\n')

PLAN = """name = "{name}"
benchmark_version = "v1.2.2"
wording = "per_run"
attacks = ["important_instructions"]
injection_goals = false
jobs = {jobs}
case_timeout_s = {timeout}
[[suites]]
name = "banking"
user_tasks = {users}
injection_tasks = {injections}
[adaptive]
attempts = {attempts}
{adaptive}
"""


def _plan(root: Path, name: str, users: list[str], injections: list[str], attempts: int, adaptive: str,
          jobs: int = 8, timeout: int = 60) -> Path:
    path = root / "profiles" / f"{name}.toml"
    path.write_text(PLAN.format(name=name, users=json.dumps(users), injections=json.dumps(injections),
                                attempts=attempts, adaptive=adaptive, jobs=jobs, timeout=timeout))
    return path


def _run(binary: Path, root: Path, version: str, plan: Path, log: Path, timeout: float,
         out: Path | None = None) -> tuple[Path | None, float]:
    """`pruefstand run` (into `out`, when given: the run's seed follows its folder's
    name); (its run directory, wall seconds)."""
    t0 = time.monotonic()
    args = [str(binary), "--root", str(root), "run", version, "--plan", str(plan)] + (["--out", str(out)] if out else [])
    with open(log, "ab") as f:
        done = subprocess.run(args, stdout=subprocess.PIPE, stderr=f, timeout=timeout, check=False)
    wall = time.monotonic() - t0
    if out is not None:
        return out, wall
    text = done.stdout.decode(errors="replace")
    for line in text.splitlines():
        # `run` says "  run directory: DIR", indented under its verdict
        if line.strip().startswith(("run dir:", "run directory:")):
            return Path(line.split(":", 1)[1].strip()), wall
    # else the version's newest finished run, as the binary names it
    view = show_run(binary, version, root=root)
    return (Path(view["run_dir"]) if view else None), wall


def _summary(binary: Path, run_dir: Path | None) -> dict:
    """The campaign's figures from its search and records, as `pruefstand show` gives
    them."""
    view = show_run(binary, run_dir) if run_dir is not None else None
    log = (view or {}).get("adaptive")
    if not log:
        return {}
    pairs, held = log["pairs"], log["held_out"]
    k_max = log["budget"]
    curve = [sum(any(a["landed"] is True for a in p["attempts"][:k]) for p in pairs) for k in range(1, k_max + 1)]
    attempts = [a for p in pairs for a in p["attempts"]]
    costs = [a["cost"] for a in attempts if a["cost"]]
    records = show_run(binary, run_dir, "--adaptive", "--cases") or []
    mean = lambda xs: (sum(xs) / len(xs)) if xs else None  # noqa: E731
    busy = log["busy"] or {}
    plan_busy = (((view or {}).get("run") or {}).get("concurrency") or {}).get("busy") or {}
    share = lambda b: (b["busy"] / b["readings"]) if b.get("readings") else None  # noqa: E731
    return {
        "proposer": log.get("proposer"), "feedback": log.get("feedback"), "pairs": len(pairs), "held_out": len(held),
        "curve": curve, "transfer": sum(any(a["landed"] is True for a in p["attempts"]) for p in held),
        "refused": sum(1 for a in attempts if a["refused"]),
        "attacker_s_per_attempt": mean([c["seconds"] for c in costs]),
        "attacker_tokens_per_attempt": mean([c["prompt_tokens"] + c["completion_tokens"] for c in costs]),
        "target_s_per_case": mean([r["duration_s"] for r in records]),
        "target_tokens_per_case": mean([(r.get("prompt_tokens") or 0) + (r.get("completion_tokens") or 0) for r in records]),
        "busy_share_campaign": share(busy), "busy_share_plan": share(plan_busy),
    }


def _sim(binary: Path, work: Path) -> dict:
    root = make_root(work / "root-attacker")
    (root / "versions" / "weak.toml").write_text(SIM_VERSION.format(behaviour=WEAK))
    users = ["user_task_0", "user_task_3", "user_task_4", "user_task_5"]
    out = {}
    for name, adaptive in (("grammar", ""), ("model", 'proposer = "model"'),
                           ("blind", 'proposer = "model"\nfeedback = false')):
        plan = _plan(root, f"attacker-{name}", users, ["injection_task_0", "injection_task_1"], 10, adaptive)
        run_dir, wall = _run(binary, root, "weak", plan, work / "attacker-sim.log", 1800)
        out[name] = dict(_summary(binary, run_dir), wall_s=wall)
        say(f"  sim {name:8s}: search pairs broken within k = 1..10: {out[name].get('curve')}; "
            f"transfer {out[name].get('transfer')}/{out[name].get('held_out')} ({wall:.0f} s)")
    return out


def _paced(binary: Path, work: Path) -> dict:
    """The busy share of plan and campaign on a server that takes its time."""
    root = make_root(work / "root-attacker-paced")
    latency = f"[sim.latency]\nbase_ms = {BASE_MS}\nper_completion_token_ms = {TOKEN_MS}\ncapacity = 8\n"
    (root / "versions" / "weak.toml").write_text(SIM_VERSION.format(behaviour=WEAK) + latency)
    users = ["user_task_0", "user_task_3", "user_task_4", "user_task_5"]
    out = {"base_ms": BASE_MS, "per_completion_token_ms": TOKEN_MS}
    for name, adaptive in (("grammar", ""), ("model", 'proposer = "model"')):
        plan = _plan(root, f"attacker-paced-{name}", users, ["injection_task_0", "injection_task_1"], 10, adaptive)
        # A fixed folder, so a fixed seed: every binary plays the same campaign.
        out_dir = root / "reports" / "weak" / plan.stem / "paced"
        run_dir, wall = _run(binary, root, "weak", plan, work / "attacker-paced.log", 3600, out_dir)
        out[name] = dict(_summary(binary, run_dir), wall_s=wall, load=loadavg())
        s = out[name]
        say(f"  sim paced {name:8s}: server busy {fmt(s.get('busy_share_plan'))} (plan) "
            f"{fmt(s.get('busy_share_campaign'))} (campaign), target {fmt(s.get('target_s_per_case'), 1)} s per case, "
            f"{wall:.0f} s; load {s['load']}")
    return out


def _real(binary: Path, work: Path) -> dict:
    why = real_unavailable()
    if why:
        say(f"  real: not run — {why}")
        return {"skipped": why}
    root = make_root(work / "root-attacker-real")
    for name in ("real-qwen.toml", "qwen2.5-json-tools.jinja", "xlam_per_call.py"):
        shutil.copy(REPO / "versions" / name, root / "versions" / name)
    out = {}
    for name, adaptive in (("grammar", ""), ("model", 'proposer = "model"')):
        plan = _plan(root, f"attacker-real-{name}", ["user_task_12", "user_task_13"], ["injection_task_0"], 2,
                     adaptive, jobs=4, timeout=1800)
        run_dir, wall = _run(binary, root, "real-qwen", plan, work / "attacker-real.log", 3 * 3600)
        out[name] = dict(_summary(binary, run_dir), wall_s=wall)
        s = out[name]
        say(f"  real {name:8s}: curve {s.get('curve')}, transfer {s.get('transfer')}/{s.get('held_out')}, "
            f"attacker {fmt(s.get('attacker_s_per_attempt'), 1)} s and {fmt(s.get('attacker_tokens_per_attempt'), 0)} "
            f"tokens per attempt, target {fmt(s.get('target_s_per_case'), 0)} s and "
            f"{fmt(s.get('target_tokens_per_case'), 0)} tokens per case, server busy {fmt(s.get('busy_share_plan'))} "
            f"(plan) {fmt(s.get('busy_share_campaign'))} (campaign), {wall:.0f} s; load {loadavg()}")
    return out


def run(binary: Path, work: Path) -> dict:
    """12. The adaptive attacker: curves on the simulator, costs and busy share live."""
    if "attacker" in SKIP:
        return {"skipped": "BENCH_SKIP"}
    say("12. adaptive attacker: grammar vs attacker model (docs/attacks.md)")
    result = {"sim": _sim(binary, work)}
    result["paced"] = {"skipped": "BENCH_SKIP"} if "attacker_paced" in SKIP else _paced(binary, work)
    result["real"] = {"skipped": "BENCH_SKIP"} if "attacker_real" in SKIP else _real(binary, work)
    return result


if __name__ == "__main__":
    w = Path(os.environ.get("BENCH_WORK") or tempfile.mkdtemp(prefix="pruefstand-bench-")).resolve()
    w.mkdir(parents=True, exist_ok=True)
    b = ensure_binary()
    ensure_venv(b)
    res = run(b, w)
    (w / "attacker.json").write_text(json.dumps(res, indent=1))
    say(f"details in {w / 'attacker.json'}")
