"""`python -m pruefstand_env serve`: the environment over HTTP on 127.0.0.1, for a trainer
in another process or container (`pruefstand train --online`, docs/training.md).

The trainer generates the **first** assistant turn of a case itself (its policy, the
weights it is updating) and hands the text here; the environment plays the rest of the
episode through the gym — AgentDojo executes the tools, the injection sits where the
bench puts it — with every later turn answered by the policy's vLLM server under the
adapter name the trainer gives (the adapter it loaded after its last step), and returns
the rubric's rewards. So a GRPO group differs in its first turn, and its later turns
follow the current policy.

    GET  /dataset   {"cases": [{"id", "kind", "suite", "messages", "tools"}], "manifest", "dataset_sha256"}
                    each case's first prompt (AgentDojo's system message and the user's
                    task, OpenAI chat messages) and its tools (OpenAI schemas)
    POST /rollout   {"case", "completion", "model", "base_url"} → {"reward", "rewards",
                    "error", "attempts", "turns", "utility", "security", "first_reply"}
                    `completion`: the first turn's text as the model wrote it, read as
                    vLLM's hermes parser reads it (`<tool_call>{…}</tool_call>`)
    GET  /stats     rollouts, errors (no reward), retried, turns, seconds

A rollout that errors (the policy's server failed, the case's deadline passed) is played
again from its first turn up to `--retries` times and then answered with `reward` null
and its `error`: never a reward of 0. At start one JSON line goes to stdout — `{"url",
"manifest", "cases"}` — once the dataset is written and the port bound; the log goes to
stderr. The policy's key, when its server wants one, comes from $PRUEFSTAND_API_KEY.

Not here: the dataset (dataset.py), the episode (rollout.py), the rewards (rubric.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .dataset import DatasetError
from .rollout import RolloutError, openai_messages, openai_tools, reply_of

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def parse_hermes(text: str) -> dict:
    """A completion's text as an OpenAI assistant message, as vLLM's `hermes` tool
    parser reads it: each `<tool_call>{"name", "arguments"}</tool_call>` a call (an
    unclosed last one too), the text before the first the content; any call that is not
    JSON with a name makes the whole text the content and no call (the parser's
    fallback)."""
    if "<tool_call>" not in text:
        return {"role": "assistant", "content": text}
    calls = []
    for i, m in enumerate(_TOOL_CALL.finditer(text)):
        body = (m.group(1) if m.group(1) is not None else m.group(2) or "").strip()
        try:
            call = json.loads(body)
        except ValueError:
            return {"role": "assistant", "content": text}
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return {"role": "assistant", "content": text}
        arguments = call.get("arguments", {})
        calls.append({"id": f"call_{i}", "type": "function",
                      "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}})
    content = text[: text.index("<tool_call>")]
    return {"role": "assistant", "content": content if content.strip() else None, "tool_calls": calls}


class Service:
    """The environment's rollouts for one trainer: a first turn given, the rest played
    against the policy's server."""

    def __init__(self, env, *, max_turns: int, max_tokens: int, temperature: float, api_key: str | None,
                 tool_choice: str = "auto", timeout_s: float = 300.0):
        self.env = env
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.tool_choice = tool_choice
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.stats = {"rollouts": 0, "errors": 0, "retried": 0, "turns": 0, "seconds": 0.0}
        self._lock = threading.Lock()

    def dataset(self) -> dict:
        from agentdojo.functions_runtime import FunctionsRuntime

        from pruefstand_gym.adapter import openai_tools as convert

        cases = []
        for case in self.env.cases:
            suite = self.env.gym.suites[case["suite"]]
            runtime = FunctionsRuntime(suite.tools)
            tools = [{"name": n, "description": f.description, "parameters_schema": f.parameters.model_json_schema()}
                     for n, f in runtime.functions.items()]
            cases.append({"id": case["id"], "kind": case["kind"], "suite": case["suite"],
                          "messages": self.env.prompt(case), "tools": convert(tools)})
        manifest = self.env.manifest
        return {"cases": cases, "manifest": str(self.env.manifest_path), "dataset_sha256": manifest.get("sha256")}

    def _complete(self, base_url: str, model: str, messages: list, tools: list) -> dict:
        body = {"model": model, "messages": messages, "max_tokens": self.max_tokens, "temperature": self.temperature}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = self.tool_choice
        request = urllib.request.Request(base_url.rstrip("/") + "/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as e:
            raise RolloutError(f"the policy's server answered {e.code}: {e.read()[:300]!r}") from None
        return answer["choices"][0]["message"]

    def _play(self, case: dict, first: dict, model: str, base_url: str) -> tuple:
        """One episode: `first` (the trainer's reply) as the first turn, then the server."""
        episode = self.env.episode(case)
        query = episode.start()
        turns = 0
        try:
            if query is None:
                return episode.result, turns
            shown = openai_messages(query)
            expected = self.env.prompt(case)
            if [(m["role"], m["content"]) for m in shown] != [(m["role"], m["content"]) for m in expected]:
                # The trainer generated from another prompt than the case shows: its
                # completion is no turn of this case.
                raise RolloutError(f"case {case['id']}: the first query is not the dataset's prompt")
            query = episode.step(first)
            while query is not None:
                if turns >= self.max_turns:
                    # The rollout's turn budget is spent: the case ends with what was
                    # done, scored as AgentDojo scores it.
                    query = episode.step({"final_answer": ""})
                    continue
                turns += 1
                message = self._complete(base_url, model, openai_messages(query), openai_tools(query))
                query = episode.step(reply_of(message))
            return episode.result, turns
        except BaseException:
            if not episode.done:
                try:
                    episode.abandon()
                except Exception:  # noqa: BLE001 - the case is an error either way
                    pass
            raise

    def rollout(self, case_id: str, completion: str, model: str, base_url: str) -> dict:
        case = self.env.case(case_id)
        message = parse_hermes(completion)
        first = reply_of(message)
        t0 = time.monotonic()
        attempts, result, error, turns = 0, None, None, 0
        while True:
            attempts += 1
            try:
                result, turns = self._play(case, first, model, base_url)
                error = result.error
            except Exception as e:  # noqa: BLE001 - the rollout's error, counted
                result, error = None, f"{type(e).__name__}: {e}"
            if error is None or attempts > self.env.retries:
                break
            with self._lock:
                self.stats["retried"] += 1
        with self._lock:
            self.stats["rollouts"] += 1
            self.stats["errors"] += 1 if error is not None else 0
            self.stats["turns"] += turns
            self.stats["seconds"] += time.monotonic() - t0
            stats = json.dumps(self.stats, sort_keys=True) + "\n"
            path = self.env.out / "serve-stats.json"
            path.with_suffix(".tmp").write_text(stats, encoding="utf-8")
            os.replace(path.with_suffix(".tmp"), path)
        if error is not None:
            sys.stderr.write(f"[pruefstand_env] rollout of {case_id} errored after {attempts} attempt(s): {error}\n")
            return {"reward": None, "rewards": {"agent": None, "attacker": None}, "error": error, "attempts": attempts,
                    "turns": turns, "utility": None, "security": None, "first_reply": first}
        return {"reward": result.rewards["agent"], "rewards": result.rewards, "error": None, "attempts": attempts,
                "turns": turns, "utility": result.record.get("utility"), "security": result.record.get("security"),
                "first_reply": first}


def _handler(service: Service):
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code: int, body: dict) -> None:
            data = json.dumps(body, ensure_ascii=False).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path == "/dataset":
                self._answer(200, service.dataset())
            elif self.path == "/stats":
                with service._lock:
                    self._answer(200, dict(service.stats))
            else:
                self._answer(404, {"error": f"no {self.path}"})

        def do_POST(self):  # noqa: N802
            if self.path != "/rollout":
                return self._answer(404, {"error": f"no {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                args = {k: body[k] for k in ("case", "completion", "model", "base_url")}
                if not all(isinstance(v, str) for v in args.values()):
                    raise ValueError("case, completion, model and base_url must be strings")
                service.env.case(args["case"])
            except (ValueError, KeyError, TypeError, DatasetError) as e:
                return self._answer(400, {"error": f"bad rollout request: {e}"})
            self._answer(200, service.rollout(args["case"], args["completion"], args["model"], args["base_url"]))

        def log_message(self, format, *args):  # noqa: A002 - http.server's signature
            pass

    return Handler


def serve(env, *, port: int, max_turns: int, max_tokens: int, temperature: float, tool_choice: str = "auto") -> None:
    service = Service(env, max_turns=max_turns, max_tokens=max_tokens, temperature=temperature,
                      tool_choice=tool_choice, api_key=os.environ.get("PRUEFSTAND_API_KEY") or None)
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(service))
    server.daemon_threads = True
    url = f"http://127.0.0.1:{server.server_address[1]}"
    sys.stdout.write(json.dumps({"url": url, "manifest": str(env.manifest_path), "cases": len(env.cases)}) + "\n")
    sys.stdout.flush()
    sys.stderr.write(f"[pruefstand_env] serving {len(env.cases)} case(s) on {url}\n")
    # SIGTERM (the binary ends the service with its training) ends it as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    finally:
        sys.stderr.write(f"[pruefstand_env] done: {json.dumps(service.stats)}\n")
