"""The real vLLM (its CPU build) in Docker, as the real and tools parts use it: the
image and model knobs (BENCH_REAL_*), a fresh container per measurement with its
/metrics polled, what the server did between two reads (calls, tokens, the prefix
cache), a plan as a case set, and a timed command in its own process group.

Not the simulated server (sim.py); not the parts' own passes (real.py, tools.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from .common import API_KEY, REPO, docker, env_float, free_port, say, show_run


REAL_IMAGE = os.environ.get("BENCH_REAL_IMAGE", "pruefstand-vllm-cpu:current")
REAL_MODEL_DIR = Path(os.environ.get("BENCH_REAL_MODEL", "/var/tmp/pruefstand-vllm-cpu/current/model"))
REAL_PLAN = REPO / "profiles" / "real-small.toml"
REAL_SERVED = "smollm2"
REAL_MAX_TOKENS = 128
REAL_READY_S = env_float("BENCH_REAL_READY_S", 900.0)
REAL_PASS_TIMEOUT_S = env_float("BENCH_REAL_TIMEOUT_S", 5400.0)
# versions/real-smol.toml's command and args, plus one: a server-wide cap on completion
# tokens at the versions' max_tokens (128). pruefstand's requests carry max_tokens 128
# anyway, so for them it changes nothing; AgentDojo's `local` provider sends no
# max_tokens, and a 135M model that does not stop would otherwise generate to the end
# of its 8,192-token context at a few tokens per second on each such turn.
REAL_ARGS = ["--max-model-len", "8192", "--enforce-eager", "--dtype", "float32",
             "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
             "--override-generation-config", json.dumps({"max_new_tokens": REAL_MAX_TOKENS})]
# The names vLLM has used for its prefix-cache counters (tokens): 0.32 has the first.
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries_total")


def plan_case_set(plan: Path) -> dict:
    """The plan's suites as a case set for benches/agentdojo_runner.py."""
    try:
        import tomllib

        data = tomllib.loads(plan.read_text())
        return {s["name"]: {"user_tasks": list(s["user_tasks"]), "injection_tasks": list(s.get("injection_tasks", []))}
                for s in data["suites"]}
    except ImportError:  # Python < 3.11: the plan's simple [[suites]] blocks
        out = {}
        for block in plan.read_text().split("[[suites]]")[1:]:
            name = re.search(r'^name\s*=\s*"([^"]+)"', block, re.M).group(1)
            ut = re.search(r"^user_tasks\s*=\s*(\[[^\]]*\])", block, re.M).group(1)
            it = re.search(r"^injection_tasks\s*=\s*(\[[^\]]*\])", block, re.M)
            out[name] = {"user_tasks": json.loads(ut), "injection_tasks": json.loads(it.group(1)) if it else []}
        return out


def real_unavailable() -> str | None:
    """Why the real part cannot run here (None: it can)."""
    if shutil.which("docker") is None:
        return "no docker command"
    try:
        if docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=30).returncode != 0:
            return "Docker Engine not reachable (`docker info` failed)"
        if docker("image", "inspect", REAL_IMAGE, check=False, timeout=30).returncode != 0:
            return f"image {REAL_IMAGE} missing (scripts/build-vllm-cpu-image builds it)"
    except subprocess.TimeoutExpired:
        return "docker did not answer within 30 s"
    if not (REAL_MODEL_DIR / "config.json").exists():
        return f"model folder {REAL_MODEL_DIR} missing (scripts/build-vllm-cpu-image writes it)"
    if not REAL_PLAN.exists():
        return f"plan {REAL_PLAN} missing"
    return None


