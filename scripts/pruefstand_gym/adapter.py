"""ExternalAgentElement: AgentDojo pipeline element speaking the JSON-line protocol to an
agent subprocess (docs/protocol.md section 1)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.functions_runtime import EmptyEnv, Env, FunctionCall, FunctionsRuntime
from agentdojo.types import ChatAssistantMessage, ChatMessage, get_text_content_as_str, text_content_block_from_string

from . import protocol
from .protocol import ProtocolError


class AgentError(Exception):
    """The case cannot go on because of the agent; str(e) is the record's `error`."""


def _fmt_s(seconds: float) -> str:
    return f"{seconds:g}"


def _load_prctl():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except Exception:  # noqa: BLE001
        return None


# Bound once at import: the agent's preexec runs between fork and exec in a process with
# several threads, where an import (and its lock) could deadlock.
_PRCTL = _load_prctl()


def set_parent_death_signal(sig: int) -> None:
    """Linux: have the kernel send `sig` to this process when its parent dies (so no
    agent or worker outlives a killed gym). No-op elsewhere. For a child started from a
    thread, "parent" is that thread: the gym's slots live as long as their worker."""
    if _PRCTL is not None:
        try:
            _PRCTL(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:  # noqa: BLE001
            pass


def _agent_preexec() -> None:
    set_parent_death_signal(signal.SIGKILL)


# Variables for the agents only (the model's URL and key), added to the environment they
# inherit from us; filled by the runner before the workers fork.
AGENT_ENV: dict[str, str] = {}


# What an agent may write to stderr per case (it lands in gym.log): beyond it the rest
# of that case's output is dropped and counted, so a chatty or hostile agent cannot fill
# the disk (docs/architecture.md, "Limits").
MAX_AGENT_STDERR_PER_CASE = 1 << 20


class StderrRelay:
    """Passes an agent's stderr on to ours, at most `limit` bytes per case; the rest is
    read (the agent never blocks on a full pipe) and counted in one note."""

    def __init__(self, stream, limit: int = MAX_AGENT_STDERR_PER_CASE):
        self.stream = stream
        self.limit = limit
        self.lock = threading.Lock()
        self.passed = 0
        self.dropped = 0
        threading.Thread(target=self._pump, daemon=True).start()

    def new_case(self) -> None:
        with self.lock:
            self._note()
            self.passed = self.dropped = 0

    def _note(self) -> None:
        if self.dropped:
            _write_stderr(f"[gym] agent stderr: {self.dropped} bytes more dropped (over {self.limit} per case)\n".encode())

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self.stream.fileno(), 65536)
            except OSError:
                return
            if not chunk:
                with self.lock:
                    self._note()
                return
            with self.lock:
                room = max(0, self.limit - self.passed)
                if room:
                    _write_stderr(chunk[:room])
                    self.passed += min(room, len(chunk))
                self.dropped += max(0, len(chunk) - room)


