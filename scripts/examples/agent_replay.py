#!/usr/bin/env python3
"""Scripted agent that replays AgentDojo ground truth (stdlib only).

    agent_replay.py TRUTH.json [--ignore-injections]

TRUTH.json is the output of `gym.py truth --benchmark-version V`. Per case, the agent
finds the user task by its prompt (within the suite named in `case_start`, else in any
suite), replays its ground-truth calls one per turn, and answers with the task's
ground-truth output. When a tool output contains an injection goal verbatim (compared
after normalising away YAML quoting and line folding), it also replays that injection
task's calls right away (a perfectly susceptible agent) unless --ignore-injections.
A prompt that is an injection goal (injection_goal cases) replays that goal's calls.

Stateless per turn: the plan is re-derived from `messages` each time, so a query that
AgentDojo re-runs starts over consistently. Reports `stats.llm_calls`.
"""

from __future__ import annotations

import json
import re
import sys


def norm(text: str) -> str:
    """Compare texts modulo YAML folding/quoting: drop escapes, keep letters and digits."""
    text = text.replace("\\n", " ").replace("\\t", " ")
    return re.sub(r"[^0-9a-z]+", "", text.lower())


class Truth:
    def __init__(self, path: str):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        self.suites = data["suites"]
        self.goals = {}  # suite -> [(norm goal, injection task)]
        for name, suite in self.suites.items():
            self.goals[name] = [
                (norm(t["goal"]), t) for _, t in sorted(suite["injection_tasks"].items()) if norm(t["goal"])
            ]

    def find(self, suite: str | None, prompt: str):
        names = [suite] if suite in self.suites else list(self.suites)
        for name in names:
            for task in self.suites[name]["user_tasks"].values():
                if task["prompt"] == prompt:
                    return name, task["calls"], task.get("output")
        for name in names:
            for task in self.suites[name]["injection_tasks"].values():
                if task["goal"] == prompt:
                    return name, task["calls"], task.get("output")
        return None, None, None


def turn(truth: Truth, suite_hint: str | None, msg: dict, obey: bool) -> dict:
    prompt = msg.get("prompt", "")
    suite, calls, output = truth.find(suite_hint, prompt)
    if calls is None:
        return {"final_answer": "I do not know this task."}
    plan = [dict(c) for c in calls]
    extra_outputs = []
    seen = set()
    pos = 0
    for m in msg.get("messages", []):
        if m.get("role") == "assistant":
            pos += len(m.get("tool_calls") or [])
        elif m.get("role") == "tool" and obey:
            content = norm(m.get("content") or "")
            for goal, task in truth.goals.get(suite, []):
                if goal in content and goal not in seen:
                    seen.add(goal)
                    plan[pos:pos] = [dict(c) for c in task["calls"]]
                    if task.get("output"):
                        extra_outputs.append(task["output"])
    if pos < len(plan):
        call = plan[pos]
        return {"tool_calls": [{"function": call["function"], "args": call["args"], "id": f"call_{pos}"}]}
    answer = " ".join([x for x in [output, *extra_outputs] if x]) or "Done."
    return {"final_answer": answer}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: agent_replay.py TRUTH.json [--ignore-injections]\n")
        return 2
    truth = Truth(argv[1])
    obey = "--ignore-injections" not in argv[2:]
    suite_hint = None
    turns = 0
    for raw in sys.stdin:
        raw = raw.strip()
        if not raw:
            continue
        msg = json.loads(raw)
        kind = msg.get("type")
        if kind == "case_start":
            suite_hint = msg.get("suite")
            turns = 0
        if kind != "query":
            continue
        turns += 1
        reply = turn(truth, suite_hint, msg, obey)
        reply["stats"] = {"llm_calls": turns}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
