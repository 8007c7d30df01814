"""Rollouts: one case of the dataset run through the gym's own case runner, in this
process, with the policy as the agent; its record, trace, conversation and rewards.

The path is a bench run's (scripts/pruefstand_gym/runner.py): the same AgentDojo
pipeline (`dojo.build_pipeline`), the same attack objects placing the injection where
the bench places it (`fresh_<family>` wording and found templates registered from the
dataset, `families.install_safe_injection`), the same `runner._run_case` — AgentDojo
executes the tools and scores utility and security — and the same record. What differs
is where it runs: on a thread of the caller's process instead of a forked worker of
`gym.py run`, each rollout in a folder of its own (so the same case may run many times
at once, as a GRPO group needs), and the agent:

- `EndpointPolicy`: `pruefstand agent` against an OpenAI-compatible server (vLLM with
  the policy's LoRA, the simulator) — exactly the bench's agent, its prompts, parsing
  and counters;
- `CallbackPolicy`: a Python function given each turn's `query` (docs/protocol.md §1)
  that returns the protocol's reply; `chat_policy` wraps a function of OpenAI chat
  messages and tools;
- `Episode`: the same, turned inside out for a trainer that generates the turns itself
  (a verifiers-style `env_response` loop): the case runs on its own thread and waits
  for each reply.

A rollout that errors (the agent failed, the policy raised, the server was down) is
retried up to `retries` times and then returned as an error with no reward, never as a
reward of 0; the environment counts both. The gym's state (AgentDojo's attack registry,
the wording) is process-wide: one `Gym` per process.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import queue
import shutil
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import rubric
from .dataset import Dataset, pruefstand_binary


class RolloutError(Exception):
    """A rollout could not be made at all (bad input, the gym not usable)."""


def steered_jobs(run: str, *, root: str | None = None, pruefstand: str | None = None) -> int:
    """The concurrency the bench's steering reached in `run` (a run directory, or a
    version name: its newest run), read through the binary (`pruefstand show`): the most
    cases `pruefstand run` kept in flight against that server (`peak_in_flight`), steered
    by its `/metrics` gauges or its latency. Not `settled` (the median target of the
    second half of the decisions taken while cases still waited to start), which a run
    shorter than its ramp leaves at its start. Rollouts against the same server take it
    as their `jobs`, so a trainer's rollouts go at the pace the bench found for it."""
    import subprocess

    argv = [pruefstand_binary(pruefstand)] + (["--root", str(root)] if root else []) + ["show", str(run)]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise RolloutError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    try:
        concurrency = (json.loads(done.stdout).get("run") or {}).get("concurrency") or {}
    except ValueError as e:
        raise RolloutError(f"{' '.join(argv)}: its output is no run: {e}") from None
    peak = concurrency.get("peak_in_flight")
    if not isinstance(peak, int) or peak < 1:
        raise RolloutError(f"run {run}: it records no concurrency reached ({concurrency or 'none'})")
    return peak


# --- policies ---------------------------------------------------------------------------


