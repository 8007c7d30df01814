"""inspect_evals' `agentdojo` task against a running OpenAI-compatible vLLM server — the
third harness of `scripts/bench`'s `tools` part, beside AgentDojo's own runner and
`pruefstand run`.

Run with the Python of a venv that holds `inspect-evals` (0.26.x) and `inspect-ai`
(scripts/bench makes one under /var/tmp). It runs inspect exactly as a user would run
`inspect eval inspect_evals/agentdojo -T workspace=SUITE -T user_task_ids=[…]
-T injection_task_ids=[…] -T with_sandbox_tasks=no [-T with_injections=false]
--model vllm/NAME`, with inspect's defaults for everything else (concurrency:
max_connections 10, samples of a task in parallel; no message limit): one task per
suite with the attack (its (user task, injection task) pairs) and one without (the user
tasks clean), all in one `eval()` call. The task cannot filter by task ids across
suites, and it has no "injection task as user task" samples, so the injection goals of
a pruefstand plan have no counterpart here.

    python inspect_runner.py --case-set FILE.json --model vllm/NAME --log-dir DIR --out RESULT.json
        [--from-logs LOG.eval …]   (no run: what those logs hold, e.g. of a stopped run)

FILE.json: {"suites": {"banking": {"user_tasks": ["user_task_1", …], "injection_tasks": [...]}}}.
The server: VLLM_BASE_URL (…/v1) and VLLM_API_KEY in the environment. Prints nothing
but inspect's own output; writes one JSON object: per sample the suite, user and
injection task, utility, security (True: the injection's goal was met), the tool calls in
order (function, arguments), whether a reply hit the model's context length, tokens.
"""

from __future__ import annotations

import argparse
import json
import time


def task_no(name: str) -> int:
    return int(name.rsplit("_", 1)[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case-set", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--log-dir", required=True)
    ap.add_argument("--attack", default="important_instructions")
    ap.add_argument("--out", required=True)
    ap.add_argument("--from-logs", nargs="*", default=None,
                    help="read these .eval logs (e.g. of a stopped run) instead of running inspect")
    args = ap.parse_args()
    t0 = time.monotonic()
    with open(args.case_set, encoding="utf-8") as f:
        case_set = json.load(f)["suites"]

    tasks = []
    if args.from_logs is not None:
        from inspect_ai.log import read_eval_log

        t_imported = time.monotonic()
        logs = [read_eval_log(p) for p in args.from_logs]
    else:
        from inspect_ai import eval as inspect_eval
        from inspect_evals.agentdojo import agentdojo

        t_imported = time.monotonic()
        for suite, v in case_set.items():
            users = [task_no(u) for u in v["user_tasks"]]
            injections = [task_no(i) for i in v.get("injection_tasks", [])]
            tasks.append(agentdojo(attack=args.attack, with_sandbox_tasks="no", workspace=suite,
                                   user_task_ids=users, with_injections=False))
            if injections:
                tasks.append(agentdojo(attack=args.attack, with_sandbox_tasks="no", workspace=suite,
                                       user_task_ids=users, injection_task_ids=injections, with_injections=True))
        logs = inspect_eval(tasks, model=args.model, log_dir=args.log_dir, display="plain")
    t_done = time.monotonic()

    samples = []
    for log in logs:
        for s in log.samples or []:
            meta = s.metadata or {}
            suite = meta.get("task_suite_name") or str(s.id).split("-")[0]
            score = next(iter((s.scores or {}).values()), None)
            value = score.value if score is not None else {}
            calls, overflow, stops = [], False, []
            for m in s.messages:
                if m.role != "assistant":
                    continue
                for c in m.tool_calls or []:
                    calls.append([c.function, c.arguments])
            out = getattr(s, "output", None)
            for ev in getattr(s, "events", []) or []:
                o = getattr(ev, "output", None)
                if getattr(ev, "event", None) == "model" and o is not None:
                    stops.append(getattr(o, "stop_reason", None))
            if out is not None and getattr(out, "stop_reason", None) == "model_length":
                overflow = True
            overflow = overflow or "model_length" in stops
            usage = {"input_tokens": 0, "output_tokens": 0, "input_tokens_cache_read": 0}
            for u in (s.model_usage or {}).values():
                usage["input_tokens"] += u.input_tokens or 0
                usage["output_tokens"] += u.output_tokens or 0
                usage["input_tokens_cache_read"] += getattr(u, "input_tokens_cache_read", 0) or 0
            inj = meta.get("injection_task_id")
            samples.append({
                "id": str(s.id), "suite": suite, "user_task": f"user_task_{meta.get('task_id')}",
                "injection_task": None if inj is None else f"injection_task_{inj}",
                "utility": value.get("utility") == "C" if isinstance(value, dict) and "utility" in value else None,
                "security": (value.get("security") == "C") if isinstance(value, dict) and "security" in value else None,
                "calls": calls, "model_calls": sum(1 for st in stops), "stop_reasons": stops,
                "context_overflow": overflow, "error": str(s.error.message) if s.error else None,
                "total_time_s": getattr(s, "total_time", None), **usage})
    res = {"import_s": t_imported - t0, "eval_s": t_done - t_imported, "samples": samples,
           "status": [str(log.status) for log in logs], "tasks": len(tasks),
           "max_connections_default": 10, "logs": [str(getattr(log, "location", "")) for log in logs]}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
