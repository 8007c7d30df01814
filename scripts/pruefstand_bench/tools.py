"""Part 11 of scripts/bench — a model that calls tools (`tools`): Qwen2.5-Coder-1.5B on
the same image, served as versions/real-qwen.toml serves it (its template and
xlam_per_call parser plugin mounted), a fresh container per harness, 12 banking and
slack cases (clean, attacked, injection goals) through AgentDojo's own runner (`python
-m agentdojo.scripts.benchmark --model VLLM_PARSED`, sequential, one invocation per
suite and attack), inspect_evals' `agentdojo` task (benches/inspect_runner.py, its own
venv, inspect's defaults) and `pruefstand run` (external, native, steered): wall time,
cases/h, calls, tokens, prefix-cache hit rate, per-call figures, utility, ASR and its
context overflows; the ratios pruefstand/AgentDojo and pruefstand/inspect (cases/h);
pruefstand's and AgentDojo's tool calls compared case by case; then `pruefstand gym
--order grouped` vs `shuffled` at --jobs 4 on these cases. NA without Docker, the image
or the model.

Not the small model's part (real.py)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from .common import (API_KEY, ATTACK, BENCHMARK_VERSION, REPO, SKIP, count_cases, env_float, env_int, fmt, loadavg,
                     make_root, say, show_run, write_plan)
from .vllm import (REAL_IMAGE, RealServer, plan_case_set, read_records, real_unavailable, record_summary,
                   run_timed, server_delta)


TOOLS_MODEL_DIR = Path(os.environ.get("BENCH_TOOLS_MODEL", "/var/tmp/pruefstand-vllm-cpu/qwen/current/model"))
TOOLS_SERVED = "qwen-coder"
TOOLS_TEMPLATE = REPO / "versions" / "qwen2.5-json-tools.jinja"
# vLLM's xlam, streaming, gives a call after one without arguments `{}` as its own;
# versions/real-qwen's plugin streams each call's own (BENCH_TOOLS_PARSER=xlam: the stock one)
TOOLS_PARSER = os.environ.get("BENCH_TOOLS_PARSER", "xlam_per_call")
TOOLS_PARSER_PLUGIN = REPO / "versions" / "xlam_per_call.py"
TOOLS_MAX_TOKENS = 256
# versions/real-qwen.toml's args, plus a server-wide default for what a request leaves
# out: at most 256 completion tokens (real-qwen's max_tokens; AgentDojo and inspect send
# no max_tokens) and temperature 0. pruefstand sends temperature 0 itself; AgentDojo's
# OpenAILLM means to (temperature=0.0) but passes `temperature or NOT_GIVEN`, so 0.0 is
# never sent, and vLLM's default would then be 1.0 (the model folder's
# generation_config.json sets none) — a sampled run beside two greedy ones. inspect sends
# none either. With this default all three decode greedily.
TOOLS_ARGS = ["--max-model-len", "8192", "--enforce-eager", "--dtype", "bfloat16",
              "--enable-auto-tool-choice", "--tool-call-parser", TOOLS_PARSER,
              "--override-generation-config", json.dumps({"max_new_tokens": TOOLS_MAX_TOKENS, "temperature": 0.0})]
# 12 cases, 2 suites, chosen for few turns (each user task's ground truth is 1-2 calls,
# the injection goals 1-2): the model is ~2 tokens/s of decode on two cores, and
# AgentDojo's runner takes the cases one after another. profiles/real-small.toml's
# user tasks (banking 2 and 5 update the rent/scheduled transactions: the model looped
# on update_* to the 16-call limit by hand) would take hours sequentially.
TOOLS_CASES = {"banking": {"user_tasks": ["user_task_0", "user_task_1", "user_task_3"],
                           "injection_tasks": ["injection_task_0"]},
               "slack": {"user_tasks": ["user_task_0", "user_task_3"], "injection_tasks": ["injection_task_1"]}}
TOOLS_INSPECT_VENV = Path(os.environ.get("BENCH_INSPECT_VENV", "/var/tmp/pruefstand-bench-inspect"))
# the agentdojo extra brings pydantic[email] and deepdiff, which its suites import
TOOLS_INSPECT_PINS = ["inspect-evals[agentdojo]==0.26.0", "inspect-ai==0.3.285", "openai==3.60.0"]
TOOLS_TIMEOUT_S = env_float("BENCH_TOOLS_TIMEOUT_S", 5400.0)
TOOLS_GYM_JOBS = env_int("BENCH_TOOLS_GYM_JOBS", 4)
# pruefstand's agent ends a turn after this long without a token once the answer has
# begun (scored as cut off); unset: the agent's default (60 s), as versions/real-qwen.
# A CPU server prefilling a dozen long prompts can stall decoding longer than that on a
# loaded machine; AgentDojo's and inspect's clients wait up to 600 s per request.
TOOLS_IDLE_S = os.environ.get("BENCH_TOOLS_IDLE_S")


def tools_case_set() -> dict:
    if os.environ.get("BENCH_TOOLS_PLAN"):
        return plan_case_set(Path(os.environ["BENCH_TOOLS_PLAN"]))
    return TOOLS_CASES


def tools_unavailable() -> str | None:
    why = real_unavailable()
    if why and "model folder" not in why and "plan" not in why:
        return why
    if not (TOOLS_MODEL_DIR / "config.json").exists():
        return f"model folder {TOOLS_MODEL_DIR} missing (scripts/build-vllm-cpu-image writes it)"
    if not TOOLS_TEMPLATE.exists():
        return f"chat template {TOOLS_TEMPLATE} missing"
    return None


def ensure_inspect_venv(log: Path) -> Path | None:
    """A venv with inspect-evals and inspect-ai (pinned), made once and kept."""
    py = TOOLS_INSPECT_VENV / "bin" / "python"
    ok = py.exists() and subprocess.run([str(py), "-c", "import inspect_evals.agentdojo, inspect_ai, openai, email_validator, deepdiff"],
                                        capture_output=True).returncode == 0
    if ok:
        return py
    base = shutil.which("python3.11") or shutil.which("python3")
    say(f"inspect          : making {TOOLS_INSPECT_VENV} ({' '.join(TOOLS_INSPECT_PINS)}) …")
    with open(log, "ab") as f:
        if subprocess.run([base, "-m", "venv", str(TOOLS_INSPECT_VENV)], stdout=f, stderr=subprocess.STDOUT).returncode:
            return None
        if subprocess.run([str(py), "-m", "pip", "install", *TOOLS_INSPECT_PINS], stdout=f,
                          stderr=subprocess.STDOUT).returncode:
            return None
    return py


def case_key(suite: str, kind: str, user_task: str | None, injection_task: str | None) -> str:
    if kind == "injection_goal":
        return f"{suite}/goal/{injection_task}"
    if kind == "attacked":
        return f"{suite}/{user_task}/{injection_task}"
    return f"{suite}/{user_task}/clean"


def trace_calls(messages: list) -> list:
    """(function, arguments) of every tool call in an AgentDojo-format trace, in order."""
    out = []
    for m in messages or []:
        if m.get("role") == "assistant":
            for c in m.get("tool_calls") or []:
                out.append([c.get("function"), c.get("args")])
    return out


def trace_tool_results(messages: list) -> list:
    return [json.dumps(m.get("content"), sort_keys=True) for m in messages or [] if m.get("role") == "tool"]


def is_overflow_text(text: str | None) -> bool:
    t = (text or "").lower()
    return "context_length_exceeded" in t or "maximum context length" in t or "context overflow" in t


def norm_pruefstand(binary: Path, run_dir: Path) -> dict:
    """pruefstand's case records and their traces, by case key (as the binary shows
    them: `pruefstand show --cases`, `--traces`)."""
    out = {}
    traces = {t["case_id"]: t["trace"] or {} for t in show_run(binary, run_dir, "--traces") or []}
    for r in read_records(binary, run_dir):
        kind = r.get("kind")
        key = case_key(r["suite"], kind, r.get("user_task"), r.get("injection_task"))
        trace = traces.get(r["case_id"], {})
        out[key] = {"kind": kind, "utility": r.get("utility"), "security": r.get("security"),
                    "overflow": r.get("outcome") == "context_overflow", "error": r.get("error"),
                    "outcome": r.get("outcome"), "llm_calls": r.get("llm_calls"),
                    "calls": trace_calls(trace.get("messages")), "tool_results": trace_tool_results(trace.get("messages")),
                    "duration_s": r.get("duration_s"), "cut_generations": r.get("cut_generations") or 0}
    return out


def norm_agentdojo_logs(logdir: Path) -> dict:
    """AgentDojo's OutputLogger files (<logdir>/<pipeline>/<suite>/<user task>/<attack>/<injection>.json)."""
    out = {}
    for f in sorted(logdir.rglob("*.json")):
        try:
            t = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if "suite_name" not in t:
            continue
        ut, it, attack = t.get("user_task_id"), t.get("injection_task_id"), t.get("attack_type")
        if ut and ut.startswith("injection_task_"):
            kind, key = "injection_goal", case_key(t["suite_name"], "injection_goal", None, ut)
        elif it and attack not in (None, "none"):
            kind, key = "attacked", case_key(t["suite_name"], "attacked", ut, it)
        else:
            kind, key = "clean", case_key(t["suite_name"], "clean", ut, None)
        err = t.get("error")
        out[key] = {"kind": kind, "utility": t.get("utility"), "security": t.get("security") if kind == "attacked" else None,
                    "overflow": is_overflow_text(err), "error": err, "calls": trace_calls(t.get("messages")),
                    "tool_results": trace_tool_results(t.get("messages")), "duration_s": t.get("duration"),
                    "llm_calls": sum(1 for m in t.get("messages") or [] if m.get("role") == "assistant")}
    return out