class RealServer:
    """The real vLLM (CPU build) in a container started as pruefstand starts
    versions/real-smol (same image, model mount, command and args, shm 1 GiB, the API key
    by environment; `api_key` None: none), plus REAL_ARGS' completion cap. A fresh
    container per measurement: its prefix cache starts empty. Polls /metrics every
    second for the peak of requests running and waiting."""

    def __init__(self, work: Path, tag: str, api_key: str | None = API_KEY, model_dir: Path | None = None,
                 served: str | None = None, args: list[str] | None = None, template: Path | None = None,
                 parser_plugin: Path | None = None):
        """Defaults: versions/real-smol's model and args (part 8). `template`: a chat
        template on this machine, mounted read-only at /chat_template.jinja and named with
        --chat-template; `parser_plugin` likewise at /tool_parser_plugin.py with
        --tool-parser-plugin (as pruefstand mounts a version's `chat_template` and
        `tool_parser_plugin`)."""
        self.port = free_port()
        self.name = f"pruefstand-bench-real-{os.getpid()}-{tag}"
        self.log = work / f"vllm-{tag}.log"
        model_dir = model_dir or REAL_MODEL_DIR
        args = list(REAL_ARGS if args is None else args)
        mounts = ["-v", f"{model_dir}:/model:ro"]
        if template:
            mounts += ["-v", f"{template}:/chat_template.jinja:ro"]
            args = ["--chat-template", "/chat_template.jinja", *args]
        if parser_plugin:
            mounts += ["-v", f"{parser_plugin}:/tool_parser_plugin.py:ro"]
            args = ["--tool-parser-plugin", "/tool_parser_plugin.py", *args]
        docker("rm", "-f", self.name, check=False)
        t0 = time.monotonic()
        docker("run", "-d", "--name", self.name, "--shm-size=1g", "-p", f"127.0.0.1:{self.port}:8000",
               *(["-e", f"VLLM_API_KEY={api_key}"] if api_key else []), "--security-opt", "no-new-privileges",
               *mounts, REAL_IMAGE,
               "python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/model",
               "--served-model-name", served or REAL_SERVED, "--host", "0.0.0.0", "--port", "8000", *args)
        try:
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5).read()
                    break
                except OSError:
                    pass
                state = docker("inspect", "-f", "{{.State.Running}}", self.name, check=False).stdout.strip()
                if state != "true":
                    raise RuntimeError(f"the vLLM container exited during start-up; see {self.log}")
                if time.monotonic() - t0 > REAL_READY_S:
                    raise RuntimeError(f"vLLM not healthy within {REAL_READY_S:.0f} s; see {self.log}")
                time.sleep(1.0)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - t0
        self.peak_running = self.peak_waiting = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def metrics(self) -> dict:
        """Every sample summed over its labels, by name (histogram buckets and the
        counters' `_created` stamps left out)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            base = name.split("{")[0]
            if base.endswith(("_bucket", "_created")):
                continue
            try:
                out[base] = out.get(base, 0.0) + float(value)
            except ValueError:
                pass
        return out

    def _poll(self) -> None:
        while not self._stop.wait(1.0):
            try:
                m = self.metrics()
            except OSError:
                continue
            self.peak_running = max(self.peak_running, m.get("vllm:num_requests_running", 0.0))
            self.peak_waiting = max(self.peak_waiting, m.get("vllm:num_requests_waiting", 0.0))

    def stop(self) -> None:
        if getattr(self, "_thread", None):
            self._stop.set()
            self._thread.join()
        try:
            logs = subprocess.run(["docker", "logs", self.name], capture_output=True, timeout=60)
            self.log.write_bytes(logs.stdout + logs.stderr)
            docker("rm", "-f", self.name, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            say(f"real: removing container {self.name} failed: {e}")


def metric_pick(m: dict, names: tuple) -> tuple[str | None, float]:
    for n in names:
        if n in m:
            return n, m[n]
    return None, 0.0


def server_delta(m0: dict, m1: dict) -> dict:
    """What the server did between two /metrics reads: calls, tokens and the prefix
    cache (hits ÷ queries, both in tokens)."""
    hn, h1 = metric_pick(m1, PREFIX_HITS)
    qn, q1 = metric_pick(m1, PREFIX_QUERIES)
    h = h1 - m0.get(hn, 0.0) if hn else None
    q = q1 - m0.get(qn, 0.0) if qn else None
    d = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)  # noqa: E731
    return {"calls": int(d("vllm:request_success_total")), "prompt_tokens": int(d("vllm:prompt_tokens_total")),
            "completion_tokens": int(d("vllm:generation_tokens_total")),
            "prefix_hits": h, "prefix_queries": q, "prefix_names": [hn, qn],
            "prefix_hit_rate": (h / q) if h is not None and q else None,
            # vLLM's request histograms (their _sum and _count): seconds per call end to
            # end, and of it queued, prefilling and decoding
            "e2e_s_sum": d("vllm:e2e_request_latency_seconds_sum"),
            "e2e_count": int(d("vllm:e2e_request_latency_seconds_count")),
            "queue_s_sum": d("vllm:request_queue_time_seconds_sum"),
            "prefill_s_sum": d("vllm:request_prefill_time_seconds_sum"),
            "decode_s_sum": d("vllm:request_decode_time_seconds_sum")}


def read_records(binary: Path, out: Path) -> list[dict]:
    """The case records of the run (or gym pass) in `out`, as the binary shows them;
    none when it left no run there."""
    return show_run(binary, out, "--cases") or []


def run_timed(argv: list[str], env: dict, log: Path, cwd: Path | None = None,
              timeout: float | None = None) -> tuple[int, float]:
    """Runs argv (its own process group, killed whole at the timeout); (exit, wall s)."""
    t0 = time.monotonic()
    with open(log, "ab") as f:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout or REAL_PASS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = 124
    return rc, time.monotonic() - t0


def record_summary(records: list[dict]) -> str:
    errors = sum(1 for r in records if r.get("error"))
    util = [r["utility"] for r in records if r.get("kind") == "clean" and r.get("utility") is not None]
    return f"{len(records)} cases, {errors} errors, clean utility {sum(util)}/{len(util)}"
