#!/usr/bin/env python3
"""pruefstand gym: the bridge between pruefstand (Rust) and AgentDojo (docs/protocol.md).

    gym.py inventory --benchmark-version V    suites, tasks, attacks (one JSON object)
    gym.py truth --benchmark-version V        ground truth for the simulated model
    gym.py run --request FILE                 run cases; JSON events on stdout
    gym.py selftest                           offline checks (no model, no network)
    gym.py validate --schema NAME FILE        check a file against a contract schema
                                              (case-record: JSON lines; gym-request)

Exit status: 0 ok, 1 failure (selftest failures, internal error), 2 bad input or an
agentdojo install that does not match (message on stderr, nothing on stdout).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def _fail(message: str, code: int = 2) -> int:
    sys.stderr.write(f"gym: {message}\n")
    sys.stderr.flush()
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gym.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("inventory", "truth"):
        p = sub.add_parser(name)
        p.add_argument("--benchmark-version", required=True)
    p = sub.add_parser("run")
    p.add_argument("--request", required=True)
    p.add_argument(
        "--agent-env-stdin",
        action="store_true",
        help="read {\"agent_env\": {NAME: value}} as one JSON line from stdin: variables for the agents only",
    )
    sub.add_parser("selftest")
    p = sub.add_parser("validate")
    p.add_argument("--schema", required=True, choices=("case-record", "gym-request"))
    p.add_argument("file")
    args = parser.parse_args(argv)

    if args.command == "selftest":
        import selftest

        return selftest.main()
    if args.command == "validate":
        from pruefstand_gym import schema

        found = schema.validate_file(args.schema, args.file)
        for problem in found:
            print(problem)
        print(f"{args.file}: {'conforms to' if not found else 'breaks'} {args.schema}")
        return 1 if found else 0

    from pruefstand_gym.records import RequestError

    try:
        if args.command == "run":
            from pruefstand_gym import runner

            return runner.run(args.request, agent_env_stdin=args.agent_env_stdin)

        from pruefstand_gym import dojo

        try:
            dojo.check_api()
        except dojo.ApiMismatch as e:
            return _fail(str(e))
        if args.command == "inventory":
            dojo.dump(dojo.inventory(args.benchmark_version))
        else:
            dojo.dump(dojo.truth(args.benchmark_version))
        return 0
    except RequestError as e:
        return _fail(str(e))
    except Exception as e:  # noqa: BLE001
        from pruefstand_gym.dojo import ApiMismatch

        if isinstance(e, ApiMismatch):
            return _fail(str(e))
        raise


if __name__ == "__main__":
    raise SystemExit(main())
