"""`python -m pruefstand_env`: the environment from the command line.

    python -m pruefstand_env dataset --plan P [--seed S] --out DIR [--kind K]...
        writes DIR/dataset.jsonl and its manifest; prints the manifest
    python -m pruefstand_env rollouts --plan P [--seed S] --out DIR --base-url URL --model M
            [--agent-json FILE] [--jobs N | --jobs-from-run RUN] [--retries R] [--limit K] [--repeat G]
            [--tool-calling native|prompted] [--kind K]...
        every case (or the first K), G times each, through the gym with the bench's agent
        against URL; prints one JSON summary: rollouts, errors, retried, seconds, rollouts
        per minute, mean rewards. Each rollout is a line of DIR/rollouts.jsonl.
        --jobs-from-run: as many in flight as the bench's steering reached in RUN (a
        run directory, or a version name: its newest run), against the same server.

    python -m pruefstand_env serve --plan P [--seed S] --out DIR [--port N] [--max-turns T]
            [--max-tokens M] [--temperature X] [--retries R] [--kind K]...
        the environment over HTTP on 127.0.0.1 for a trainer that generates each case's
        first turn itself (serve.py; `pruefstand train --online`): prints one JSON line
        (url, manifest, cases) once it listens, then serves until ended.

Exit 0 done, 2 bad input (the message on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import DatasetError, EndpointPolicy, RolloutError, load_environment, steered_jobs
from . import dataset as ds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pruefstand_env", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("dataset", "rollouts", "serve"):
        p = sub.add_parser(name)
        p.add_argument("--plan", required=True)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out", required=True)
        p.add_argument("--root")
        p.add_argument("--pruefstand")
        p.add_argument("--kind", action="append", choices=ds.KINDS)
    p = sub.choices["rollouts"]
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--agent-json", help="a run's agent.json: the bench's agent as that run configured it")
    p.add_argument("--api-key-env", help="the variable holding the server's key")
    jobs = p.add_mutually_exclusive_group()
    jobs.add_argument("--jobs", type=int, default=4)
    jobs.add_argument("--jobs-from-run", metavar="RUN",
                      help="as many in flight as `pruefstand run`'s steering reached in RUN")
    p.add_argument("--tool-calling", choices=("native", "prompted"), default="native")
    p.add_argument("--retries", type=int, default=1)
    p.add_argument("--limit", type=int)
    p.add_argument("--repeat", type=int, default=1)
    p = sub.choices["serve"]
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--retries", type=int, default=1)
    p.add_argument("--max-turns", type=int, default=4, help="the policy's turns after the first (then the case ends)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens of each of the policy's later turns")
    p.add_argument("--temperature", type=float, default=0.0, help="of the policy's later turns")
    p.add_argument("--tool-choice", choices=("auto", "required"), default="auto",
                   help="of the policy's later turns (OpenAI's tool_choice; required: a call each turn)")
    args = parser.parse_args(argv)
    kinds = tuple(args.kind or ds.DEFAULT_KINDS)
    try:
        if args.command == "dataset":
            resolved = ds.resolve(args.plan, seed=args.seed, root=args.root, pruefstand=args.pruefstand)
            data = ds.build(resolved, kinds=kinds)
            from .rubric import Weights

            path = ds.write(data, args.out, kinds=kinds, weights=Weights().as_dict())
            print(path.read_text(encoding="utf-8"), end="")
            return 0
        env = load_environment(args.plan, seed=args.seed, out=args.out, root=args.root, pruefstand=args.pruefstand,
                               kinds=kinds, retries=args.retries)
        if args.command == "serve":
            from .serve import serve

            serve(env, port=args.port, max_turns=args.max_turns, max_tokens=args.max_tokens,
                  temperature=args.temperature, tool_choice=args.tool_choice)
            return 0
        import os

        key = os.environ.get(args.api_key_env) if args.api_key_env else None
        if args.agent_json:
            policy = EndpointPolicy.from_agent_json(args.agent_json, base_url=args.base_url, api_key=key,
                                                    pruefstand=args.pruefstand)
        else:
            policy = EndpointPolicy(args.base_url, args.model, api_key=key, pruefstand=args.pruefstand,
                                    tool_calling=args.tool_calling)
        jobs = args.jobs
        if args.jobs_from_run:
            jobs = steered_jobs(args.jobs_from_run, root=args.root, pruefstand=args.pruefstand)
        cases = env.cases[: args.limit] if args.limit else env.cases
        cases = [c for c in cases for _ in range(args.repeat)]
        t0 = time.monotonic()
        results = env.rollout_batch(cases, policy, jobs=jobs)
        wall = time.monotonic() - t0
    except (DatasetError, RolloutError, ValueError) as e:
        sys.stderr.write(f"pruefstand_env: {e}\n")
        return 2
    scored = [r for r in results if r.error is None]

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    summary = {
        **env.stats,
        "jobs": jobs,
        "wall_s": round(wall, 3),
        "rollouts_per_minute": round(60 * len(results) / wall, 2) if wall > 0 else None,
        "mean_agent_reward": mean(r.rewards["agent"] for r in scored),
        "mean_attacker_reward": mean(r.rewards["attacker"] for r in scored),
        "manifest": str(env.manifest_path),
    }
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
