#!/usr/bin/env python3
"""AgentDojo's own sequential runner, for comparison with the gym (tests, benchmarks).

    agentdojo_sequential.py --suite S --benchmark-version V --attack A
        [--user-task T]... [--injection-task I]... --logdir DIR -- AGENT ARGV...

Runs `agentdojo.benchmark.benchmark_suite_with_injections` — one process, one case
after another, AgentDojo's own bookkeeping — with the same external agent element the
gym uses, and prints one JSON object:
`{"utility": {"user_task|injection_task": bool}, "security": {...},
  "injection_task_utility": {"injection_task": bool}, "seconds": float}`.
Run it with the managed venv's Python (`pruefstand setup` prints it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pruefstand_gym import dojo  # noqa: E402
from pruefstand_gym.adapter import ExternalAgentElement  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", required=True)
    parser.add_argument("--benchmark-version", default="v1.2.2")
    parser.add_argument("--attack", default="important_instructions")
    parser.add_argument("--user-task", action="append", default=None)
    parser.add_argument("--injection-task", action="append", default=None)
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--model-display-name", default="Local model")
    parser.add_argument("agent", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = [a for a in args.agent if a != "--"]
    if not argv:
        parser.error("an agent command is required after --")

    from agentdojo.benchmark import benchmark_suite_with_injections
    from agentdojo.logging import OutputLogger

    dojo.enable_fast_yaml()
    suite = dojo.get_suites_checked(args.benchmark_version)[args.suite]
    import agentdojo

    element = ExternalAgentElement(argv, args.benchmark_version, getattr(agentdojo, "__version__", "0.1.35"), 1e9)
    element.deadline = time.monotonic() + 1e9
    element.ensure_agent()
    pipeline = dojo.build_pipeline(element, None, args.model_display_name)
    attack = dojo.make_attack(args.attack, suite, pipeline)
    started = time.monotonic()
    with OutputLogger(str(Path(args.logdir))):
        results = benchmark_suite_with_injections(
            pipeline,
            suite,
            attack,
            Path(args.logdir),
            True,
            user_tasks=args.user_task,
            injection_tasks=args.injection_task,
            verbose=False,
            benchmark_version=args.benchmark_version,
        )
    seconds = time.monotonic() - started
    element.shutdown()
    key = lambda pair: f"{pair[0]}|{pair[1]}"  # noqa: E731
    print(
        json.dumps(
            {
                "utility": {key(k): bool(v) for k, v in results["utility_results"].items()},
                "security": {key(k): bool(v) for k, v in results["security_results"].items()},
                "injection_task_utility": {k: bool(v) for k, v in results["injection_tasks_utility_results"].items()},
                "seconds": seconds,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
