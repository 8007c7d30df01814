"""Part 8 of scripts/bench — the real vLLM (its CPU build, Docker image pruefstand-vllm-
cpu:current, SmolLM2-135M) on profiles/real-small.toml's 12 cases, a fresh container per
measurement (empty prefix cache): the prefix-cache hit rate (vLLM's own token counters,
deltas over the run) of `pruefstand gym --order grouped` (the gym's order) and `--order
shuffled` with pruefstand's agent (native tool calling, max_tokens 128); then wall time
of AgentDojo's runner (`local` provider, prompted) and of `pruefstand run` (an
`external` version, native) on the same cases, and their ratio. NA without Docker, the
image or the model folder.

Not a model that calls tools well (tools.py)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from .common import API_KEY, REPO, SKIP, fmt, loadavg, make_root, say, show_run
from .contenders import run_agentdojo
from .vllm import (REAL_IMAGE, REAL_MAX_TOKENS, REAL_MODEL_DIR, REAL_PASS_TIMEOUT_S, REAL_PLAN, REAL_SERVED,
                   RealServer, plan_case_set, read_records, real_unavailable, record_summary, run_timed,
                   server_delta)


def real_part(binary: Path, python: Path, work: Path) -> dict:
    """8. The real vLLM: prefix-cache hit rate of the gym's grouped order vs a seeded
    shuffle, and AgentDojo's runner vs `pruefstand run` on the same 12 cases."""
    res: dict = {"prefix_cache_hit_rate_real": None, "prefix_cache_hit_rate_real_shuffled": None,
                 "real_throughput_ratio": None}
    why = real_unavailable()
    if why:
        say(f"real: not run — {why}")
        res["skipped"] = why
        return res
    root = work / "root-real"
    make_root(root)
    env = dict(os.environ, PRUEFSTAND_API_KEY=API_KEY, BENCH_REAL_API_KEY=API_KEY)
    say(f"server: {REAL_IMAGE} (vLLM CPU build), model {REAL_MODEL_DIR}, served as {REAL_SERVED}; "
        f"plan {REAL_PLAN.relative_to(REPO)}; a fresh container per measurement; load now {loadavg()}")

    # 8a. prefix cache: the gym with pruefstand's own agent, grouped vs shuffled
    for order in ("grouped", "shuffled"):
        key = "prefix_cache_hit_rate_real" + ("" if order == "grouped" else "_shuffled")
        server = None
        try:
            # No API key on this server: `pruefstand gym` hands its agents only a minimal
            # environment (PATH, HOME, locale …), so PRUEFSTAND_API_KEY would not reach
            # `pruefstand agent`, and the gym has no way to pass one.
            server = RealServer(work, f"gym-{order}", api_key=None)
            cfg = work / f"agent-real-{order}.json"
            cfg.write_text(json.dumps({"base_url": server.url, "model": REAL_SERVED, "tool_calling": "native",
                                       "max_tokens": REAL_MAX_TOKENS}))
            out = work / f"gym-real-{order}"
            shutil.rmtree(out, ignore_errors=True)
            agent_cmd = f"{shlex.quote(str(binary))} agent --config {shlex.quote(str(cfg))}"
            load0, m0 = loadavg(), server.metrics()
            rc, wall = run_timed([str(binary), "--root", str(root), "gym", "--plan", str(REAL_PLAN), "--agent-cmd",
                                  agent_cmd, "--order", order, "--out", str(out)], env, work / f"gym-real-{order}.log")
            delta = server_delta(m0, server.metrics())
            records = read_records(binary, out)
            r = {"order": order, "exit": rc, "wall_s": wall, "server_start_s": server.start_s, "load_before": load0,
                 "load_after": loadavg(), "peak_running": server.peak_running, "peak_waiting": server.peak_waiting,
                 "cases": len(records), "errors": sum(1 for x in records if x.get("error")), **delta}
            res[f"gym_{order}"] = r
            if records and r["errors"] < len(records):
                res[key] = delta["prefix_hit_rate"]
            say(f"gym --order {order:<8}: prefix-cache hit rate {fmt(delta['prefix_hit_rate'], 3)} "
                f"({delta['prefix_hits']:.0f} of {delta['prefix_queries']:.0f} prompt tokens) — "
                f"{record_summary(records)}, exit {rc}, {wall:.0f} s; {delta['calls']} calls, "
                f"{delta['prompt_tokens']} prompt + {delta['completion_tokens']} completion tokens; server start "
                f"{server.start_s:.0f} s; peak {server.peak_running:.0f} running, {server.peak_waiting:.0f} waiting; "
                f"load {load0} → {r['load_after']}")
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            say(f"gym --order {order}: failed: {e}")
        finally:
            if server:
                server.stop()
    if res["prefix_cache_hit_rate_real"] is not None:
        say(f"counters         : {' / '.join(n or '?' for n in res['gym_grouped']['prefix_names'])} (deltas over each run)")

    # 8b. throughput: AgentDojo's runner vs pruefstand run, the same 12 cases, a fresh
    # server each
    cs = plan_case_set(REAL_PLAN)
    ad = pf = None
    server = None
    try:
        server = RealServer(work, "agentdojo")
        load0, m0 = loadavg(), server.metrics()
        ad = run_agentdojo(python, work, server, cs, "real", model_id=REAL_SERVED, timeout=REAL_PASS_TIMEOUT_S)
        ad.update(server_delta(m0, server.metrics()), server_start_s=server.start_s, load_before=load0,
                  load_after=loadavg(), peak_running=server.peak_running)
        clean = [v for r in ad["results"].values() for v in r.get("clean", {}).values()]
        say(f"AgentDojo runner : {ad['cases']} cases, clean utility {sum(clean)}/{len(clean)}, "
            f"in {ad['wall_s']:.0f} s ({ad['import_s']:.1f} s imports; "
            f"`local` provider, prompted tool calling, sequential); {ad['calls']} calls, {ad['prompt_tokens']} "
            f"prompt + {ad['completion_tokens']} completion tokens, prefix-cache hit rate "
            f"{fmt(ad['prefix_hit_rate'], 3)}; load {load0} → {ad['load_after']}")
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        say(f"AgentDojo runner : failed: {e} (see {work / 'agentdojo-real.log'})")
        ad = None
    finally:
        if server:
            server.stop()
    server = None
    try:
        server = RealServer(work, "pruefstand")
        (root / "versions" / "bench-real.toml").write_text(
            "# written by scripts/bench: the real vLLM (CPU build) in the bench's own container\n"
            'description = "scripts/bench contender: the real vLLM, external, native tool calling"\n\n'
            f'[model]\nbackend = "external"\nserved_name = "{REAL_SERVED}"\nurl = "{server.url}"\n'
            f'api_key_env = "BENCH_REAL_API_KEY"\ntool_calling = "native"\nmax_tokens = {REAL_MAX_TOKENS}\n')
        shutil.rmtree(root / "state" / "capacity", ignore_errors=True)  # cold start: the plan's jobs
        out = work / "run-real"
        shutil.rmtree(out, ignore_errors=True)
        load0, m0 = loadavg(), server.metrics()
        rc, wall = run_timed([str(binary), "--root", str(root), "run", "bench-real", "--plan", str(REAL_PLAN),
                              "--out", str(out)], env, work / "run-real.log")
        delta = server_delta(m0, server.metrics())
        records = read_records(binary, out)
        meta = (show_run(binary, out) or {}).get("run") or {}
        pf = {"exit": rc, "wall_s": wall, "cases": len(records), "errors": sum(1 for x in records if x.get("error")),
              "server_start_s": server.start_s, "load_before": load0, "load_after": loadavg(),
              "peak_running": server.peak_running, "peak_waiting": server.peak_waiting,
              "concurrency": meta.get("concurrency"), **delta}
        cc = pf["concurrency"] or {}
        say(f"pruefstand run   : {record_summary(records)}, exit {rc}, in {wall:.0f} s (native tool calling, "
            f"in flight {cc.get('start')} → {cc.get('settled')}, peak {cc.get('peak_in_flight')}); {delta['calls']} "
            f"calls, {delta['prompt_tokens']} prompt + {delta['completion_tokens']} completion tokens, prefix-cache "
            f"hit rate {fmt(delta['prefix_hit_rate'], 3)}; server peak {server.peak_running:.0f} running, "
            f"{server.peak_waiting:.0f} waiting; load {load0} → {pf['load_after']}")
        if not records:
            pf = None
            say(f"pruefstand run   : no cases recorded; see {work / 'run-real.log'}")
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        say(f"pruefstand run   : failed: {e}")
    finally:
        if server:
            server.stop()
    if ad and pf:
        res["real_throughput_ratio"] = ad["wall_s"] / pf["wall_s"]
        say(f"ratio            : {res['real_throughput_ratio']:.2f}× (AgentDojo {ad['wall_s']:.0f} s ÷ pruefstand "
            f"{pf['wall_s']:.0f} s, wall time each, server start-up excluded)")
    res["agentdojo"] = ad and {k: v for k, v in ad.items() if k != "results"}
    res["agentdojo_results"] = ad and ad.get("results")
    res["pruefstand"] = pf
    return res


def run(binary: Path, python: Path, work: Path) -> dict:
    """The real part's figures (None where not run), printed."""
    say("== the real vLLM (CPU build): prefix cache by order, AgentDojo's runner vs pruefstand ==")
    if "real" in SKIP:
        rl = {"prefix_cache_hit_rate_real": None, "prefix_cache_hit_rate_real_shuffled": None,
              "real_throughput_ratio": None, "skipped": "BENCH_SKIP"}
    else:
        rl = real_part(binary, python, work)
    say(f"prefix cache     : hit rate {fmt(rl['prefix_cache_hit_rate_real'], 3)} grouped (the gym's order), "
        f"{fmt(rl['prefix_cache_hit_rate_real_shuffled'], 3)} shuffled; AgentDojo ÷ pruefstand wall time "
        f"{fmt(rl['real_throughput_ratio'])}")
    say()
    return rl