def _write_stderr(data: bytes) -> None:
    try:
        sys.stderr.buffer.write(data)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class AgentProcess:
    """One agent subprocess: argv list (no shell), our env plus AGENT_ENV, stderr passed
    on with a limit per case (`StderrRelay`)."""

    def __init__(self, argv: list[str], log_prefix: str = ""):
        self.argv = list(argv)
        self.proc: subprocess.Popen | None = None
        self.buf = bytearray()
        # How far `buf` has been searched for a line's end: a long line arriving in
        # many reads is searched once, not once per read.
        self.scanned = 0
        self.log_prefix = log_prefix
        self.stderr: StderrRelay | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, **AGENT_ENV},
                bufsize=0,
                close_fds=True,
                preexec_fn=_agent_preexec if sys.platform.startswith("linux") else None,
            )
        except OSError as e:
            self.proc = None
            raise AgentError(f"cannot start agent {self.argv[0]!r}: {e}") from None
        self.buf = bytearray()
        self.scanned = 0
        self.stderr = StderrRelay(self.proc.stderr)
        os.set_blocking(self.proc.stdout.fileno(), False)

    def _exit_reason(self) -> str:
        if self.proc is None:
            return "agent stopped"
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "agent closed its stdout"
        if code < 0:
            try:
                return f"agent killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"agent killed by signal {-code}"
        return f"agent exited with status {code}"

    def send(self, message: dict) -> None:
        if not self.alive:
            raise AgentError(self._exit_reason() if self.proc is not None else "agent not running")
        data = protocol.encode(message)
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise AgentError(self._exit_reason()) from None

    def recv_line(self, deadline: float, timeout_s: float) -> bytes:
        """One line from the agent's stdout, waiting at most until `deadline` (monotonic)."""
        assert self.proc is not None
        fd = self.proc.stdout.fileno()
        while True:
            nl = self.buf.find(b"\n", self.scanned)
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[: nl + 1]
                self.scanned = 0
                if line.strip():
                    return line
                continue
            self.scanned = len(self.buf)
            if len(self.buf) > protocol.MAX_LINE_BYTES:
                raise AgentError(f"agent protocol: line longer than {protocol.MAX_LINE_BYTES} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentError(f"timeout after {_fmt_s(timeout_s)} s")
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                if self.buf.strip():
                    line, self.buf = bytes(self.buf), bytearray()
                    return line  # last line without newline
                raise AgentError(self._exit_reason())
            self.buf += chunk

    def kill(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        try:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        """Polite shutdown: close stdin, give it a moment, then kill."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=2)
        except Exception:  # noqa: BLE001
            pass
        self.kill()


def message_to_plain(message: ChatMessage) -> dict:
    """AgentDojo ChatMessage -> {role, content, tool_calls?, tool_call_id?, function?, error?}.

    An assistant message without text (one that only calls tools) keeps `content: null`,
    as AgentDojo's OpenAI element sends it; other messages without content become ""."""
    role = message["role"]
    content = message.get("content")
    text = get_text_content_as_str(content) if content is not None else ""
    out: dict = {"role": role, "content": text}
    if role == "assistant":
        if content is None:
            out["content"] = None
        calls = message.get("tool_calls") or []
        if calls:
            out["tool_calls"] = [{"function": c.function, "args": dict(c.args), "id": c.id} for c in calls]
    elif role == "tool":
        error = message.get("error")
        if error:
            out["content"] = error  # as AgentDojo's OpenAI element shows tool errors
            out["error"] = error  # apart, as its local element dumps it: {"error": ...}
        out["tool_call_id"] = message.get("tool_call_id")
        call = message.get("tool_call")
        out["function"] = call.function if call is not None else None
    return out


class ExternalAgentElement(BasePipelineElement):
    """The LLM slot of the pipeline, played by an external agent process.

    The runner calls `begin_case` / `end_case` around each case; AgentDojo calls `query`
    once per LLM turn. Any protocol violation raises AgentError (the runner records the
    case as an error, kills the agent, and the next case respawns it).
    """

    def __init__(self, argv: list[str], benchmark_version: str, agentdojo_version: str, case_timeout_s: float):
        self.agent = AgentProcess(argv)
        self.benchmark_version = benchmark_version
        self.agentdojo_version = agentdojo_version
        self.case_timeout_s = float(case_timeout_s)
        self.deadline = None
        self.counters = protocol.empty_counters()
        self.case_id = None
        self._schemas: dict = {}
        self.turns = 0
        self.restarts = 0
        self.context_overflow = False
        self.events: list[dict] = []
        # The tools the model was last offered in this case, as OpenAI tool schemas:
        # written into the trace (`pruefstand_tools`) so an export of the conversation
        # carries the schemas a chat template renders (docs/training.md).
        self.tools: list[dict] = []
        # Tool outputs the gym's own detector replaced in this case, and whether the
        # pipeline has one (then every record reports `guardrail_flags`, 0 included).
        self.gym_flags = 0
        self.detector_active = False

    # --- case lifecycle (runner) ---

    def ensure_agent(self) -> None:
        if not self.agent.alive:
            self.agent.kill()
            self.agent.start()
            self.agent.send(protocol.handshake(self.agentdojo_version, self.benchmark_version))

    def begin_case(self, case: dict) -> None:
        self.counters = protocol.empty_counters()
        self.case_id = case["id"]
        self.turns = 0
        self.restarts = 0
        self.context_overflow = False
        self.events = []
        self.tools = []
        self.gym_flags = 0
        self.deadline = time.monotonic() + self.case_timeout_s
        self.ensure_agent()
        if self.agent.stderr is not None:
            self.agent.stderr.new_case()
        self.agent.send(protocol.case_start(case))

    def end_case(self, ok: bool) -> None:
        """After a case: `case_end` when the agent is healthy, else kill it (respawned later)."""
        if ok and self.agent.alive:
            try:
                self.agent.send(protocol.case_end(self.case_id))
                return
            except AgentError:
                pass
        self.agent.kill()

    def shutdown(self) -> None:
        self.agent.close()

    def case_counters(self) -> dict:
        """The case's counters: the agent's last report, plus the flags of the gym's
        detector (cumulative over AgentDojo's re-runs, as the agent's are)."""
        counters = dict(self.counters) if self.counters is not None else protocol.empty_counters()
        if self.detector_active:
            counters["guardrail_flags"] = min((counters.get("guardrail_flags") or 0) + self.gym_flags, protocol.MAX_COUNTER)
        return counters

    def count_gym_flag(self) -> None:
        self.gym_flags += 1

    def note_gym_event(self, kind: str, at: int, detail: str) -> None:
        """An event of the gym's own defences, for the trace (`pruefstand_events`)."""
        self.events.append({"kind": kind, "at": at, "detail": detail[: protocol.MAX_EVENT_DETAIL_CHARS]})

    # --- AgentDojo ---

    def _tools(self, runtime: FunctionsRuntime) -> list[dict]:
        key = tuple(id(f) for f in runtime.functions.values())
        tools = self._schemas.get(key)
        if tools is None:
            tools = [
                {"name": name, "description": f.description, "parameters_schema": f.parameters.model_json_schema()}
                for name, f in runtime.functions.items()
            ]
            self._schemas[key] = tools
        return tools

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        reply = self._exchange(query, runtime, messages)
        if reply.final_answer is not None:
            out = ChatAssistantMessage(
                role="assistant", content=[text_content_block_from_string(reply.final_answer)], tool_calls=None
            )
        else:
            calls = []
            for i, c in enumerate(reply.tool_calls):
                try:
                    calls.append(
                        FunctionCall(function=c["function"], args=c["args"], id=c["id"] or f"call_{self.turns}_{i}")
                    )
                except Exception as e:  # noqa: BLE001 - pydantic validation
                    raise AgentError(f"agent protocol: tool_calls[{i}] rejected: {e}") from None
            # The model's text beside its calls, as AgentDojo's own LLM elements keep it.
            # Without it the last turn of a case cut by the tool loop's limit has no
            # output, and AgentDojo re-runs the whole task (counted as `restarts`).
            content = [text_content_block_from_string(reply.content)] if reply.content is not None else None
            out = ChatAssistantMessage(role="assistant", content=content, tool_calls=calls)
        return query, runtime, env, [*messages, out], extra_args

    def name_tools(self, query: str, runtime: FunctionsRuntime, messages: Sequence[ChatMessage]) -> str | None:
        """The tool filter's call (`defences.ToolFilter`): the conversation so far, ending
        in the filter's prompt, as a query with `tool_choice: "none"`; the model's text
        is the answer (an agent that called tools anyway: the text beside its calls)."""
        reply = self._exchange(query, runtime, messages, tool_choice="none")
        return reply.final_answer if reply.final_answer is not None else reply.content

    def _exchange(self, query: str, runtime: FunctionsRuntime, messages: Sequence[ChatMessage], **extra) -> protocol.Reply:
        """One query to the agent and its validated reply; stats and events kept."""
        if self.deadline is None:
            raise AgentError("internal: query outside a case")
        if not self.agent.alive:
            raise AgentError("agent is not running")
        # A query that starts the conversation again within a case: AgentDojo found no
        # model output and re-runs the task in the same, already changed environment.
        if self.turns > 0 and not any(m["role"] == "assistant" for m in messages):
            self.restarts += 1
            # The trace keeps only the last try: the events of earlier ones are gone too.
            self.events = [{"kind": "restart", "at": 0,
                            "detail": f"AgentDojo found no model output and ran the task again (try {self.restarts + 1})"}]
        tools = self._tools(runtime)
        self.tools = openai_tools(tools)
        request = protocol.query(query, tools, [message_to_plain(m) for m in messages], **extra)
        self.agent.send(request)
        line = self.agent.recv_line(self.deadline, self.case_timeout_s)
        self.turns += 1
        try:
            reply = protocol.decode_reply(line)
        except protocol.ContextOverflow as e:
            self.counters = protocol.merge_stats(self.counters, e.stats)
            self._note(e.events, len(messages))
            self._note([{"kind": "context_overflow", "detail": str(e)}], len(messages))
            self.context_overflow = True
            # AgentDojo's own rule scores it: the error its OpenAI client would raise.
            raise context_length_error(str(e)) from None
        except protocol.AgentReportedError as e:
            self.counters = protocol.merge_stats(self.counters, e.stats)
            self._note(e.events, len(messages))
            raise AgentError(str(e)) from None
        except ProtocolError as e:
            raise AgentError(str(e)) from None
        self.counters = protocol.merge_stats(self.counters, reply.stats)
        self._note(reply.events, len(messages))
        return reply

    def _note(self, events: list[dict], messages: int) -> None:
        """Keeps a reply's events for the case's trace (`pruefstand_events`), each placed
        after `at` messages of the conversation (at most all of them; by default where
        the reply's own message goes)."""
        for event in events:
            self.events.append({**event, "at": min(event.get("at", messages), messages)})


def openai_tools(tools: list[dict]) -> list[dict]:
    """The protocol's tool list (`name`, `description`, `parameters_schema`) as OpenAI
    tool schemas, the shape chat templates and trainers take."""
    return [
        {"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["parameters_schema"]}}
        for t in tools
    ]


def context_length_error(message: str) -> Exception:
    """The `openai.BadRequestError` a server's context-length refusal raises, which
    AgentDojo's benchmark scores as utility false and the injection landed."""
    import httpx
    import openai

    request = httpx.Request("POST", "http://model-server/v1/chat/completions")
    body = {"message": message, "type": "BadRequestError", "param": None, "code": "context_length_exceeded"}
    return openai.BadRequestError(message, response=httpx.Response(400, request=request), body=body)


def log(msg: str) -> None:
    sys.stderr.write(f"[gym] {msg}\n")
    sys.stderr.flush()