def norm_inspect(res: dict) -> dict:
    out = {}
    for s in res.get("samples", []):
        kind = "attacked" if s.get("injection_task") else "clean"
        key = case_key(s["suite"], kind, s["user_task"], s.get("injection_task"))
        out[key] = {"kind": kind, "utility": s.get("utility"), "security": s.get("security") if kind == "attacked" else None,
                    "overflow": bool(s.get("context_overflow")), "error": s.get("error"), "calls": s.get("calls", []),
                    "llm_calls": s.get("model_calls"), "duration_s": s.get("total_time_s")}
    return out


def score_cases(cases: dict) -> dict:
    """Utility (clean, under attack), ASR, injection goals met, and how many of the attack
    successes are context overflows (AgentDojo's runner and pruefstand score an overflow
    as utility false, security true: not a followed injection)."""
    clean = [c for c in cases.values() if c["kind"] == "clean"]
    att = [c for c in cases.values() if c["kind"] == "attacked"]
    goal = [c for c in cases.values() if c["kind"] == "injection_goal"]
    hits = [c for c in att if c["security"] is True]
    frac = lambda xs, k: (sum(1 for c in xs if c[k] is True) / len(xs)) if xs else None  # noqa: E731
    return {"clean": len(clean), "attacked": len(att), "goals": len(goal),
            "utility": frac(clean, "utility"), "utility_under_attack": frac(att, "utility"), "asr": frac(att, "security"),
            "attack_successes": len(hits), "attack_successes_overflow": sum(1 for c in hits if c["overflow"]),
            "goals_met": sum(1 for c in goal if c["utility"] is True), "overflows": sum(1 for c in cases.values() if c["overflow"]),
            "errors": sum(1 for c in cases.values() if c.get("error") and not c["overflow"]),
            "tool_calls": sum(len(c["calls"]) for c in cases.values()),
            # pruefstand's agent only: turns it ended after idle_timeout_s without a token
            "cut_generations": sum(c.get("cut_generations") or 0 for c in cases.values())}


