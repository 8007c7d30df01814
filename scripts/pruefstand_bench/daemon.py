"""Part 6 of scripts/bench — the daemon at rest (CPU s and peak RSS over BENCH_IDLE_S,
empty queue and a job waiting for a busy fake GPU) and the pickup latency start →
running.
The busy variant needs the fake NVML library (tests/fixtures/fake_nvml.c, built here,
or BENCH_FAKE_NVML).

Not `pruefstand serve` (serve.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .common import API_KEY, MODEL, REPO, SKIP, env_float, fmt, proc_cpu_s, proc_status, say
from .sim import Sim

IDLE_S = env_float("BENCH_IDLE_S", 60.0)


def daemon_part(binary: Path, work: Path, truth_text: str, tiny_plan: Path) -> dict:
    """Written against the daemon's commands: `pruefstand daemon`,
    `pruefstand start <version> --plan P`, `pruefstand status --json`, and the job files
    under `<root>/.pruefstand/jobs/`."""
    na = {"idle_cpu_s": None, "idle_rss_mib": None, "busy_cpu_s": None, "busy_rss_mib": None, "pickup_ms": None}
    if subprocess.run([str(binary), "daemon", "--help"], capture_output=True).returncode != 0:
        say("daemon: not available in this build")
        return na
    root = work / "daemon-root"
    for d in ("versions", "profiles", "reports", "state", "runtime"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "runtime", 0o700)
    # State lives under the root (.pruefstand/); the XDG dirs point into the work folder
    # so nothing of the user's is touched.
    env = dict(os.environ, PRUEFSTAND_ROOT=str(root), XDG_STATE_HOME=str(root / "state"),
               XDG_RUNTIME_DIR=str(root / "runtime"), BENCH_SIM_API_KEY=API_KEY)
    shutil.copy(tiny_plan, root / "profiles" / "bench-tiny.toml")
    nvml = fake_nvml(work)

    def start_daemon(guard_toml: str, log_name: str):
        (root / "pruefstand.toml").write_text('[paths]\nreports = "reports"\n' + guard_toml)
        proc = subprocess.Popen([str(binary), "--root", str(root), "daemon"], env=env, stdin=subprocess.DEVNULL,
                                stdout=open(work / log_name, "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the daemon exited ({proc.returncode}); see {work / log_name}")
            if subprocess.run([str(binary), "--root", str(root), "status", "--json"], env=env,
                              capture_output=True).returncode == 0:
                return proc
            time.sleep(0.05)
        raise RuntimeError("the daemon did not answer `status --json` within 20 s")

    def stop_daemon(proc) -> None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def at_rest(proc) -> tuple[float, float]:
        time.sleep(1.0)  # settle after start-up
        c0 = proc_cpu_s(proc.pid)
        time.sleep(IDLE_S)
        return proc_cpu_s(proc.pid) - c0, proc_status(proc.pid, "VmHWM") / 1024

    def start_job(sim: Sim) -> float:
        (root / "versions" / "bench-external.toml").write_text(
            f'[model]\nbackend = "external"\nserved_name = "{MODEL}"\nurl = "{sim.url}"\n'
            'api_key_env = "BENCH_SIM_API_KEY"\ntool_calling = "prompted"\n')
        t0 = time.monotonic()
        subprocess.run([str(binary), "--root", str(root), "start", "bench-external", "--plan",
                        str(root / "profiles" / "bench-tiny.toml")], env=env, check=True, capture_output=True)
        return t0

    def job_running() -> bool:
        # The job's own durable state: `running` is written when the daemon picks it up.
        for job in (root / ".pruefstand" / "jobs").glob("*/job.json"):
            try:
                if json.loads(job.read_text()).get("state") in ("running", "done"):
                    return True
            except (OSError, json.JSONDecodeError):
                pass
        return False

    res = dict(na)
    model0 = work / "model-instant"
    sim = Sim(binary, model0, work / "sim-daemon.log")
    try:
        # The guard watches the fake GPU; one idle sample opens the window, so pickup
        # measures the daemon, not the configured window ((samples − 1) × interval).
        idle_guard = (f'\n[guard.gpu]\nnvml = "block"\nlibrary = "{nvml["lib"]}"\nsamples = 1\ninterval_s = 5.0\n'
                      if nvml else '\n[guard.gpu]\nnvml = "ignore"\n')
        if nvml:
            nvml["set"]("idle")
        proc = start_daemon(idle_guard, "daemon-idle.log")
        try:
            say(f"daemon: empty queue, measuring {IDLE_S:.0f} s at rest …")
            res["idle_cpu_s"], res["idle_rss_mib"] = at_rest(proc)
            t0 = start_job(sim)
            while time.monotonic() - t0 < 30:
                if job_running():
                    res["pickup_ms"] = 1000 * (time.monotonic() - t0)
                    break
                time.sleep(0.005)
        finally:
            stop_daemon(proc)
        if nvml:
            nvml["set"]("busy")
            proc = start_daemon(idle_guard, "daemon-busy.log")
            try:
                start_job(sim)
                say(f"daemon: a job waiting for the busy (fake) GPU, measuring {IDLE_S:.0f} s …")
                res["busy_cpu_s"], res["busy_rss_mib"] = at_rest(proc)
            finally:
                stop_daemon(proc)
        else:
            say("daemon: no fake NVML library (tests/fixtures/fake_nvml.c) — the busy-GPU variant is NA")
    except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
        say(f"daemon: measurement failed: {e}")
    finally:
        sim.stop()
    return res


def fake_nvml(work: Path):
    """The fake NVML library (the tests' fixture), built here when its source exists.
    Its state file is `fake_nvml.state` beside the .so."""
    lib = os.environ.get("BENCH_FAKE_NVML")
    src = REPO / "tests" / "fixtures" / "fake_nvml.c"
    if not lib and src.exists():
        d = work / "nvml"
        d.mkdir(exist_ok=True)
        lib = str(d / "libnvidia-ml.so.1")
        if subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", lib, str(src)], capture_output=True).returncode != 0:
            return None
    if not lib or not Path(lib).exists():
        return None
    state = Path(lib).parent / os.environ.get("BENCH_FAKE_NVML_STATE", "fake_nvml.state")

    def set_state(which: str) -> None:
        # The fixture's text format (tests/common/nvml.rs): one GPU, utilization, and
        # `process GPU PID BYTES` lines.
        busy = "gpus 1\nname Fake Thor\nutilization 97\nprocess 0 4242 1073741824\n"
        idle = "gpus 1\nname Fake Thor\nutilization 0\n"
        tmp = state.with_suffix(".tmp")
        tmp.write_text(busy if which == "busy" else idle)
        tmp.replace(state)

    return {"lib": lib, "set": set_state}


def run(binary: Path, work: Path, truth_text: str, root: Path) -> dict:
    """The daemon's figures (None where not measured), printed."""
    say("== daemon at rest ==")
    if "daemon" in SKIP:
        dm = {"idle_cpu_s": None, "idle_rss_mib": None, "busy_cpu_s": None, "busy_rss_mib": None, "pickup_ms": None}
    else:
        dm = daemon_part(binary, work, truth_text, root / "profiles" / "bench-tiny.toml")
    say(f"empty queue      : CPU {fmt(dm['idle_cpu_s'], 3)} s over {IDLE_S:.0f} s, peak RSS {fmt(dm['idle_rss_mib'], 1)} MiB")
    say(f"job waiting (GPU busy): CPU {fmt(dm['busy_cpu_s'], 3)} s over {IDLE_S:.0f} s, peak RSS {fmt(dm['busy_rss_mib'], 1)} MiB")
    say(f"pickup           : {fmt(dm['pickup_ms'], 0)} ms from `start` to running (idle GPU)")
    say()
    return dm