class EndpointPolicy:
    """The bench's own agent (`pruefstand agent --config FILE`) against an
    OpenAI-compatible server. `agent_config` adds or overrides fields of the agent's
    config (crates/agent's AgentConfig: `tool_calling`, `max_tokens`, `temperature`, …;
    a run's `agent.json` can be given whole with `from_agent_json`). The key, when the
    server wants one, reaches the agents by environment only (PRUEFSTAND_API_KEY)."""

    def __init__(self, base_url: str, model: str, *, tool_calling: str = "native", api_key: str | None = None,
                 agent_config: dict | None = None, pruefstand: str | None = None):
        if tool_calling not in ("native", "prompted"):
            raise RolloutError(f"tool_calling {tool_calling!r}: native or prompted")
        self.config = {"base_url": base_url, "model": model, "tool_calling": tool_calling, **(agent_config or {})}
        self.config["base_url"] = base_url
        self.api_key = api_key
        self.binary = pruefstand_binary(pruefstand)
        self._path: Path | None = None

    @classmethod
    def from_agent_json(cls, path, *, base_url: str, api_key: str | None = None, pruefstand: str | None = None):
        """A run's `agent.json` (the bench's agent as that run configured it), pointed at
        `base_url`."""
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        config.pop("base_url_env", None)
        return cls(base_url, config["model"], tool_calling=config.get("tool_calling", "native"), api_key=api_key,
                   agent_config=config, pruefstand=pruefstand)

    def prepare(self, out_dir: Path) -> None:
        from pruefstand_gym.adapter import AGENT_ENV

        text = json.dumps(self.config, sort_keys=True, indent=2)
        self._path = out_dir / f"agent-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"
        self._path.write_text(text + "\n", encoding="utf-8")
        if self.api_key:
            AGENT_ENV["PRUEFSTAND_API_KEY"] = self.api_key

    def element(self, benchmark_version: str, agentdojo_version: str, timeout_s: float):
        from pruefstand_gym.adapter import ExternalAgentElement

        if self._path is None:
            raise RolloutError("EndpointPolicy: not prepared (the environment prepares it)")
        argv = [self.binary, "agent", "--config", str(self._path)]
        return ExternalAgentElement(argv, benchmark_version, agentdojo_version, timeout_s)