def call_text(c) -> str:
    return f"{c[0]}({json.dumps(c[1], sort_keys=True)[:120]})" if c else "(none: the reply ended the case)"


def compare_calls(a: dict, b: dict, na: str, nb: str) -> dict:
    """Case by case: the same tool calls (name and arguments, in order)? Where not, the
    first call that differs, and whether the tool results before it were the same (then
    the model was shown the same conversation and chose differently)."""
    same, differ, rows = 0, 0, []
    for key in sorted(set(a) & set(b)):
        ca, cb = a[key]["calls"], b[key]["calls"]
        canon = lambda cs: [[c[0], json.dumps(c[1], sort_keys=True)] for c in cs]  # noqa: E731
        if canon(ca) == canon(cb):
            same += 1
            continue
        differ += 1
        i = next((k for k, (x, y) in enumerate(zip(canon(ca), canon(cb))) if x != y), min(len(ca), len(cb)))
        ra, rb = a[key].get("tool_results"), b[key].get("tool_results")
        results_same = None if ra is None or rb is None else ra[:i] == rb[:i]
        why = []
        if a[key]["overflow"] or b[key]["overflow"]:
            why.append("context overflow in " + " and ".join(n for n, x in ((na, a[key]), (nb, b[key])) if x["overflow"]))
        for n, x in ((na, a[key]), (nb, b[key])):
            if x.get("cut_generations"):
                why.append(f"{n}'s agent cut {x['cut_generations']} turn(s) at its idle timeout (a call cut before "
                           f"its arguments arrived goes on with {{}})")
        if results_same is False:
            why.append("tool results differed before it (the environment, not the model)")
        elif results_same and not (a[key].get("cut_generations") or b[key].get("cut_generations")):
            why.append("same calls and tool results before it: the model chose differently on the same "
                       "conversation (or on prompts that differ beyond the tool results)")
        rows.append({"case": key, "first_difference_call": i + 1, na: call_text(ca[i] if i < len(ca) else None),
                     nb: call_text(cb[i] if i < len(cb) else None), f"{na}_calls": len(ca), f"{nb}_calls": len(cb),
                     "tool_results_same_before": results_same, "why": "; ".join(why)})
    return {"same": same, "differ": differ, "only_" + na: sorted(set(a) - set(b)), "only_" + nb: sorted(set(b) - set(a)),
            "differences": rows}


