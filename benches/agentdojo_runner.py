"""AgentDojo's own sequential runner, as its benchmark script drives it — the
contender `scripts/bench` compares `pruefstand run` with.

Run with the managed venv's Python (agentdojo 0.1.35), never with the agentdojo
package folder as cwd. It does exactly what `python -m agentdojo.scripts.benchmark
--model local [--attack A] -s SUITE -ut … -it …` does per suite (same
`AgentPipeline.from_config(PipelineConfig(llm="local", …))`, same
`benchmark_suite_without_injections` / `benchmark_suite_with_injections`, same
`OutputLogger`), but for all suites in one process: the script refuses `--user-task`
with more than one suite, and one process per suite would add ~6 s of imports each to
AgentDojo's time. So this is AgentDojo's best case.

Per suite it runs the user tasks clean, then (with the attack) every (user task,
injection task) pair plus each injection task's goal as a user prompt — the case set of
a pruefstand plan with the same suites and tasks.

    python agentdojo_runner.py --case-set FILE.json --logdir DIR [--attack A]
        [--benchmark-version v1.2.2] [--model-id NAME] [--fast-yaml] [--out RESULT.json]

FILE.json: {"suites": {"banking": {"user_tasks": [...], "injection_tasks": [...]}, ...}}.
The server comes from LOCAL_LLM_PORT (AgentDojo's own variable); its API key must be
"EMPTY" or none (the `local` provider's hard-coded key). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case-set", required=True)
    ap.add_argument("--logdir", required=True)
    ap.add_argument("--attack", default="important_instructions")
    ap.add_argument("--benchmark-version", default="v1.2.2")
    ap.add_argument("--fast-yaml", action="store_true",
                    help="load environments with PyYAML's CSafeLoader (as the gym does); default: AgentDojo as shipped")
    ap.add_argument("--model-id", default=None,
                    help="as the script's --model-id (else the first of /v1/models, fetched without a key)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    t0 = time.monotonic()
    with open(args.case_set, encoding="utf-8") as f:
        case_set = json.load(f)["suites"]

    import logging

    logging.basicConfig(level=logging.WARNING)
    from agentdojo.agent_pipeline.agent_pipeline import AgentPipeline, PipelineConfig
    from agentdojo.attacks.attack_registry import load_attack
    from agentdojo.benchmark import benchmark_suite_with_injections, benchmark_suite_without_injections
    from agentdojo.logging import OutputLogger
    from agentdojo.task_suite.load_suites import get_suite

    if args.fast_yaml:
        import yaml
        import agentdojo.task_suite.task_suite as ts

        class _Fast:
            def __getattr__(self, name):
                return getattr(yaml, name)

            @staticmethod
            def safe_load(stream):
                return yaml.load(stream, Loader=yaml.CSafeLoader)

        ts.yaml = _Fast()

    t_imported = time.monotonic()
    cpu_imported = cpu_s()
    # as benchmark.py's benchmark_suite(): the pipeline from the config, `local` model
    pipeline = AgentPipeline.from_config(
        PipelineConfig(llm="local", model_id=args.model_id, defense=None, tool_delimiter="tool",
                       system_message_name=None, system_message=None)
    )
    from pathlib import Path

    logdir = Path(os.path.abspath(args.logdir))  # the script's click option is a Path
    results = {}
    counts = {"clean": 0, "attacked": 0, "injection_goal": 0}
    t_cases = time.monotonic()
    for suite_name, sel in case_set.items():
        suite = get_suite(args.benchmark_version, suite_name)
        user_tasks = tuple(sel["user_tasks"])
        injection_tasks = tuple(sel.get("injection_tasks", ()))
        with OutputLogger(str(logdir)):
            clean = benchmark_suite_without_injections(
                pipeline, suite, user_tasks=user_tasks, logdir=logdir, force_rerun=True,
                benchmark_version=args.benchmark_version,
            )
            attacked = None
            if args.attack and injection_tasks:
                attack = load_attack(args.attack, suite, pipeline)
                attacked = benchmark_suite_with_injections(
                    pipeline, suite, attack, user_tasks=user_tasks, injection_tasks=injection_tasks,
                    logdir=logdir, force_rerun=True, benchmark_version=args.benchmark_version,
                )
        out = {"clean": {ut: bool(v) for (ut, _), v in clean["utility_results"].items()}}
        counts["clean"] += len(out["clean"])
        if attacked is not None:
            out["attacked"] = {
                f"{ut}/{it}": [bool(attacked["utility_results"][(ut, it)]), bool(attacked["security_results"][(ut, it)])]
                for (ut, it) in attacked["utility_results"]
            }
            out["injection_goal"] = {it: bool(v) for it, v in attacked["injection_tasks_utility_results"].items()}
            counts["attacked"] += len(out["attacked"])
            counts["injection_goal"] += len(out["injection_goal"])
        results[suite_name] = out
    t_end = time.monotonic()
    summary = {
        "cases": sum(counts.values()),
        "counts": counts,
        "pipeline_name": pipeline.name,
        "fast_yaml": args.fast_yaml,
        "import_s": round(t_imported - t0, 3),
        "cases_s": round(t_end - t_cases, 3),
        "total_s": round(t_end - t0, 3),
        "cpu_import_s": round(cpu_imported, 3),
        "cpu_cases_s": round(cpu_s() - cpu_imported, 3),
        "results": results,
    }
    text = json.dumps(summary)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}), file=sys.__stdout__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