class _CallbackAgent:
    """Stands where `adapter.AgentProcess` stands: `send` keeps the query, `recv_line`
    answers it with the callback's reply, encoded as an agent would write it. What the
    callback raises ends the case as an agent error (the record's `error`)."""

    def __init__(self, respond):
        self.respond = respond
        self.pending = None
        self.stderr = None
        self.proc = None

    alive = True

    def start(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def close(self) -> None:
        pass

    def send(self, message: dict) -> None:
        if message.get("type") == "query":
            self.pending = message

    def recv_line(self, deadline: float, timeout_s: float) -> bytes:
        from pruefstand_gym.adapter import AgentError

        query, self.pending = self.pending, None
        if query is None:
            raise AgentError("policy: no query to answer")
        try:
            reply = self.respond(query)
        except Exception as e:  # noqa: BLE001 - the policy's failure is the case's error
            raise AgentError(f"policy raised {type(e).__name__}: {e}") from None
        if time.monotonic() > deadline:
            raise AgentError(f"timeout after {timeout_s:g} s")
        if not isinstance(reply, dict):
            raise AgentError(f"policy: a reply must be a dict (docs/protocol.md §1), got {type(reply).__name__}")
        return json.dumps(reply, ensure_ascii=False).encode("utf-8")


class CallbackPolicy:
    """A Python function as the agent: `respond(query) -> reply`, where `query` is the
    protocol's `query` message (`prompt`, `tools`, `messages`) and the reply is one of
    its answers: {"tool_calls": [{"function", "args", "id"}], "content"?},
    {"final_answer": text}, {"error": reason}; optional `stats`."""

    def __init__(self, respond):
        self.respond = respond

    def prepare(self, out_dir: Path) -> None:
        pass

    def element(self, benchmark_version: str, agentdojo_version: str, timeout_s: float):
        from pruefstand_gym.adapter import ExternalAgentElement

        element = ExternalAgentElement(["<policy callback>"], benchmark_version, agentdojo_version, timeout_s)
        element.agent = _CallbackAgent(self.respond)
        return element


# --- OpenAI chat format -----------------------------------------------------------------


def openai_messages(query: dict) -> list[dict]:
    """A protocol query's messages in OpenAI's chat format (native tool calling):
    arguments as JSON text, a tool's error as its content."""
    out = []
    for m in query["messages"]:
        role = m["role"]
        if role == "assistant":
            msg = {"role": "assistant", "content": m.get("content")}
            if m.get("tool_calls"):
                msg["tool_calls"] = [
                    {"id": c.get("id") or f"call_{i}", "type": "function",
                     "function": {"name": c["function"], "arguments": json.dumps(c.get("args") or {})}}
                    for i, c in enumerate(m["tool_calls"])
                ]
            out.append(msg)
        elif role == "tool":
            out.append({"role": "tool", "tool_call_id": m.get("tool_call_id"), "content": m.get("content") or ""})
        else:
            out.append({"role": role, "content": m.get("content") or ""})
    return out


def openai_tools(query: dict) -> list[dict]:
    from pruefstand_gym.adapter import openai_tools as convert

    return convert(query["tools"])


def strip_think(text: str) -> str:
    """`<think>…</think>` blocks removed, and everything before a closing tag without
    its opening one (crates/agent's format::strip_think)."""
    out, rest = [], text
    while "<think>" in rest:
        open_at = rest.index("<think>")
        out.append(rest[:open_at])
        close = rest.find("</think>", open_at)
        rest = rest[close + len("</think>"):] if close >= 0 else ""
    joined = "".join(out) + rest
    close = joined.find("</think>")
    return joined[close + len("</think>"):] if close >= 0 else joined


def reply_of(message: dict) -> dict:
    """An OpenAI assistant message as the protocol's reply, read as `pruefstand agent`'s
    native mode reads it (crates/agent's format::parse_native): reasoning stripped, the
    text beside the calls kept (an empty string too: without it AgentDojo re-runs a task
    cut at its tool-loop limit), no calls → the text trimmed is the final answer, null
    or empty arguments → {}. One difference: a call whose arguments are not a JSON
    object (or that has no name) makes the text the final answer, where the bench's
    agent answers the model with an error and asks again."""
    content = message.get("content")
    content = strip_think(content) if isinstance(content, str) else None
    calls = message.get("tool_calls") or []
    if not calls:
        return {"final_answer": (content or "").strip()}
    out = []
    for i, c in enumerate(calls):
        function = c.get("function") or {}
        name = (function.get("name") or "").strip()
        arguments = function.get("arguments")
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            args = {}
        elif isinstance(arguments, str):
            try:
                args = json.loads(arguments)
            except ValueError:
                args = None
        else:
            args = arguments
        if not isinstance(args, dict) or not name:
            return {"final_answer": (content or "").strip(), "stats": {"malformed_outputs": 1}}
        out.append({"function": name, "args": args, "id": c.get("id") or f"call_{i}"})
    reply = {"tool_calls": out}
    if content is not None:
        reply["content"] = content
    return reply


def chat_policy(complete) -> CallbackPolicy:
    """A policy from `complete(messages, tools) -> assistant message` in OpenAI's chat
    format (a trainer's own generation, or an OpenAI client's
    `choices[0].message` as a dict)."""

    def respond(query: dict) -> dict:
        return reply_of(complete(openai_messages(query), openai_tools(query)))

    return CallbackPolicy(respond)


def conversation(trace: dict | None) -> list[dict]:
    """A trace's messages as OpenAI chat messages, as an export's rows carry them
    (docs/training.md): assistant `arguments` as objects, a failed tool's error as its
    content."""
    out = []
    for m in (trace or {}).get("messages") or []:
        role = m.get("role")
        text = rubric.message_text(m.get("content"))
        if role == "assistant":
            msg = {"role": "assistant", "content": text}
            calls = m.get("tool_calls") or []
            if calls:
                msg["tool_calls"] = [
                    {"id": c.get("id") or f"call_{i}", "type": "function",
                     "function": {"name": c.get("function"), "arguments": c.get("args") or {}}}
                    for i, c in enumerate(calls)
                ]
            out.append(msg)
        elif role == "tool":
            call = m.get("tool_call") or {}
            out.append({"role": "tool", "tool_call_id": m.get("tool_call_id"), "name": call.get("function"),
                        "content": m.get("error") or text})
        else:
            out.append({"role": role, "content": text})
    return out


# --- the gym in this process ------------------------------------------------------------


@dataclass
class Rollout:
    """One finished rollout. `error` set: no reward (rewards None), after `attempts` tries."""

    case: dict
    record: dict
    trace: dict | None
    rewards: dict
    feedback: dict | None
    attempts: int
    dir: str
    conversation: list = field(default_factory=list)

    @property
    def error(self) -> str | None:
        return self.record.get("error")

    def as_json(self) -> dict:
        return {"case": self.case, "record": self.record, "rewards": self.rewards, "feedback": self.feedback,
                "attempts": self.attempts, "dir": self.dir}


_GYM_LOCK = threading.Lock()
_GYM_OWNER: dict = {}


class Gym:
    """The gym's runner in this process for one dataset: AgentDojo's suites loaded once,
    the dataset's wording and templates registered, one attack object per (suite,
    attack) shared by every rollout (its injection candidates computed once per user
    task), rollouts on the caller's threads."""

    def __init__(self, dataset: Dataset, out_dir: Path, *, weights: rubric.Weights = rubric.Weights(),
                 defence: str | None = None, display_name: str = "Local model", case_timeout_s: float | None = None):
        from importlib.metadata import version

        from custom_suites import payload_bank
        from pruefstand_gym import dojo, families, runner

        with _GYM_LOCK:
            owner = _GYM_OWNER.get("key")
            key = (dataset.plan_hash, dataset.seed)
            if owner is not None and owner != key:
                raise RolloutError(
                    "one environment per process: AgentDojo's attack registry and the wording are process-wide "
                    f"(this process holds plan hash {owner[0][:12]}… seed {owner[1]})"
                )
            _GYM_OWNER["key"] = key
        if defence is not None and defence not in ("spotlighting_with_delimiting", "repeat_user_prompt", "tool_filter"):
            raise RolloutError(f"defence {defence!r}: null, spotlighting_with_delimiting, repeat_user_prompt or tool_filter")
        dojo.check_api()
        dojo.prepare()
        worded = dataset.wording.keys() | dataset.templates.keys()
        families.register_wording_attacks({c["attack"] for c in dataset.cases if c["id"] in worded})
        families.set_wording(dataset.seed, dataset.wording, dataset.templates)
        families.install_safe_injection()
        payload_bank.set_run_seed(dataset.seed)
        suites = dojo.get_suites_checked(dataset.benchmark_version)
        runner.validate_names({"cases": dataset.cases, "benchmark_version": dataset.benchmark_version}, suites)
        if dojo.enable_fast_yaml() and dojo.verify_fast_yaml([suites[s] for s in sorted({c["suite"] for c in dataset.cases})]):
            dojo.disable_fast_yaml()
        self.dataset = dataset
        self.weights = weights
        self.suites = suites
        self.out_dir = Path(out_dir)
        self.benchmark_version = dataset.benchmark_version
        self.agentdojo_version = version("agentdojo")
        self.timeout_s = float(case_timeout_s or dataset.case_timeout_s)
        self.req = {
            "run_dir": str(self.out_dir),
            "benchmark_version": dataset.benchmark_version,
            "defence": defence,
            "detector": None,
            "model_display_name": display_name,
            "case_timeout_s": self.timeout_s,
            "seed": dataset.seed,
        }
        self.shared = runner._Shared(0, self.req, suites, None)
        self._counter = itertools.count()
        self._truth: dict = {}
        self._truth_lock = threading.Lock()
        self.stats = {"rollouts": 0, "errors": 0, "retried": 0, "seconds": 0.0}
        self._stats_lock = threading.Lock()
        # Cases of an attacker's templates (players.py), beside the dataset's.
        self._template_cases: dict = {}
        self._log_lock = threading.Lock()

    def add_template_case(self, case: dict, text: str) -> None:
        """An attacked case whose injection is an attacker's template (players.py): the
        text keyed by the case id and its attack registered, as the gym's open pass adds
        an adaptive attempt (`families.add_text`); then `rollout` takes the case."""
        from pruefstand_gym import families, runner

        families.register_wording_attacks({case["attack"]})
        try:
            runner.validate_names({"cases": [case], "benchmark_version": self.benchmark_version}, self.suites)
        except runner.RequestError as e:
            raise RolloutError(str(e)) from None
        families.add_text(case["id"], None, text)
        self._template_cases[case["id"]] = dict(case)

    # ground truth the attacker's feedback compares with (as `gym.py truth` computes it)
    def _calls(self, suite_name: str, task_id: str, injection: bool) -> list[dict]:
        from pruefstand_gym import dojo

        key = (suite_name, task_id, injection)
        with self._truth_lock:
            if key not in self._truth:
                suite = self.suites[suite_name]
                env = dojo.default_env(suite)
                if injection:
                    task = suite.get_injection_task_by_id(task_id)
                    self._truth[key] = dojo.calls_of(task, env.model_copy(deep=True))
                else:
                    task = suite.get_user_task_by_id(task_id)
                    self._truth[key] = dojo.calls_of(task, task.init_environment(env.model_copy(deep=True)))
            return self._truth[key]

    def _run_once(self, case: dict, policy, attempt: int) -> tuple[dict, dict | None, Path]:
        from agentdojo.logging import LOGGER_STACK, OutputLogger

        from pruefstand_gym import dojo, runner
        from pruefstand_gym.records import TRACES_DIR

        n = next(self._counter)
        rollout_dir = self.out_dir / "rollouts" / f"{n:06d}"
        rollout_dir.mkdir(parents=True, exist_ok=False)
        view = _View(self.shared, dict(self.req, run_dir=str(rollout_dir)))
        element = policy.element(self.benchmark_version, self.agentdojo_version, self.timeout_s)
        try:
            pipeline = dojo.build_pipeline(element, self.req["defence"], self.req["model_display_name"], None)
            # AgentDojo's logger stack is one list for every thread unless set: this
            # thread's own, then this rollout's OutputLogger (runner._Slot does the same).
            LOGGER_STACK.set([])
            with OutputLogger(str(rollout_dir / TRACES_DIR)):
                record = runner._run_case(dict(case), element, pipeline, view)
        finally:
            element.shutdown()
        trace = rubric.read_trace(rollout_dir / record["trace"]) if record.get("trace") else None
        return record, trace, rollout_dir

    def rollout(self, case: dict, policy, *, retries: int = 1) -> Rollout:
        """One case run through the gym with `policy` as the agent, retried up to
        `retries` times when it errors; a last error is returned as such (no reward)."""
        if case["id"] not in self._template_cases and case["id"] not in {c["id"] for c in self.dataset.cases}:
            raise RolloutError(f"case {case['id']!r} is not in the environment's dataset")
        t0 = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                record, trace, rollout_dir = self._run_once(case, policy, attempt)
            except Exception as e:  # noqa: BLE001 - the gym itself failed on this case: an error
                record = {"case_id": case["id"], "kind": case["kind"], "utility": None, "security": None,
                          "outcome": "error", "error": f"{type(e).__name__}: {e}"}
                trace, rollout_dir = None, self.out_dir
                _log(f"rollout of {case['id']} raised:\n{traceback.format_exc()}")
            if record.get("error") is None or attempt > retries:
                break
            with self._stats_lock:
                self.stats["retried"] += 1
        result = self._finish(case, record, trace, rollout_dir, attempt)
        with self._stats_lock:
            self.stats["rollouts"] += 1
            self.stats["errors"] += 1 if result.error is not None else 0
            self.stats["seconds"] += time.monotonic() - t0
        self._append(result)
        return result

    def _finish(self, case, record, trace, rollout_dir, attempts) -> Rollout:
        fb = None
        if record.get("error") is None and case["kind"] == "attacked" and trace is not None:
            goal = self.suites[case["suite"]].get_injection_task_by_id(case["injection_task"]).GOAL
            fb = rubric.feedback(
                trace,
                bool(record.get("security")),
                goal,
                self._calls(case["suite"], case["injection_task"], True),
                self._calls(case["suite"], case["user_task"], False),
            )
        rewards = {
            "agent": rubric.agent_reward(record, self.weights),
            "attacker": rubric.attacker_reward(record, fb),
        }
        return Rollout(case=dict(case), record=record, trace=trace, rewards=rewards, feedback=fb,
                       attempts=attempts, dir=str(rollout_dir), conversation=conversation(trace))

    def _append(self, result: Rollout) -> None:
        """`rollouts.jsonl`: every finished rollout, errors included, one a line."""
        line = json.dumps(result.as_json(), ensure_ascii=False, sort_keys=True) + "\n"
        with self._log_lock, open(self.out_dir / "rollouts.jsonl", "a", encoding="utf-8") as f:
            f.write(line)

    def rollouts(self, cases: list[dict], policy, *, jobs: int = 4, retries: int = 1) -> list[Rollout]:
        """Many rollouts, `jobs` in flight (threads: they overlap where a case waits on the
        model; AgentDojo's own work holds the GIL), in the order given."""
        if jobs < 1:
            raise RolloutError(f"jobs {jobs!r}: at least 1")
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(lambda c: self.rollout(c, policy, retries=retries), cases))

    def remove_traces(self, result: Rollout) -> None:
        """A rollout's folder removed (a trainer that keeps only `rollouts.jsonl`)."""
        if Path(result.dir).parent == self.out_dir / "rollouts":
            shutil.rmtree(result.dir, ignore_errors=True)