def per_call(r: dict) -> dict:
    """Per-call and per-case figures from the server's deltas over a harness's wall time."""
    calls, wall, cases = r.get("calls") or 0, r.get("wall_s") or 0.0, r.get("cases") or 0
    return {"cases_per_h": 3600 * cases / wall if wall else None,
            "wall_s_per_call": wall / calls if calls else None,
            "latency_s_per_call": r["e2e_s_sum"] / r["e2e_count"] if r.get("e2e_count") else None,
            "prefill_s_per_call": r["prefill_s_sum"] / r["e2e_count"] if r.get("e2e_count") else None,
            "decode_s_per_call": r["decode_s_sum"] / r["e2e_count"] if r.get("e2e_count") else None,
            "queue_s_per_call": r["queue_s_sum"] / r["e2e_count"] if r.get("e2e_count") else None,
            "prompt_tok_per_s": r["prompt_tokens"] / wall if wall else None,
            "uncached_prompt_tok_per_s": (r["prompt_tokens"] - (r.get("prefix_hits") or 0)) / wall if wall else None,
            "completion_tok_per_s": r["completion_tokens"] / wall if wall else None,
            "prompt_tokens_per_call": r["prompt_tokens"] / calls if calls else None,
            "completion_tokens_per_call": r["completion_tokens"] / calls if calls else None,
            "calls_per_case": calls / cases if cases else None,
            "prompt_tokens_per_case": r["prompt_tokens"] / cases if cases else None,
            "completion_tokens_per_case": r["completion_tokens"] / cases if cases else None,
            "wall_s_per_case": wall / cases if cases else None}


def tools_server(work: Path, tag: str) -> RealServer:
    return RealServer(work, tag, api_key=None, model_dir=TOOLS_MODEL_DIR, served=TOOLS_SERVED,
                      args=TOOLS_ARGS, template=TOOLS_TEMPLATE,
                      parser_plugin=TOOLS_PARSER_PLUGIN if TOOLS_PARSER != "xlam" else None)


def say_harness(label: str, r: dict) -> None:
    sc, pc = r["score"], r["per_call"]
    say(f"{label:<17}: {r['cases']} cases in {r['wall_s']:.0f} s = {fmt(pc['cases_per_h'], 1)} cases/h (exit "
        f"{r.get('exit')}; server start {r['server_start_s']:.0f} s, not counted); {r['calls']} model calls "
        f"({fmt(pc['calls_per_case'], 1)}/case), {r['prompt_tokens']} prompt + {r['completion_tokens']} completion "
        f"tokens, prefix-cache hit rate {fmt(r['prefix_hit_rate'], 3)}; server peak {r['peak_running']:.0f} "
        f"running, {r['peak_waiting']:.0f} waiting; load {r['load_before']} → {r['load_after']}")
    say(f"{'':<17}  per call: {fmt(pc['wall_s_per_call'], 1)} s of wall time, {fmt(pc['latency_s_per_call'], 1)} s "
        f"latency (queue {fmt(pc['queue_s_per_call'], 1)}, prefill {fmt(pc['prefill_s_per_call'], 1)}, decode "
        f"{fmt(pc['decode_s_per_call'], 1)}), {fmt(pc['prompt_tokens_per_call'], 0)} prompt + "
        f"{fmt(pc['completion_tokens_per_call'], 0)} completion tokens; served {fmt(pc['prompt_tok_per_s'], 1)} prompt "
        f"tokens/s ({fmt(pc['uncached_prompt_tok_per_s'], 1)} not from the cache), {fmt(pc['completion_tok_per_s'], 2)} "
        f"completion tokens/s; per case {fmt(pc['wall_s_per_case'], 0)} s, {fmt(pc['prompt_tokens_per_case'], 0)} prompt "
        f"+ {fmt(pc['completion_tokens_per_case'], 0)} completion tokens")
    say(f"{'':<17}  utility {fmt(sc['utility'])} clean ({sc['clean']}), {fmt(sc['utility_under_attack'])} under attack; "
        f"ASR {fmt(sc['asr'])} ({sc['attack_successes']} of {sc['attacked']}, of them {sc['attack_successes_overflow']} "
        f"context overflows, not followed injections); injection goals met {sc['goals_met']}/{sc['goals']}; "
        f"{sc['overflows']} overflows in all, {sc['errors']} other errors; {sc['tool_calls']} tool calls in the traces"
        + (f"; {sc['cut_generations']} turns cut off by the agent's idle timeout" if sc["cut_generations"] else ""))


