"""The simulated model server: `pruefstand sim-serve` on a free port, polled for when it
was busy, with what its own /metrics say a run cost (calls, tokens, the ideal time at
full capacity). Not the in-process simulator the early-stop and ETA parts use (a
version with backend "sim"), nor the real vLLM (vllm.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from .common import API_KEY, MODEL, free_port, proc_cpu_s


class Sim:
    """`pruefstand sim-serve` in vLLM's command-line shape, with a /metrics poller that
    records when the server was busy (first request in → last response out)."""

    def __init__(self, binary: Path, model_dir: Path, log: Path):
        self.port = free_port()
        self.model_dir = model_dir
        self.latency = read_latency(model_dir)
        env = dict(os.environ, VLLM_API_KEY=API_KEY)
        self.proc = subprocess.Popen(
            [str(binary), "sim-serve", "serve", str(model_dir), "--served-model-name", MODEL,
             "--host", "127.0.0.1", "--port", str(self.port)],
            env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"sim-serve did not come up; see {log}")
                time.sleep(0.05)
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def metrics(self) -> dict:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or "_bucket" in line or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = out.get(name.split("{")[0], 0.0) + float(value)
        return out

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                m = self.metrics()
                active = m.get("vllm:num_requests_running", 0.0) + m.get("vllm:num_requests_waiting", 0.0)
                self.samples.append((time.monotonic(), m.get("vllm:request_success_total", 0.0), active))
            except OSError:
                pass
            self._stop.wait(0.1)

    def busy_window(self) -> float | None:
        """Seconds the server was in use, from its own gauges and counters polled every
        0.1 s: the last poll before the first request was seen (running, waiting or done)
        to the first poll that saw the final count. Over-estimates by at most ~0.2 s."""
        if not self.samples or self.samples[-1][1] == 0:
            return None
        final = self.samples[-1][1]
        first = next(i for i, (_, n, a) in enumerate(self.samples) if n > 0 or a > 0)
        start = self.samples[max(first - 1, 0)][0]
        end = next(t for t, n, _ in self.samples if n == final)
        return end - start

    def ramp_drain(self) -> tuple[float, float, float] | None:
        """(ramp, full, drain) seconds of the busy window: until the server first had
        `capacity` requests in (running + waiting), while it had, and after it last had."""
        cap = self.latency["capacity"]
        full = [t for t, _, a in self.samples if a >= cap]
        window = self.busy_window()
        if not full or window is None:
            return None
        final = self.samples[-1][1]
        first = next(i for i, (_, n, a) in enumerate(self.samples) if n > 0 or a > 0)
        start = self.samples[max(first - 1, 0)][0]
        end = next(t for t, n, _ in self.samples if n == final)
        saturated = sum(1 for t, _, a in self.samples if start <= t <= end and a >= cap) * 0.1
        return full[0] - start, saturated, end - full[-1]

    def ideal(self, m: dict) -> dict:
        """What the server itself says: calls, tokens, the pure service time the latency
        model charged (no queueing) and the ideal wall time at full capacity."""
        calls = m.get("vllm:request_success_total", 0.0)
        pt = m.get("vllm:prompt_tokens_total", 0.0)
        ct = m.get("vllm:generation_tokens_total", 0.0)
        lat = self.latency
        service_s = (calls * lat["base_ms"] + pt * lat["per_prompt_token_ms"] + ct * lat["per_completion_token_ms"]) / 1000
        e2e_s = m.get("vllm:e2e_request_latency_seconds_sum", 0.0)
        return {"calls": int(calls), "prompt_tokens": int(pt), "completion_tokens": int(ct),
                "service_s": service_s, "e2e_sum_s": e2e_s,
                "per_call_ms": 1000 * service_s / calls if calls else None,
                "ideal_s": service_s / lat["capacity"]}

    def stop(self) -> float:
        """Stops the server; returns its own CPU seconds."""
        self._stop.set()
        self._thread.join()
        cpu = proc_cpu_s(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return cpu


def read_latency(model_dir: Path) -> dict:
    lat = {}
    section = None
    for line in (model_dir / "sim.toml").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("["):
            section = line
        elif section == "[latency]" and "=" in line:
            k, v = (x.strip() for x in line.split("=", 1))
            lat[k] = float(v)
    lat["capacity"] = int(lat.get("capacity", 32))
    return lat
