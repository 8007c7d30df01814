"""Re-reads what `scripts/bench`'s `tools` part left in one or more work folders and
prints, per harness, the case scores (utility, ASR and the attack successes that are
context overflows) and, case by case, whether pruefstand made the same tool calls as
AgentDojo's runner and as inspect — without the servers, so it also works on a run that
was stopped part-way or on harnesses measured in separate bench runs.

    python3 benches/tools_compare.py WORK [WORK …] [--json OUT.json]

Each WORK may hold `run-tools/` (pruefstand's run directory), `agentdojo-tools-logs/`
(AgentDojo's logdir) and `inspect-tools.json` (benches/inspect_runner.py's result); the
last folder that has one wins. Plain python3; the parsing is scripts/bench's own (its
tools part, scripts/pruefstand_bench/tools.py), and pruefstand's run is read through
the binary (`pruefstand show`: BENCH_BIN, else the release build, made when stale).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load_bench():
    """The bench's tools part (scripts/pruefstand_bench/tools.py), whose parsing this reuses,
    and its common part (the binary)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from pruefstand_bench import common, tools

    return tools, common


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", nargs="+")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    b, common = load_bench()
    binary = None
    cases: dict[str, dict] = {}
    for w in map(Path, args.work):
        if (w / "run-tools").is_dir():
            binary = binary or common.ensure_binary()
            if found := b.norm_pruefstand(binary, w / "run-tools"):
                cases["pruefstand"] = found
        if (w / "agentdojo-tools-logs").is_dir():
            cases["AgentDojo"] = b.norm_agentdojo_logs(w / "agentdojo-tools-logs")
        if (w / "inspect-tools.json").exists():
            cases["inspect"] = b.norm_inspect(json.loads((w / "inspect-tools.json").read_text()))
    out: dict = {"scores": {}, "comparisons": {}}
    for name, c in cases.items():
        sc = b.score_cases(c)
        out["scores"][name] = sc
        print(f"{name:<11}: {len(c)} cases; utility {b.fmt(sc['utility'])} clean ({sc['clean']}), "
              f"{b.fmt(sc['utility_under_attack'])} under attack; ASR {b.fmt(sc['asr'])} ({sc['attack_successes']} of "
              f"{sc['attacked']}, {sc['attack_successes_overflow']} of them context overflows); goals met "
              f"{sc['goals_met']}/{sc['goals']}; {sc['overflows']} overflows, {sc['errors']} other errors; "
              f"{sc['tool_calls']} tool calls")
    for other in ("AgentDojo", "inspect"):
        if "pruefstand" in cases and other in cases:
            cmp_ = b.compare_calls(cases["pruefstand"], cases[other], "pruefstand", other)
            out["comparisons"][other] = cmp_
            print(f"same tool calls, pruefstand vs {other}: {cmp_['same']} of {cmp_['same'] + cmp_['differ']} cases")
            for d in cmp_["differences"]:
                print(f"  {d['case']:<36} call {d['first_difference_call']}: pruefstand {d['pruefstand']} | {other} "
                      f"{d[other]} ({d['pruefstand_calls']} vs {d[other + '_calls']} calls)"
                      + (f"; {d['why']}" if d["why"] else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