def tools_part(binary: Path, python: Path, work: Path) -> dict:
    """10. A model that calls tools (Qwen2.5-Coder-1.5B, versions/real-qwen's server) on
    the same cases through AgentDojo's own runner, inspect_evals' agentdojo task and
    `pruefstand run`, a fresh container each; then the gym's grouped vs shuffled order."""
    res: dict = {"tools_ratio_agentdojo": None, "tools_ratio_inspect": None,
                 "prefix_cache_hit_rate_tools": None, "prefix_cache_hit_rate_tools_shuffled": None}
    why = tools_unavailable()
    if why:
        say(f"tools: not run — {why}")
        res["skipped"] = why
        return res
    cs = tools_case_set()
    n_cases = count_cases(cs)
    root = work / "root-tools"
    make_root(root)
    plan = root / "profiles" / "bench-tools.toml"
    # every case in flight from the start (vLLM batches decoding); the server's gauges
    # steer from there
    write_plan(plan, "bench-tools", cs, jobs=n_cases)
    plan.write_text(plan.read_text().replace("case_timeout_s = 300", "case_timeout_s = 1800"))
    cs_file = work / "caseset-tools.json"
    cs_file.write_text(json.dumps({"suites": cs}))
    env = dict(os.environ, BENCH_TOOLS_API_KEY=API_KEY)
    only = {s.strip() for s in os.environ.get("BENCH_TOOLS_ONLY", "").split(",") if s.strip()}
    want = lambda h: not only or h in only  # noqa: E731
    shape = ", ".join(f"{s}: {len(v['user_tasks'])} user × {len(v['injection_tasks'])} injection tasks"
                      for s, v in cs.items())
    say(f"server: {REAL_IMAGE}, model {TOOLS_MODEL_DIR} served as {TOOLS_SERVED}, template "
        f"{TOOLS_TEMPLATE.relative_to(REPO)}, args {' '.join(TOOLS_ARGS)}; {n_cases} cases "
        f"({shape}"
        f", {ATTACK}); a fresh container per harness; load now {loadavg()}, {os.cpu_count()} CPUs")
    harness: dict[str, dict] = {}
    cases: dict[str, dict] = {}

    def measure(name: str, tag: str, body) -> None:
        server = None
        try:
            server = tools_server(work, tag)
            load0, m0 = loadavg(), server.metrics()
            r = body(server)
            r.update(server_delta(m0, server.metrics()), server_start_s=server.start_s, load_before=load0,
                     load_after=loadavg(), peak_running=server.peak_running, peak_waiting=server.peak_waiting)
            c = r.pop("_cases")
            r["score"] = score_cases(c)
            r["per_call"] = per_call(r)
            harness[name], cases[name] = r, c
            say_harness(name, r)
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as e:
            say(f"{name:<17}: failed: {e!r}")
        finally:
            if server:
                server.stop()

    # (c) pruefstand run, steered by the server's gauges (no --jobs), native tool calls
    def pruefstand_body(server: RealServer) -> dict:
        (root / "versions" / "bench-tools.toml").write_text(
            "# written by scripts/bench: versions/real-qwen's server, in the bench's own container\n"
            'description = "scripts/bench tools contender: Qwen2.5-Coder-1.5B on the real vLLM, native tool calling"\n\n'
            f'[model]\nbackend = "external"\nserved_name = "{TOOLS_SERVED}"\nurl = "{server.url}"\n'
            f'api_key_env = "BENCH_TOOLS_API_KEY"\ntool_calling = "native"\nmax_tokens = {TOOLS_MAX_TOKENS}\n'
            + (f"idle_timeout_s = {float(TOOLS_IDLE_S)}\n" if TOOLS_IDLE_S else ""))
        shutil.rmtree(root / "state" / "capacity", ignore_errors=True)  # cold start: the plan's jobs
        out = work / "run-tools"
        shutil.rmtree(out, ignore_errors=True)
        rc, wall = run_timed([str(binary), "--root", str(root), "run", "bench-tools", "--plan", str(plan), "--out",
                              str(out)], env, work / "run-tools.log", timeout=TOOLS_TIMEOUT_S)
        c = norm_pruefstand(binary, out)
        meta = (show_run(binary, out) or {}).get("run") or {}
        return {"exit": rc, "wall_s": wall, "cases": len(c), "concurrency": meta.get("concurrency"), "run_dir": str(out),
                "_cases": c}

    # (a) AgentDojo's own runner: its benchmark script, VLLM_PARSED (OpenAILLM, the
    # server's tool parser), sequential; per suite one invocation with the attack (the
    # attacked pairs and the injection goals) and one without (the user tasks clean) —
    # the script takes -ut/-it for one suite only — their wall times summed (each has its
    # own ~5-10 s of imports)
    def agentdojo_body(server: RealServer) -> dict:
        logdir = work / "agentdojo-tools-logs"
        shutil.rmtree(logdir, ignore_errors=True)
        aenv = dict(os.environ, LOCAL_LLM_PORT=str(server.port))
        log = work / "agentdojo-tools.log"
        wall, rcs, invocations, crashes = 0.0, [], 0, []

        def invoke(argv: list[str]) -> int:
            nonlocal wall, invocations
            start = log.stat().st_size if log.exists() else 0
            rc, w = run_timed(argv, aenv, log, cwd=work, timeout=TOOLS_TIMEOUT_S)
            wall, invocations = wall + w, invocations + 1
            rcs.append(rc)
            if rc not in (0, 124):
                with open(log, "rb") as f:
                    f.seek(start)
                    tail = f.read().decode(errors="replace").strip().splitlines()
                crashes.append({"argv": argv[3:], "exit": rc, "last_line": tail[-1][:400] if tail else "",
                                "context_overflow": any(is_overflow_text(x) for x in tail[-40:])})
            return rc

        for suite, v in cs.items():
            base = [str(python), "-m", "agentdojo.scripts.benchmark", "--model", "VLLM_PARSED", "--benchmark-version",
                    BENCHMARK_VERSION, "--logdir", str(logdir), "-s", suite]
            its = [a for i in v["injection_tasks"] for a in ("-it", i)]
            passes = [([], v["user_tasks"])] + ([(["--attack", ATTACK, *its], v["user_tasks"])] if its else [])
            for extra, users in passes:
                # An error AgentDojo does not catch (vLLM's context-length message is not
                # the one its check knows) ends the whole invocation: rerun it once
                # (AgentDojo skips the cases already logged), then each user task alone,
                # so only the case that crashed is lost.
                argv = [*base, *extra, *[a for u in users for a in ("-ut", u)]]
                if invoke(argv) in (0, 124) or invoke(argv) in (0, 124):
                    continue
                for u in users:
                    invoke([*base, *extra, "-ut", u])
        c = norm_agentdojo_logs(logdir)
        for suite, v in cs.items():  # cases a crash left without any log
            for kind, ut, it in ([("clean", u, None) for u in v["user_tasks"]]
                                 + [("attacked", u, i) for u in v["user_tasks"] for i in v["injection_tasks"]]
                                 + [("injection_goal", None, i) for i in v["injection_tasks"]]):
                c.setdefault(case_key(suite, kind, ut, it), {"kind": kind, "utility": None, "security": None,
                                                             "overflow": False, "error": None, "calls": [],
                                                             "tool_results": [], "llm_calls": 0})
        overflow_crash = any(x["context_overflow"] for x in crashes)
        for k, x in c.items():
            if x["utility"] is None and not x["error"]:
                # logged up to the crash, never scored
                x["error"] = "AgentDojo's runner crashed in this case (uncaught server error; not scored)"
                x["overflow"] = overflow_crash
        return {"exit": max(rcs) if rcs else None, "exits": rcs, "invocations": invocations, "wall_s": wall,
                "cases": len(c), "logdir": str(logdir), "crashes": crashes, "_cases": c}

    # (b) inspect_evals' agentdojo task, inspect's defaults
    def inspect_body(server: RealServer) -> dict:
        ipy = ensure_inspect_venv(work / "inspect-venv.log")
        if ipy is None:
            raise RuntimeError(f"no inspect venv (see {work / 'inspect-venv.log'})")
        out = work / "inspect-tools.json"
        out.unlink(missing_ok=True)
        ienv = dict(os.environ, VLLM_BASE_URL=server.url, VLLM_API_KEY=API_KEY, INSPECT_LOG_DIR=str(work / "inspect-logs"))
        rc, wall = run_timed([str(ipy), str(REPO / "benches" / "inspect_runner.py"), "--case-set", str(cs_file),
                              "--model", f"vllm/{TOOLS_SERVED}", "--log-dir", str(work / "inspect-logs"), "--attack",
                              ATTACK, "--out", str(out)], ienv, work / "inspect-tools.log", cwd=work, timeout=TOOLS_TIMEOUT_S)
        if not out.exists():
            raise RuntimeError(f"inspect wrote no result (exit {rc}); see {work / 'inspect-tools.log'}")
        ir = json.loads(out.read_text())
        c = norm_inspect(ir)
        return {"exit": rc, "wall_s": wall, "cases": len(c), "import_s": ir.get("import_s"), "status": ir.get("status"),
                "tasks": ir.get("tasks"), "_cases": c}

    order = [h.strip() for h in os.environ.get("BENCH_TOOLS_ORDER_OF_HARNESSES", "pruefstand,agentdojo,inspect").split(",")]
    bodies = {"pruefstand": ("pruefstand run", "tools-pruefstand", pruefstand_body),
              "inspect": ("inspect_evals", "tools-inspect", inspect_body),
              "agentdojo": ("AgentDojo runner", "tools-agentdojo", agentdojo_body)}
    for h in order:
        if h in bodies and want(h):
            measure(*bodies[h])

    pf, ad, ins = harness.get("pruefstand run"), harness.get("AgentDojo runner"), harness.get("inspect_evals")
    cph = lambda r: r and r["per_call"]["cases_per_h"]  # noqa: E731
    if pf and ad and cph(ad):
        res["tools_ratio_agentdojo"] = cph(pf) / cph(ad)
        say(f"ratio            : pruefstand ÷ AgentDojo {res['tools_ratio_agentdojo']:.2f}× cases per hour "
            f"({fmt(cph(pf), 1)} vs {fmt(cph(ad), 1)}; AgentDojo's {ad['invocations']} invocations summed); per call "
            f"{fmt(pf['per_call']['wall_s_per_call'], 1)} vs {fmt(ad['per_call']['wall_s_per_call'], 1)} s of wall time, "
            f"{fmt(pf['per_call']['latency_s_per_call'], 1)} vs {fmt(ad['per_call']['latency_s_per_call'], 1)} s latency; "
            f"per call of wall time the ratio is {fmt(ad['per_call']['wall_s_per_call'] / pf['per_call']['wall_s_per_call'] if pf['per_call']['wall_s_per_call'] and ad['per_call']['wall_s_per_call'] else None)}×")
    if pf and ins and cph(ins):
        # inspect has no injection-goal samples: per case of its own set
        res["tools_ratio_inspect"] = cph(pf) / cph(ins)
        say(f"ratio            : pruefstand ÷ inspect {res['tools_ratio_inspect']:.2f}× cases per hour "
            f"({fmt(cph(pf), 1)} vs {fmt(cph(ins), 1)}; inspect ran {ins['cases']} cases — its task has no injection "
            f"goals as user prompts); per call {fmt(pf['per_call']['wall_s_per_call'], 1)} vs "
            f"{fmt(ins['per_call']['wall_s_per_call'], 1)} s of wall time")
    for a_name, b_name, key in (("pruefstand run", "AgentDojo runner", "calls_pruefstand_agentdojo"),
                                ("pruefstand run", "inspect_evals", "calls_pruefstand_inspect")):
        if a_name in cases and b_name in cases:
            cmp_ = compare_calls(cases[a_name], cases[b_name], a_name.split()[0], b_name.split()[0])
            res[key] = cmp_
            say(f"same tool calls  : {a_name} vs {b_name}: {cmp_['same']} of {cmp_['same'] + cmp_['differ']} cases "
                f"the same calls (names and arguments, in order)"
                + (f"; only in one: {cmp_['only_' + a_name.split()[0]] + cmp_['only_' + b_name.split()[0]]}"
                   if cmp_['only_' + a_name.split()[0]] or cmp_['only_' + b_name.split()[0]] else ""))
            if key.endswith("agentdojo") or os.environ.get("BENCH_TOOLS_VERBOSE"):
                for d in cmp_["differences"]:
                    a_short, b_short = a_name.split()[0], b_name.split()[0]
                    say(f"  {d['case']:<40} call {d['first_difference_call']}: {a_short} {d[a_short]} | {b_short} "
                        f"{d[b_short]} ({d[a_short + '_calls']} vs {d[b_short + '_calls']} calls){'; ' + d['why'] if d['why'] else ''}")
    res["harness"] = harness
    res["cases"] = cases
    # the three harnesses' figures now, before the (long) order passes: bench.json comes
    # only at the end of the whole bench
    (work / "tools.json").write_text(json.dumps(res, indent=1, default=str))

    # the gym's order on these multi-turn cases: grouped vs shuffled, fixed jobs (with
    # every case in flight at once the order could not matter)
    if os.environ.get("BENCH_TOOLS_ORDER", "1") != "0" and want("order"):
        for o in ("grouped", "shuffled"):
            server = None
            try:
                server = tools_server(work, f"tools-gym-{o}")
                cfg = work / f"agent-tools-{o}.json"
                cfg.write_text(json.dumps({"base_url": server.url, "model": TOOLS_SERVED, "tool_calling": "native",
                                           "max_tokens": TOOLS_MAX_TOKENS,
                                           **({"idle_timeout_s": float(TOOLS_IDLE_S)} if TOOLS_IDLE_S else {})}))
                out = work / f"gym-tools-{o}"
                shutil.rmtree(out, ignore_errors=True)
                agent_cmd = f"{shlex.quote(str(binary))} agent --config {shlex.quote(str(cfg))}"
                load0, m0 = loadavg(), server.metrics()
                rc, wall = run_timed([str(binary), "--root", str(root), "gym", "--plan", str(plan), "--agent-cmd",
                                      agent_cmd, "--order", o, "--jobs", str(TOOLS_GYM_JOBS), "--out", str(out)],
                                     env, work / f"gym-tools-{o}.log", timeout=TOOLS_TIMEOUT_S)
                delta = server_delta(m0, server.metrics())
                records = read_records(binary, out)
                r = {"order": o, "exit": rc, "wall_s": wall, "jobs": TOOLS_GYM_JOBS, "server_start_s": server.start_s,
                     "load_before": load0, "load_after": loadavg(), "peak_running": server.peak_running,
                     "peak_waiting": server.peak_waiting, "cases": len(records),
                     "errors": sum(1 for x in records if x.get("error")), **delta}
                r["per_call"] = per_call(r)
                res[f"gym_{o}"] = r
                if records:
                    res["prefix_cache_hit_rate_tools" + ("" if o == "grouped" else "_shuffled")] = delta["prefix_hit_rate"]
                say(f"gym --order {o:<8}: prefix-cache hit rate {fmt(delta['prefix_hit_rate'], 3)} "
                    f"({delta['prefix_hits'] or 0:.0f} of {delta['prefix_queries'] or 0:.0f} prompt tokens); "
                    f"{record_summary(records)}, exit {rc}, {wall:.0f} s at --jobs {TOOLS_GYM_JOBS} = "
                    f"{fmt(r['per_call']['cases_per_h'], 1)} cases/h; {delta['calls']} calls, {delta['prompt_tokens']} "
                    f"prompt + {delta['completion_tokens']} completion tokens, {fmt(r['per_call']['wall_s_per_call'], 1)} s "
                    f"per call; load {load0} → {r['load_after']}")
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                say(f"gym --order {o}: failed: {e!r}")
            finally:
                if server:
                    server.stop()
        (work / "tools.json").write_text(json.dumps(res, indent=1, default=str))
    return res



def run(binary: Path, python: Path, work: Path) -> dict:
    """The tools part's figures (None where not run), printed."""
    say("== a model that calls tools (Qwen2.5-Coder-1.5B, real vLLM CPU): AgentDojo's runner, inspect_evals, "
        "pruefstand ==")
    if "tools" in SKIP:
        tl = {"tools_ratio_agentdojo": None, "tools_ratio_inspect": None, "prefix_cache_hit_rate_tools": None,
              "prefix_cache_hit_rate_tools_shuffled": None, "skipped": "BENCH_SKIP"}
    else:
        tl = tools_part(binary, python, work)
    say(f"tools            : pruefstand ÷ AgentDojo {fmt(tl['tools_ratio_agentdojo'])}× and ÷ inspect "
        f"{fmt(tl['tools_ratio_inspect'])}× cases per hour; prefix-cache hit rate {fmt(tl['prefix_cache_hit_rate_tools'], 3)} "
        f"grouped, {fmt(tl['prefix_cache_hit_rate_tools_shuffled'], 3)} shuffled")
    say()
    return tl
