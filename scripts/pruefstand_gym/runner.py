"""`gym.py run --request FILE`: validate, resume, environment check, N worker processes.

Only the parent writes to stdout (one JSON event per line, flushed). Each worker owns one
agent subprocess, takes cases from a queue and sends results back. Two traps of
AgentDojo 0.1.35 are avoided: `benchmark_suite_with_injections` per shard re-runs the
injection tasks in every shard, which then write the same trace files at once (so here
one case = one `run_task_*` call with force_rerun=True); and the logger stack is one
process-wide list (so each worker enters its own OutputLogger on a fresh stack).
"""

from __future__ import annotations

import atexit
import gc
import json
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from . import families, schema, spans
from .records import TRACES_DIR, RequestError, make_record, read_trace_status, trace_relpath, write_json_atomic


def emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def log(msg: str) -> None:
    sys.stderr.write(f"[gym] {msg}\n")
    sys.stderr.flush()


# The most cases in flight one gym accepts (each holds an agent process and a thread).
MAX_IN_FLIGHT = schema.max_in_flight()

# --- request validation -----------------------------------------------------------------


def load_request(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            req = json.load(f)
    except OSError as e:
        raise RequestError(f"cannot read request {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise RequestError(f"request {path} is not valid JSON: {e}") from None
    if not isinstance(req, dict):
        raise RequestError(f"request {path}: top level must be an object")
    return req


def validate_request(req: dict) -> dict:
    """The request checked against its schema, generated from pruefstand's `GymRequest`
    (schemas/gym-request.schema.json: every field's presence, type and range, refused
    naming the field), then what a schema cannot say: an absolute run_dir, a non-empty
    argv, a positive timeout, a known defence and its detector, each case's fields for
    its kind, no case twice, an order of every case. Returns it normalised."""
    from .records import check_case_shape

    found = schema.problems(req, schema.load("gym-request"))
    if found:
        raise RequestError("request: " + "; ".join(found))
    run_dir = req["run_dir"]
    if not os.path.isabs(run_dir):
        raise RequestError(f"request: `run_dir` must be absolute, got {run_dir!r}")
    argv = req["agent_cmd"]
    if not argv or not all(argv):
        raise RequestError("request: `agent_cmd` must be a non-empty list of non-empty strings (argv, no shell)")
    timeout = req["case_timeout_s"]
    if timeout <= 0:
        raise RequestError(f"request: `case_timeout_s` must be a positive number, got {timeout!r}")
    defence = req.get("defence")
    from .dojo import DEFENCES  # light: dojo imports yaml only at module level

    if defence is not None and defence not in DEFENCES:
        raise RequestError(f"request: unknown defence {defence!r}; valid: null, {', '.join(DEFENCES)}")
    detector = check_detector(req.get("detector"), defence)
    cases = [check_case_shape(i, c) for i, c in enumerate(req["cases"])]
    seen_ids, seen_keys = set(), {}
    for c in cases:
        if c["id"] in seen_ids:
            raise RequestError(f"request: duplicate case id {c['id']!r}")
        seen_ids.add(c["id"])
        key = trace_relpath(c, defence)
        if key in seen_keys:
            raise RequestError(f"request: cases {seen_keys[key]!r} and {c['id']!r} are the same episode")
        seen_keys[key] = c["id"]
    try:
        wording = families.check_wording(req["wording"])
        templates = families.check_templates(req.get("templates") or {})
    except ValueError as e:
        raise RequestError(f"request: {e}") from None
    order = req.get("order")
    if order is not None and sorted(order) != sorted(seen_ids):
        raise RequestError("request: `order` must list every case id exactly once")
    return {
        "run_dir": run_dir,
        "benchmark_version": req["benchmark_version"],
        "jobs": req["jobs"],
        "max_in_flight": req["max_in_flight"],
        "agent_cmd": argv,
        "model_display_name": req["model_display_name"] or "Local model",
        "case_timeout_s": float(timeout),
        "seed": req["seed"],
        "defence": defence,
        "detector": detector,
        "cases": cases,
        "done": req["done"],
        "order": order,
        "wording": wording,
        "templates": templates,
        "open": req.get("open"),
    }


def check_detector(detector, defence: str | None) -> dict | None:
    """The classifier endpoint of `pi_detector` (its fields' types are the schema's
    `DetectorRequest`), required by that defence and refused with any other."""
    if defence != "pi_detector":
        if detector is not None:
            raise RequestError(f"request: `detector` is only for defence pi_detector, not {defence!r}")
        return None
    if detector is None:
        raise RequestError("request: defence pi_detector needs `detector` (url, model, safe_label, threshold, timeout_s)")
    low, high = 1e-3, 600.0
    if not low <= detector["timeout_s"] <= high:
        raise RequestError(f"request: detector.timeout_s must be a number in [{low:g}, {high:g}], got {detector['timeout_s']!r}")
    if not detector["url"].startswith(("http://", "https://")):
        raise RequestError(f"request: detector.url must be an http(s) URL, got {detector['url']!r}")
    return dict(detector)


def validate_names(req: dict, suites: dict) -> None:
    """Suite / task / attack names against the installed agentdojo (+ custom suites)."""
    from .dojo import attack_names, is_dos, sorted_tasks

    attacks = attack_names()
    for c in req["cases"]:
        where = f"case {c['id']!r}"
        if c["suite"] not in suites:
            raise RequestError(
                f"{where}: unknown suite {c['suite']!r} in {req['benchmark_version']}; valid: {', '.join(sorted(suites))}"
            )
        suite = suites[c["suite"]]
        if c["user_task"] is not None and c["user_task"] not in suite.user_tasks:
            raise RequestError(
                f"{where}: unknown user task {c['user_task']!r} in {c['suite']} {req['benchmark_version']}; "
                f"valid: {', '.join(sorted_tasks(suite.user_tasks))}"
            )
        if c["injection_task"] is not None and c["injection_task"] not in suite.injection_tasks:
            raise RequestError(
                f"{where}: unknown injection task {c['injection_task']!r} in {c['suite']} {req['benchmark_version']}; "
                f"valid: {', '.join(sorted_tasks(suite.injection_tasks))}"
            )
        if c["attack"] is not None:
            if c["attack"] not in attacks or c["attack"] == "none":
                raise RequestError(
                    f"{where}: unknown attack {c['attack']!r}; valid: {', '.join(a for a in attacks if a != 'none')} "
                    "(a case without attack is kind clean)"
                )
            if is_dos(c["attack"]):
                first = next(iter(suite.injection_tasks))
                if c["injection_task"] != first:
                    raise RequestError(
                        f"{where}: {c['attack']} is a DoS attack; AgentDojo runs it with the suite's first "
                        f"injection task only, so the case must name {first!r}"
                    )


# --- worker -----------------------------------------------------------------------------
#
# A worker process runs several cases at once, one thread each ("slot"): a thread costs
# a few MiB where a process costs ~80 MiB, and threads overlap exactly where a case
# waits — on the model, through its agent. The framework's own work holds the GIL, so
# the CPU-bound part scales with processes, not threads.


class _Shared:
    """What a worker's slots share: the suites, the attacks (their injection-candidate
    cache is the expensive part, so one per worker, built once under a lock) and the
    idle slots."""

    def __init__(self, index, req, suites, result_q):
        self.index = index
        self.req = req
        self.suites = suites
        self.result_q = result_q
        self.lock = threading.Lock()
        self.attacks: dict = {}
        self.warm: dict = {}
        self.idle: list = []
        self.slots: list = []
        self.failed = threading.Event()

    def attack_for(self, case, pipeline, task):
        """The (suite, attack) attack object, its injection candidates for the user task
        computed once per worker: threads would otherwise each run the ground truth with
        canaries for the same task at once (lru_cache does not serialise)."""
        from . import dojo

        key = (case["suite"], case["attack"])
        with self.lock:
            attack = self.attacks.get(key)
            if attack is None:
                attack = self.attacks[key] = dojo.make_attack(case["attack"], self.suites[case["suite"]], pipeline)
            warm = self.warm.setdefault((key, case["user_task"]), threading.Lock())
        with warm:
            try:
                attack.get_injection_candidates(task)
            except Exception:  # noqa: BLE001 - not cached: the case's own call raises it again
                pass
        return attack


class _Slot(threading.Thread):
    """One in-flight case at a time: its own agent, pipeline and logger stack."""

    def __init__(self, shared: _Shared):
        super().__init__(daemon=True)
        self.shared = shared
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.element = None

    def run(self) -> None:
        from importlib.metadata import version

        from agentdojo.logging import LOGGER_STACK, OutputLogger

        from . import dojo
        from .adapter import ExternalAgentElement

        sh, req = self.shared, self.shared.req
        try:
            self.element = ExternalAgentElement(
                req["agent_cmd"], req["benchmark_version"], version("agentdojo"), req["case_timeout_s"]
            )
            pipeline = dojo.build_pipeline(
                self.element, req["defence"], req["model_display_name"], req.get("detector")
            )
            # The logger stack is a ContextVar never .set(): every thread would share its
            # default list. A fresh one per thread, then this thread's own OutputLogger.
            LOGGER_STACK.set([])
            with OutputLogger(str(Path(req["run_dir"]) / TRACES_DIR)):
                while True:
                    case = self.inbox.get()
                    if case is None:
                        return
                    record = _run_case(case, self.element, pipeline, sh)
                    with sh.lock:
                        sh.idle.append(self)  # idle before the parent hears of the record
                    sh.result_q.put(("record", sh.index, record))
        except BaseException as e:  # noqa: BLE001
            sh.result_q.put(("fatal", sh.index, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
            sh.failed.set()
        finally:
            if self.element is not None:
                self.element.shutdown()


def _worker_main(index: int, req: dict, task_q, result_q) -> None:
    """One worker process: takes cases from its own queue and runs each on a slot."""
    parent = os.getppid()
    holder: dict = {}
    # only the parent writes events: anything a worker (or a library) prints goes to stderr
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def on_term(signum, frame):
        # At once and quietly: SIGKILL to the agents (their own death signal would follow
        # when this process ends), nothing waited for or closed under a slot thread that
        # is reading from one (that raised tracebacks into gym.log), then gone.
        shared = holder.get("shared")
        for slot in list(shared.slots) if shared else []:
            proc = slot.element.agent.proc if slot.element is not None else None
            if proc is not None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .adapter import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    try:
        _worker_loop(index, req, task_q, result_q, parent, holder)
    except BaseException as e:  # noqa: BLE001
        result_q.put(("fatal", index, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        shared = holder.get("shared")
        for slot in list(shared.slots) if shared else []:
            slot.inbox.put(None)
        for slot in list(shared.slots) if shared else []:
            slot.join(timeout=5)
        result_q.put(("exit", index, None))


def _worker_loop(index, req, task_q, result_q, parent, holder) -> None:
    from custom_suites import payload_bank

    from . import dojo

    dojo.prepare()
    if req["fast_yaml"]:
        dojo.enable_fast_yaml()
    else:
        dojo.disable_fast_yaml()
    payload_bank.set_run_seed(req["seed"])
    shared = holder["shared"] = _Shared(index, req, dojo.get_suites_checked(req["benchmark_version"]), result_q)
    while not shared.failed.is_set():
        try:
            case = task_q.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return  # the parent is gone
            continue
        if case is None:
            return
        inject = case.pop("inject", None)
        if inject is not None:
            # A case an open pass took after the fork: its attack and text are new here.
            families.add_text(case["id"], inject["wording"], inject["template"])
            families.register_wording_attacks({case["attack"]})
        with shared.lock:
            slot = shared.idle.pop() if shared.idle else None
        if slot is None:
            slot = _Slot(shared)
            shared.slots.append(slot)
            slot.start()
        result_q.put(("case_start", index, case["id"]))
        slot.inbox.put(case)


def _injected_spans(case: dict, trace: dict, suite) -> list | None:
    """spans.injected for an attacked case; a failure there costs the report its marks,
    never the case."""
    try:
        return spans.injected(trace, suite, suite.get_user_task_by_id(case["user_task"]))
    except Exception:  # noqa: BLE001 - presentation only
        log(f"case {case['id']}: injected spans not marked:\n{traceback.format_exc()}")
        return None


def _run_case(case: dict, element, pipeline, shared: _Shared) -> dict:
    """One case on one slot: AgentDojo's own per-task runner, the outcome as a record."""
    from agentdojo.benchmark import run_task_with_injection_tasks, run_task_without_injection_tasks

    from .adapter import AgentError

    req = shared.req
    run_dir = Path(req["run_dir"])
    logdir = run_dir / TRACES_DIR
    bv = req["benchmark_version"]
    rel = trace_relpath(case, req["defence"])
    trace_path = run_dir / rel
    suite = shared.suites[case["suite"]]
    t0 = time.monotonic()
    utility = security = None
    error = None
    ok = False
    try:
        # AgentDojo reads an existing trace even with force_rerun (and crashes on a
        # truncated one, e.g. from a case killed mid-write): start from none.
        try:
            trace_path.unlink()
        except FileNotFoundError:
            pass
        element.begin_case(case)
        if case["kind"] == "clean":
            task = suite.get_user_task_by_id(case["user_task"])
            utility, _ = run_task_without_injection_tasks(suite, pipeline, task, logdir, True, bv)
        elif case["kind"] == "injection_goal":
            # as benchmark_suite_with_injections computes injection_tasks_utility_results
            task = suite.get_injection_task_by_id(case["injection_task"])
            utility, _ = run_task_without_injection_tasks(suite, pipeline, task, logdir, True, bv)
        else:
            task = suite.get_user_task_by_id(case["user_task"])
            attack = shared.attack_for(case, pipeline, task)
            u, s = run_task_with_injection_tasks(suite, pipeline, task, attack, logdir, True, [case["injection_task"]], bv)
            pair = (case["user_task"], case["injection_task"])
            if pair not in u:
                pair = next(iter(u))
            utility, security = u[pair], s[pair]
        ok = True
    except AgentError as e:
        error = str(e)
    except Exception as e:  # noqa: BLE001 - anything else: recorded, run goes on
        error = f"{type(e).__name__}: {e}"
        log(f"worker {shared.index}: case {case['id']} raised:\n{traceback.format_exc()}")
    duration = time.monotonic() - t0
    element.end_case(ok)
    trace = rel if trace_path.exists() else None
    if trace is not None:
        try:
            with open(trace_path, encoding="utf-8") as f:
                data = json.load(f)
            # AgentDojo logs the context overflow it scored as the trace's error.
            if error is None and data.get("error") and not element.context_overflow:
                error = f"agentdojo: {data['error']}"
            changed = False
            if error is not None and data.get("error") != error:
                data["error"] = error
                changed = True
            if element.events:
                # What the agent did that the messages do not show (a denied step, a
                # withheld output), for the report to mark where it happened.
                data["pruefstand_events"] = element.events
                changed = True
            marked = _injected_spans(case, data, suite) if case["kind"] not in ("clean", "injection_goal") else None
            if marked is not None:
                # Where the injected text sits in each tool result, for the report.
                data["pruefstand_injected"] = marked
                changed = True
            if element.tools:
                # The schemas of the tools the model was offered (an export's `tools`).
                data["pruefstand_tools"] = element.tools
                changed = True
            if changed:
                # make the trace self-describing (atomic rewrite)
                write_json_atomic(trace_path, data)
        except (OSError, json.JSONDecodeError) as e:
            if error is None:
                error = f"trace unreadable after the case: {e}"
    counters = element.case_counters()
    return make_record(
        case,
        utility=bool(utility) if utility is not None else None,
        security=bool(security) if security is not None else None,
        error=error,
        duration_s=duration,
        counters=counters,
        trace=trace,
        context_overflow=element.context_overflow,
        restarts=element.restarts,
    )


# --- parent -----------------------------------------------------------------------------


def grouped_longest_first(cases: list[dict], suites: dict) -> list[dict]:
    """The cases in the order workers should take them, when the request gives none.

    Longest first (most ground-truth tool calls, user task plus injection task), so the
    run does not end on a few long cases while the model server idles — but by user
    task: a user task's cases (clean and under each injection) are dispatched together,
    longest of them first, and user tasks by their longest case. Cases of one user task
    share the suite's system prompt, its tool schemas and the user's prompt, and the
    attacked ones their first turns up to the injection: run together, the server's
    prefix cache still holds what they share. Order changes no outcome: every draw is
    per case."""
    from . import dojo

    envs: dict = {}
    steps: dict = {}

    def count(suite_name: str, task_id: str, injection: bool) -> int:
        key = (suite_name, task_id, injection)
        if key not in steps:
            suite = suites[suite_name]
            if suite_name not in envs:
                envs[suite_name] = dojo.default_env(suite)
            tasks = suite.injection_tasks if injection else suite.user_tasks
            try:
                steps[key] = len(tasks[task_id].ground_truth(envs[suite_name]))
            except Exception:  # noqa: BLE001 - an estimate only
                steps[key] = 0
        return steps[key]

    def estimate(case: dict) -> int:
        n = count(case["suite"], case["user_task"], False) if case.get("user_task") else 0
        return n + (count(case["suite"], case["injection_task"], True) if case.get("injection_task") else 0)

    def group(case: dict) -> tuple:
        return (case["suite"], case.get("user_task") or "")

    longest: dict = {}
    for case in cases:
        longest[group(case)] = max(longest.get(group(case), 0), estimate(case))
    # sorted() is stable: ties keep plan order
    return sorted(cases, key=lambda c: (-longest[group(c)], group(c), -estimate(c)))


def read_agent_env(line: str) -> dict:
    try:
        env = json.loads(line)["agent_env"]
    except (ValueError, KeyError, TypeError):
        raise RequestError('stdin: expected one JSON line {"agent_env": {NAME: value, ...}}') from None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise RequestError("stdin: agent_env must map names to strings")
    return env


# SIGUSR1 asks the parent to start no new case; SIGUSR2 (early stopping: the verdict is
# decided) also to end the cases in flight (docs/protocol.md §2).
_DRAIN = {"asked": False, "stop": False}


def _ask_drain(signum, frame) -> None:
    _DRAIN["asked"] = True
    if signum == signal.SIGUSR2:
        _DRAIN["stop"] = True


def dispatch_order(to_run: list[dict], order: list[str] | None, suites: dict) -> list[dict]:
    """The request's order when it gives one (early stopping: whole user tasks in a
    seeded order), else longest first."""
    if order is None:
        return grouped_longest_first(to_run, suites)
    rank = {cid: i for i, cid in enumerate(order)}
    return sorted(to_run, key=lambda c: rank[c["id"]])


def run(request_path: str, agent_env_stdin: bool = False) -> int:
    t_start = time.monotonic()
    # before anything can send it: the default action of SIGUSR1 is to die
    signal.signal(signal.SIGUSR1, _ask_drain)
    signal.signal(signal.SIGUSR2, _ask_drain)
    if agent_env_stdin:
        # The model's URL and key travel to the agents without entering our own
        # environment (or the request file, which is kept in the run directory).
        from .adapter import AGENT_ENV

        AGENT_ENV.update(read_agent_env(sys.stdin.readline()))
    # pruefstand may run us in a process group of our own (so it can stop us with the
    # workers and agents): then a Ctrl-C or kill of pruefstand would not reach us. End
    # with our parent; the workers end with us.
    from .adapter import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM)
    req = validate_request(load_request(request_path))

    from . import dojo

    dojo.check_api()  # raises ApiMismatch
    dojo.prepare()
    # before the workers fork: they inherit the registry and the wording
    worded = req["wording"].keys() | req["templates"].keys()
    families.register_wording_attacks({c["attack"] for c in req["cases"] if c["id"] in worded})
    families.set_wording(req["seed"], req["wording"], req["templates"])
    families.install_safe_injection()
    suites = dojo.get_suites_checked(req["benchmark_version"])
    validate_names(req, suites)

    # fast YAML: switch, verify identical environments for the planned suites
    planned_suites = sorted({c["suite"] for c in req["cases"]})
    fast = dojo.enable_fast_yaml()
    warnings_out = []
    if fast:
        differ = dojo.verify_fast_yaml([suites[s] for s in planned_suites])
        if differ:
            dojo.disable_fast_yaml()
            fast = False
            warnings_out.append(
                f"C YAML loader gives different environments for {', '.join(differ)}; using the pure-Python loader"
            )
    else:
        warnings_out.append("PyYAML has no libyaml: environment loading uses the slow pure-Python loader")
    req["fast_yaml"] = fast

    # resume
    run_dir = Path(req["run_dir"])
    (run_dir / TRACES_DIR).mkdir(parents=True, exist_ok=True)
    by_id = {c["id"]: c for c in req["cases"]}
    skipped, reruns = [], []
    for cid in req["done"]:
        case = by_id.get(cid)
        if case is None:
            warnings_out.append(f"`done` names case {cid!r}, which is not in `cases`; ignored")
            continue
        path = run_dir / trace_relpath(case, req["defence"])
        reason = read_trace_status(path)
        if reason is None:
            skipped.append(cid)
        else:
            if path.exists():
                try:
                    path.unlink()
                except OSError:
                    pass
            reruns.append((cid, reason))
    skip_set = set(skipped)
    to_run = [c for c in req["cases"] if c["id"] not in skip_set]
    # An open pass counts its bound: the cases still to come are cases to run.
    total = len(req["cases"]) if req["open"] is None else max(req["open"], len(req["cases"]))
    plan = concurrency_plan(req, total - len(skipped))

    emit({"event": "start", "total": total, "to_run": total - len(skipped), "done": len(skipped),
          "jobs": plan["target"], "processes": plan["processes"], "max_in_flight": plan["ceiling"]})
    for w in warnings_out:
        emit({"event": "warning", "message": w})
    for cid in skipped:
        emit({"event": "skip", "case_id": cid})
    for cid, reason in reruns:
        emit({"event": "rerun", "case_id": cid, "reason": reason})

    planned_inj = sorted(
        {(c["suite"], c["injection_task"]) for c in req["cases"] if c["kind"] == "attacked"},
        key=lambda p: (p[0], dojo.natural_key(p[1])),
    )

    dispatcher = None
    if plan["processes"]:
        ctx = mp.get_context("fork")
        result_q = ctx.Queue()
        sys.stdout.flush()
        sys.stderr.flush()
        # What the parent imported (agentdojo, the suites) stays shared with the workers:
        # out of the collector's reach, its pages are not dirtied by it after the fork.
        gc.freeze()
        workers = []
        # fork first, then start threads and fill queues (none alive at fork time)
        for i in range(plan["processes"]):
            task_q = ctx.Queue()
            p = ctx.Process(target=_worker_main, args=(i, req, task_q, result_q), daemon=True)
            p.start()
            workers.append(_Worker(i, p, task_q))
        dispatcher = Dispatcher(workers, result_q, dispatch_order(to_run, req["order"], suites), plan, req, suites)
        threading.Thread(target=_read_commands, args=(result_q, req["open"] is not None), daemon=True).start()

    # Registered after multiprocessing's own exit hook, so it runs first: a SIGTERM that
    # lands while that hook joins the workers (the run was killed as the gym ended) must
    # not raise into it, which prints "Exception ignored in atexit callback" and a
    # traceback into the log.
    exiting = {"now": False}
    atexit.register(lambda: exiting.update(now=True))

    def stop_workers(signum=None, frame=None):
        for w in dispatcher.workers if dispatcher else []:
            if w.proc.is_alive():
                try:
                    os.kill(w.proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        if signum is not None:
            if exiting["now"]:
                os._exit(128 + signum)
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop_workers)

    try:
        if dispatcher:
            dispatcher.fill()  # the first cases start while the environment check runs
        checks = dojo.environment_check(suites, planned_inj)
        emit({"event": "environment_check", "checks": checks})
        if dispatcher:
            dispatcher.collect()
    except KeyboardInterrupt:
        stop_workers()
        raise
    finally:
        for w in dispatcher.workers if dispatcher else []:
            w.proc.join(timeout=5)
        stop_workers()

    emit({"event": "done"})
    ran = len(dispatcher.known) - len(skipped) if dispatcher else len(to_run)
    log(f"run finished: {ran} cases run, {len(skipped)} skipped, {time.monotonic() - t_start:.1f} s")
    return 0


# --- concurrency --------------------------------------------------------------------------

MAX_PROCESSES = 8


def concurrency_plan(req: dict, to_run: int) -> dict:
    """How many worker processes, and how many cases in flight to begin with and at most.

    Processes carry the CPU-bound framework work, so there are as many as cores this
    process may use, but no more than MAX_PROCESSES (each costs ~80 MiB; past 8 the
    framework is no longer the bottleneck for one model server) and never more than
    cases may be in flight. The in-flight count itself (`target`) changes during the run
    on pruefstand's `concurrency` commands; `max_in_flight` bounds it."""
    if to_run == 0:
        return {"processes": 0, "target": 0, "ceiling": 0}
    ceiling = max(1, min(req["max_in_flight"] or req["jobs"], to_run))
    target = max(1, min(req["jobs"], ceiling))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"processes": max(1, min(cores, MAX_PROCESSES, ceiling)), "target": target, "ceiling": ceiling}


def _read_commands(result_q, close_at_end: bool) -> None:
    """pruefstand's commands on stdin, one JSON object per line, handed to the collector's
    queue. End of input (or no pipe at all) ends this reader, and closes an open pass
    (`close_at_end`): no more cases can come."""
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            command = json.loads(line)
        except json.JSONDecodeError:
            log(f"ignoring a command that is not JSON: {line[:200]!r}")
            continue
        result_q.put(("command", -1, command))
    if close_at_end:
        result_q.put(("command", -1, {"command": "close"}))


class _Worker:
    __slots__ = ("index", "proc", "task_q", "cases", "alive")

    def __init__(self, index, proc, task_q):
        self.index = index
        self.proc = proc
        self.task_q = task_q
        self.cases: set[str] = set()  # in flight on this worker
        self.alive = True


class Dispatcher:
    """Starts cases while fewer than `target` are in flight, on the worker with the fewest,
    and collects their records. `target` moves on pruefstand's commands; `stopping` ends
    the starting of new cases (what has started finishes). An open pass (request `open`)
    takes more cases on `cases` commands and ends once `close` came and all finished."""

    def __init__(self, workers, result_q, order: list[dict], plan: dict, req: dict, suites: dict | None = None):
        self.workers = workers
        self.result_q = result_q
        self.queue = list(reversed(order))  # pop() takes the next
        self.pending = {c["id"]: c for c in order}
        self.target = plan["target"]
        self.ceiling = plan["ceiling"]
        self.stopping = False
        self.req = req
        self.suites = suites
        self.started_at: dict[str, float] = {}
        self.open = req.get("open") is not None
        self.known = {c["id"] for c in req.get("cases", order)}

    def in_flight(self) -> int:
        return sum(len(w.cases) for w in self.workers)

    def fill(self) -> None:
        while self.queue and not self.stopping and self.in_flight() < self.target:
            live = [w for w in self.workers if w.alive]
            if not live:
                return
            worker = min(live, key=lambda w: (len(w.cases), w.index))
            case = self.queue.pop()
            worker.cases.add(case["id"])
            self.started_at[case["id"]] = time.monotonic()
            worker.task_q.put(case)

    def on_command(self, command) -> None:
        kind = command.get("command") if isinstance(command, dict) else None
        if kind == "concurrency":
            target = command.get("target")
            if isinstance(target, int) and not isinstance(target, bool) and target >= 1:
                self.target = min(target, self.ceiling)
                return
        elif kind == "cases" and self.open:
            self.add(command)
            return
        elif kind == "close":
            self.open = False
            return
        log(f"ignoring an unknown or malformed command: {command!r}")

    def add(self, command: dict) -> None:
        """An open pass's `cases` command: more cases to run after those queued, each with
        the wording or the template it injects (`wording`, `templates`, as in the
        request). pruefstand writes them: one that is not valid, names a case id given
        before or goes past the request's `open` bound ends the gym (RequestError, exit
        2), as a request would."""
        cases = command.get("cases")
        if not isinstance(cases, list):
            raise RequestError("`cases` command: `cases` must be a list")
        from .records import check_case_shape

        cases = [check_case_shape(i, c) for i, c in enumerate(cases)]
        try:
            wording = families.check_wording(command.get("wording") or {})
            templates = families.check_templates(command.get("templates") or {})
        except ValueError as e:
            raise RequestError(f"`cases` command: {e}") from None
        ids = [c["id"] for c in cases]
        again = sorted(set(i for i in ids if i in self.known or ids.count(i) > 1))
        if again:
            raise RequestError(f"`cases` command: case id {again[0]!r} given twice")
        if len(self.known) + len(ids) > self.req["open"]:
            raise RequestError(f"`cases` command: more than the request's `open` bound of {self.req['open']} cases")
        families.register_wording_attacks({c["attack"] for c in cases if c["id"] in wording or c["id"] in templates})
        validate_names({"cases": cases, "benchmark_version": self.req["benchmark_version"]}, self.suites)
        for c in cases:
            if c["id"] in wording or c["id"] in templates:
                # The workers forked before this text came: it travels with its case.
                c["inject"] = {"wording": wording.get(c["id"]), "template": templates.get(c["id"])}
            self.known.add(c["id"])
            self.pending[c["id"]] = c
        self.queue[0:0] = list(reversed(cases))

    def drain(self, stop: bool) -> None:
        """Nothing new starts; what is in flight finishes, or with `stop` (the verdict is
        decided, they cannot change it) ends unrecorded: its workers are stopped, their
        agents killed. Records already on their way are dropped with them."""
        self.stopping = True
        self.open = False
        not_started = len(self.queue)
        for case in self.queue:
            self.pending.pop(case["id"], None)
        self.queue.clear()
        stopped = 0
        for w in self.workers if stop else []:
            if w.alive and w.cases:
                stopped += len(w.cases)
                for cid in w.cases:
                    self.pending.pop(cid, None)
                w.cases.clear()
                w.alive = False
                try:
                    os.kill(w.proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        emit({"event": "drained", "not_started": not_started + stopped, "stopped": stopped})
        log(f"drained: {not_started} cases not started, {stopped} in flight stopped, {len(self.pending)} in flight finish")

    def collect(self) -> None:
        while (self.pending or self.open) and any(w.alive for w in self.workers):
            if _DRAIN["asked"] and not self.stopping or _DRAIN["stop"] and any(w.alive and w.cases for w in self.workers):
                self.drain(stop=_DRAIN["stop"])
                if not self.pending:
                    break
            self.fill()
            try:
                kind, index, payload = self.result_q.get(timeout=1.0)
            except queue.Empty:
                # a worker that died without saying so (killed, crashed interpreter)
                for w in self.workers:
                    if w.alive and not w.proc.is_alive():
                        self.worker_lost(w, f"gym worker died (exit code {w.proc.exitcode})")
                continue
            if kind == "command":
                self.on_command(payload)
            elif kind == "case_start":
                emit({"event": "case_start", "case_id": payload, "worker": index})
            elif kind == "record":
                self.workers[index].cases.discard(payload["case_id"])
                self.pending.pop(payload["case_id"], None)
                emit({"event": "case", "record": payload})
            elif kind == "fatal":
                emit({"event": "warning", "message": f"worker {index} failed: {payload.splitlines()[0]}"})
                log(f"worker {index} failed:\n{payload}")
                self.worker_lost(self.workers[index], "gym worker failed: " + payload.splitlines()[0])
            elif kind == "exit":
                if self.workers[index].alive:
                    self.worker_lost(self.workers[index], "gym worker exited")
        for w in self.workers:
            if w.alive:
                w.task_q.put(None)
        # workers gone with cases left (all workers failed): record them as errors
        for case in list(self.pending.values()):
            _emit_error(case, "not run: every gym worker failed", 0.0, self.req)
        self.pending.clear()

    def worker_lost(self, worker: _Worker, error: str) -> None:
        """Its in-flight cases are errors; the others go to the remaining workers."""
        worker.alive = False
        if worker.cases:
            emit({"event": "warning", "message": f"worker {worker.index}: {error}"})
        for cid in sorted(worker.cases):
            case = self.pending.pop(cid, None)
            if case is not None:
                _emit_error(case, error, time.monotonic() - self.started_at.get(cid, time.monotonic()), self.req)
        worker.cases.clear()


def _emit_error(case: dict, error: str, duration: float, req: dict) -> None:
    rel = trace_relpath(case, req["defence"])
    trace = rel if (Path(req["run_dir"]) / rel).exists() else None
    emit({"event": "case", "record": make_record(case, utility=None, security=None, error=error,
                                                 duration_s=duration, counters=None, trace=trace)})