class _View:
    """What `runner._run_case` reads of a worker's shared state, with this rollout's own
    run directory: the request, the suites, the shared attack objects."""

    def __init__(self, shared, req: dict):
        self._shared = shared
        self.req = req
        self.suites = shared.suites
        self.index = 0

    def attack_for(self, case, pipeline, task):
        return self._shared.attack_for(case, pipeline, task)


def _log(msg: str) -> None:
    import sys

    sys.stderr.write(f"[pruefstand_env] {msg}\n")
    sys.stderr.flush()


# --- an episode the trainer steps ---------------------------------------------------------

_ABANDON = object()


class Episode:
    """One rollout whose turns the caller produces: `start()` gives the first query (the
    protocol's `query`: `messages`, `tools`), `step(reply)` hands back the policy's
    reply and gives the next query, or None when the case has ended — then `result`
    holds the `Rollout`. The case runs on its own thread through the same path as
    `Gym.rollout` (no retries: the caller made the turns)."""

    def __init__(self, gym: Gym, case: dict, *, wait_s: float | None = None):
        self.gym = gym
        self.case = case
        self.wait_s = wait_s if wait_s is not None else gym.timeout_s + 60
        self.result: Rollout | None = None
        self.query: dict | None = None
        self._events: queue.Queue = queue.Queue()
        self._replies: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _respond(self, query: dict) -> dict:
        self._events.put(("query", query))
        reply = self._replies.get()
        if reply is _ABANDON:
            raise RolloutError("the episode was abandoned")
        return reply

    def _run(self) -> None:
        try:
            result = self.gym.rollout(self.case, CallbackPolicy(self._respond), retries=0)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self._events.put(("failed", e))
            return
        self._events.put(("done", result))

    def _next(self) -> dict | None:
        try:
            kind, payload = self._events.get(timeout=self.wait_s)
        except queue.Empty:
            raise RolloutError(f"case {self.case['id']}: no turn or end within {self.wait_s:g} s") from None
        if kind == "failed":
            raise payload
        if kind == "done":
            self.result, self.query = payload, None
            return None
        self.query = payload
        return payload

    def start(self) -> dict | None:
        self._thread.start()
        return self._next()

    def step(self, reply: dict) -> dict | None:
        if self.query is None:
            raise RolloutError("step() without a query waiting (the episode has ended or not started)")
        self._replies.put(reply)
        return self._next()

    def abandon(self) -> None:
        """Ends a case whose turns will not come: it is recorded as an error."""
        if self.query is not None:
            self._replies.put(_ABANDON)
            self._next()

    @property
    def done(self) -> bool:
        return self.result is not None


def tool_messages_after(query: dict, seen: int) -> list[dict]:
    """The OpenAI messages of `query` from index `seen` on that are not the assistant's
    own (what the environment answered: tool results)."""
    return [m for m in openai_messages(query)[seen:] if m["role"] != "assistant"]
