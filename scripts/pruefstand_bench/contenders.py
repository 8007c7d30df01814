"""The two contenders on the simulated server, as the throughput, capacity, overhead
and steering parts run them: AgentDojo's own sequential runner
(benches/agentdojo_runner.py) and `pruefstand run` with the gym's memory sampled while
it runs; and the comparison of their outcomes case by case. Not the real-vLLM passes
(real.py, tools.py), which time their own commands."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from .common import API_KEY, ATTACK, BENCHMARK_VERSION, MODEL, REPO, children_cpu_s, show_run
from .sim import Sim


def run_agentdojo(python: Path, work: Path, sim, cs: dict, tag: str, fast_yaml: bool = False,
                  model_id: str = MODEL, timeout: float | None = None) -> dict:
    """`sim`: any server with a `port` (a Sim or the real vLLM's RealServer)."""
    cs_file = work / f"caseset-{tag}.json"
    cs_file.write_text(json.dumps({"suites": cs}))
    out = work / f"agentdojo-{tag}.json"
    logdir = work / f"agentdojo-{tag}-logs"
    shutil.rmtree(logdir, ignore_errors=True)
    argv = [str(python), str(REPO / "benches" / "agentdojo_runner.py"), "--case-set", str(cs_file),
            "--logdir", str(logdir), "--attack", ATTACK, "--benchmark-version", BENCHMARK_VERSION,
            "--model-id", model_id, "--out", str(out)] + (["--fast-yaml"] if fast_yaml else [])
    env = dict(os.environ, LOCAL_LLM_PORT=str(sim.port))
    cpu0, t0 = children_cpu_s(), time.monotonic()
    with open(work / f"agentdojo-{tag}.log", "wb") as log:
        subprocess.run(argv, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=timeout)
    wall, cpu = time.monotonic() - t0, children_cpu_s() - cpu0
    res = json.loads(out.read_text())
    res.update(wall_s=wall, cpu_s=cpu)
    return res


def gym_pss_kib(root_pid: int) -> tuple[int, int]:
    """(PSS in KiB, processes) of the gym under `root_pid`: the Python processes running
    gym.py (parent and workers), not the agents they spawn."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    parts = gym_pss_parts(root_pid, children)
    return sum(parts.values()), len(parts)


def gym_pss_parts(root_pid: int, children: dict[int, list[int]]) -> dict[int, int]:
    """PSS (KiB) of each gym process under `root_pid`, by pid."""
    parts: dict[int, int] = {}
    stack = [root_pid]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            if b"gym.py" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    parts[pid] = int(line.split()[1])
        except OSError:
            continue
    return parts


class PssSampler:
    """The gym's PSS every 0.5 s while a run goes on; `peak` is the largest sum seen."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.processes = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            kib, n = gym_pss_kib(self.pid)
            if kib > self.peak:
                self.peak, self.processes = kib, n

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 1024


def run_pruefstand(binary: Path, root: Path, sim: Sim, plan: Path, jobs: int | None, tag: str, work: Path) -> dict:
    (root / "versions" / "bench-external.toml").write_text(
        "# written by scripts/bench: the simulated model served by `pruefstand sim-serve`\n"
        'description = "scripts/bench contender: external sim server, prompted tool calling"\n\n'
        f'[model]\nbackend = "external"\nserved_name = "{MODEL}"\nurl = "{sim.url}"\n'
        'api_key_env = "BENCH_SIM_API_KEY"\ntool_calling = "prompted"\n')
    out = work / f"run-{tag}"
    shutil.rmtree(out, ignore_errors=True)
    argv = [str(binary), "--root", str(root), "run", "bench-external", "--plan", str(plan), "--out", str(out)]
    argv += ["--jobs", str(jobs)] if jobs is not None else []
    env = dict(os.environ, BENCH_SIM_API_KEY=API_KEY)
    cpu0, t0 = children_cpu_s(), time.monotonic()
    with open(work / f"run-{tag}.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        pss = PssSampler(proc.pid)
        rc = proc.wait()
        pss_mib = pss.stop()
    wall, cpu = time.monotonic() - t0, children_cpu_s() - cpu0
    records = show_run(binary, out, "--cases") or []
    if not records:
        raise SystemExit(f"pruefstand run produced no cases (exit {rc}); see {work / f'run-{tag}.log'}")
    meta = show_run(binary, out)["run"] or {}
    return {"cases": len(records), "errors": sum(1 for r in records if r["error"]), "wall_s": wall, "cpu_s": cpu,
            "exit": rc, "records": records, "gym_pss_mib": pss_mib, "gym_processes": pss.processes,
            "concurrency": meta.get("concurrency"),
            "case_s_mean": sum(r["duration_s"] for r in records) / len(records)}


def compare_outcomes(ad: dict, records: list[dict]) -> tuple[int, int]:
    """Cases where AgentDojo's runner and pruefstand recorded the same outcome."""
    same = total = 0
    for r in records:
        res = ad["results"].get(r["suite"], {})
        if r["kind"] == "clean":
            theirs, ours = res.get("clean", {}).get(r["user_task"]), r["utility"]
        elif r["kind"] == "injection_goal":
            theirs, ours = res.get("injection_goal", {}).get(r["injection_task"]), r["utility"]
        else:
            theirs = res.get("attacked", {}).get(f"{r['user_task']}/{r['injection_task']}")
            ours = [r["utility"], r["security"]]
        total += 1
        same += theirs == ours
    return same, total
