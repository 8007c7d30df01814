"""`gym.py run --request FILE`: validate, resume, environment check, N worker processes.

Only the parent writes to stdout (one JSON event per line, flushed). Each worker owns one
agent subprocess, takes cases from a queue and sends results back. Two traps of
AgentDojo 0.1.35 are avoided: `benchmark_suite_with_injections` per shard re-runs the
injection tasks in every shard, which then write the same trace files at once (so here
one case = one `run_task_*` call with force_rerun=True); and the logger stack is one
process-wide list (so each worker enters its own OutputLogger on a fresh stack).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import signal
import sys
import time
import traceback
from pathlib import Path

from .protocol import empty_counters
from .records import RequestError, make_record, read_trace_status, trace_relpath, write_json_atomic


def emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def log(msg: str) -> None:
    sys.stderr.write(f"[gym] {msg}\n")
    sys.stderr.flush()


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
    """Shape checks that need no agentdojo; returns a normalised request."""
    from .records import check_case_shape

    def need(key, types, desc):
        if key not in req:
            raise RequestError(f"request: `{key}` missing ({desc})")
        if not isinstance(req[key], types) or isinstance(req[key], bool) and bool not in (
            types if isinstance(types, tuple) else (types,)
        ):
            raise RequestError(f"request: `{key}` must be {desc}, got {req[key]!r}")
        return req[key]

    run_dir = need("run_dir", str, "an absolute path")
    if not os.path.isabs(run_dir):
        raise RequestError(f"request: `run_dir` must be absolute, got {run_dir!r}")
    bv = need("benchmark_version", str, "a benchmark version string")
    jobs = req.get("jobs", 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1 or jobs > 512:
        raise RequestError(f"request: `jobs` must be an integer 1..512, got {jobs!r}")
    argv = need("agent_cmd", list, "a non-empty argv list of strings")
    if not argv or not all(isinstance(a, str) and a for a in argv):
        raise RequestError("request: `agent_cmd` must be a non-empty list of non-empty strings (argv, no shell)")
    display = req.get("model_display_name") or "Local model"
    if not isinstance(display, str):
        raise RequestError("request: `model_display_name` must be a string")
    timeout = req.get("case_timeout_s", 300)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise RequestError(f"request: `case_timeout_s` must be a positive number, got {timeout!r}")
    seed = req.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RequestError(f"request: `seed` must be an integer, got {seed!r}")
    defence = req.get("defence")
    from .dojo import DEFENCES  # light: dojo imports yaml only at module level

    if defence is not None and defence not in DEFENCES:
        raise RequestError(f"request: unknown defence {defence!r}; valid: null, {', '.join(DEFENCES)}")
    cases_in = need("cases", list, "a list of cases")
    cases = [check_case_shape(i, c) for i, c in enumerate(cases_in)]
    seen_ids, seen_keys = set(), {}
    for c in cases:
        if c["id"] in seen_ids:
            raise RequestError(f"request: duplicate case id {c['id']!r}")
        seen_ids.add(c["id"])
        key = trace_relpath(c, defence)
        if key in seen_keys:
            raise RequestError(f"request: cases {seen_keys[key]!r} and {c['id']!r} are the same episode")
        seen_keys[key] = c["id"]
    done = req.get("done", []) or []
    if not isinstance(done, list) or not all(isinstance(d, str) for d in done):
        raise RequestError("request: `done` must be a list of case ids")
    order = req.get("order")
    if order is not None:
        if not isinstance(order, list) or sorted(order) != sorted(seen_ids):
            raise RequestError("request: `order` must list every case id exactly once")
    return {
        "run_dir": run_dir,
        "benchmark_version": bv,
        "jobs": jobs,
        "agent_cmd": argv,
        "model_display_name": display,
        "case_timeout_s": float(timeout),
        "seed": seed,
        "defence": defence,
        "cases": cases,
        "done": done,
        "order": order,
    }


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


def _worker_main(index: int, req: dict, task_q, result_q) -> None:
    """One worker process: its own agent, pipeline, attack cache and logger."""
    parent = os.getppid()
    element_holder = {}
    # only the parent writes events: anything a worker (or a library) prints goes to stderr
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def on_term(signum, frame):
        el = element_holder.get("el")
        if el is not None:
            el.agent.kill()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .adapter import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    try:
        _worker_loop(index, req, task_q, result_q, parent, element_holder)
    except BaseException as e:  # noqa: BLE001
        result_q.put(("fatal", index, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        el = element_holder.get("el")
        if el is not None:
            el.shutdown()
        result_q.put(("exit", index, None))


def _worker_loop(index, req, task_q, result_q, parent, holder) -> None:
    from importlib.metadata import version

    from agentdojo.benchmark import run_task_with_injection_tasks, run_task_without_injection_tasks
    from agentdojo.logging import LOGGER_STACK, OutputLogger

    from custom_suites import payload_bank

    from . import dojo
    from .adapter import AgentError, ExternalAgentElement

    dojo.prepare()
    if req["fast_yaml"]:
        dojo.enable_fast_yaml()
    else:
        dojo.disable_fast_yaml()
    payload_bank.set_run_seed(req["seed"])
    suites = dojo.get_suites_checked(req["benchmark_version"])
    element = ExternalAgentElement(
        req["agent_cmd"], req["benchmark_version"], version("agentdojo"), req["case_timeout_s"]
    )
    holder["el"] = element
    pipeline = dojo.build_pipeline(element, req["defence"], req["model_display_name"])
    run_dir = Path(req["run_dir"])
    logdir = run_dir / "traces"
    attacks: dict = {}
    bv = req["benchmark_version"]

    LOGGER_STACK.set([])
    with OutputLogger(str(logdir)):
        while True:
            try:
                case = task_q.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != parent:
                    return  # the parent is gone
                continue
            if case is None:
                return
            result_q.put(("case_start", index, case["id"]))
            rel = trace_relpath(case, req["defence"])
            trace_path = run_dir / rel
            suite = suites[case["suite"]]
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
                    key = (case["suite"], case["attack"])
                    attack = attacks.get(key)
                    if attack is None:
                        attack = attacks[key] = dojo.make_attack(case["attack"], suite, pipeline)
                    task = suite.get_user_task_by_id(case["user_task"])
                    u, s = run_task_with_injection_tasks(
                        suite, pipeline, task, attack, logdir, True, [case["injection_task"]], bv
                    )
                    pair = (case["user_task"], case["injection_task"])
                    if pair not in u:
                        pair = next(iter(u))
                    utility, security = u[pair], s[pair]
                ok = True
            except AgentError as e:
                error = str(e)
            except Exception as e:  # noqa: BLE001 - anything else: recorded, run goes on
                error = f"{type(e).__name__}: {e}"
                log(f"worker {index}: case {case['id']} raised:\n{traceback.format_exc()}")
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
                    if error is not None and data.get("error") != error:
                        # make the trace self-describing (atomic rewrite)
                        data["error"] = error
                        write_json_atomic(trace_path, data)
                except (OSError, json.JSONDecodeError) as e:
                    if error is None:
                        error = f"trace unreadable after the case: {e}"
            counters = element.counters if element.counters is not None else empty_counters()
            record = make_record(
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
            result_q.put(("record", index, record))


# --- parent -----------------------------------------------------------------------------


def longest_first(cases: list[dict], suites: dict) -> list[dict]:
    """The cases in the order workers should take them: most ground-truth tool calls
    first (user task plus injection task), so the run does not end on a few long cases
    while the model server idles. Order changes no outcome: every draw is per case."""
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

    return sorted(cases, key=estimate, reverse=True)


# Early stopping: SIGUSR1 asks the parent to start no new case (docs/protocol.md §2).
_DRAIN = {"asked": False}


def _ask_drain(signum, frame) -> None:
    _DRAIN["asked"] = True


def dispatch_order(to_run: list[dict], order: list[str] | None, suites: dict) -> list[dict]:
    """The request's order when it gives one (early stopping: whole user tasks in a
    seeded order), else longest first."""
    if order is None:
        return longest_first(to_run, suites)
    rank = {cid: i for i, cid in enumerate(order)}
    return sorted(to_run, key=lambda c: rank[c["id"]])


def run(request_path: str) -> int:
    t_start = time.monotonic()
    # before anything can send it: the default action of SIGUSR1 is to die
    signal.signal(signal.SIGUSR1, _ask_drain)
    # pruefstand may run us in a process group of our own (so it can stop us with the
    # workers and agents): then a Ctrl-C or kill of pruefstand would not reach us. End
    # with our parent; the workers end with us.
    from .adapter import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM)
    req = validate_request(load_request(request_path))

    from . import dojo

    dojo.check_api()  # raises ApiMismatch
    dojo.prepare()
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
    (run_dir / "traces").mkdir(parents=True, exist_ok=True)
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
    jobs = max(1, min(req["jobs"], len(to_run))) if to_run else 0

    emit({"event": "start", "total": len(req["cases"]), "to_run": len(to_run), "done": len(skipped), "jobs": jobs})
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

    procs = []
    if to_run:
        ctx = mp.get_context("fork")
        task_q = ctx.Queue()
        result_q = ctx.Queue()
        sys.stdout.flush()
        sys.stderr.flush()
        # fork first, then fill the queue (no feeder thread alive at fork time)
        for i in range(jobs):
            p = ctx.Process(target=_worker_main, args=(i, req, task_q, result_q), daemon=True)
            p.start()
            procs.append(p)
        for c in dispatch_order(to_run, req["order"], suites):
            task_q.put(c)
        for _ in range(jobs):
            task_q.put(None)

    def stop_workers(signum=None, frame=None):
        for p in procs:
            if p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except OSError:
                    pass
        if signum is not None:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop_workers)

    try:
        # the environment check runs here while the workers start their cases
        checks = dojo.environment_check(suites, planned_inj)
        emit({"event": "environment_check", "checks": checks})

        if to_run:
            _collect(procs, result_q, {c["id"]: c for c in to_run}, req, task_q)
    except KeyboardInterrupt:
        stop_workers()
        raise
    finally:
        for p in procs:
            p.join(timeout=5)
        stop_workers()

    emit({"event": "done"})
    log(f"run finished: {len(to_run)} cases run, {len(skipped)} skipped, {time.monotonic() - t_start:.1f} s")
    return 0


def _drain(task_q, pending: dict, workers: int) -> int:
    """Takes every case no worker has taken yet off the queue (they are not run), then
    tells each worker to end after its case in flight. Returns how many were taken."""
    taken = 0
    while True:
        try:
            case = task_q.get(timeout=0.2)
        except queue.Empty:
            break
        if case is not None and pending.pop(case["id"], None) is not None:
            taken += 1
    for _ in range(workers):
        task_q.put(None)
    return taken


def _collect(procs, result_q, pending: dict, req: dict, task_q) -> None:
    in_flight: dict[int, str] = {}
    exited: set[int] = set()
    started_at: dict[int, float] = {}
    drained = False
    while pending and len(exited) < len(procs):
        if _DRAIN["asked"] and not drained:
            drained = True
            not_started = _drain(task_q, pending, len(procs))
            emit({"event": "drained", "not_started": not_started})
            log(f"drained: {not_started} cases not started, {len(pending)} in flight finish")
            if not pending:
                break
        try:
            kind, index, payload = result_q.get(timeout=1.0)
        except queue.Empty:
            # a worker that died without saying so (killed, crashed interpreter)
            for i, p in enumerate(procs):
                if i not in exited and not p.is_alive():
                    exited.add(i)
                    cid = in_flight.pop(i, None)
                    emit({"event": "warning", "message": f"worker {i} died (exit code {p.exitcode})"})
                    if cid is not None and cid in pending:
                        _emit_error(pending.pop(cid), f"gym worker died (exit code {p.exitcode})",
                                    time.monotonic() - started_at.get(i, time.monotonic()), req)
            continue
        if kind == "case_start":
            in_flight[index] = payload
            started_at[index] = time.monotonic()
            emit({"event": "case_start", "case_id": payload, "worker": index})
        elif kind == "record":
            in_flight.pop(index, None)
            pending.pop(payload["case_id"], None)
            emit({"event": "case", "record": payload})
        elif kind == "fatal":
            emit({"event": "warning", "message": f"worker {index} failed: {payload.splitlines()[0]}"})
            log(f"worker {index} failed:\n{payload}")
            cid = in_flight.pop(index, None)
            if cid is not None and cid in pending:
                _emit_error(pending.pop(cid), "gym worker failed: " + payload.splitlines()[0], 0.0, req)
        elif kind == "exit":
            exited.add(index)
    # workers gone with cases left (all workers failed): record them as errors
    for cid, case in list(pending.items()):
        _emit_error(case, "not run: every gym worker failed", 0.0, req)
        pending.pop(cid)


def _emit_error(case: dict, error: str, duration: float, req: dict) -> None:
    rel = trace_relpath(case, req["defence"])
    trace = rel if (Path(req["run_dir"]) / rel).exists() else None
    emit({"event": "case", "record": make_record(case, utility=None, security=None, error=error,
                                                 duration_s=duration, counters=None, trace=trace)})
