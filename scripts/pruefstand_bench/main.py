"""The bench's order: part 1 (the binary, the venv, the simulated model folders, the
bench root and its plans), then each part in turn, then bench.json and the summary, whose
last line is machine-readable. Not a part's measurement: each is its part's module."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from . import arm64, attacker, capacity, daemon, early, effect, eta, overhead, real, serve, steering, throughput, tools
from .common import (ATTACK, BENCHMARK_VERSION, INSTANT, JOBS, LATENCY, MODEL, SEED, SUITES, case_set, count_cases,
                     ensure_binary, ensure_venv, env_int, fmt, gym_json, make_root, say, write_model_dir, write_plan)
from . import rollouts  # part 14: the environment's rollouts
from .steering import AUTO_CAPACITIES


def main() -> int:
    t_bench = time.monotonic()
    work = Path(os.environ.get("BENCH_WORK") or tempfile.mkdtemp(prefix="pruefstand-bench-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    say(f"pruefstand bench — work folder {work}")
    binary = ensure_binary()
    python, scripts = ensure_venv(binary)
    inventory = gym_json(python, scripts, work, "inventory", "--benchmark-version", BENCHMARK_VERSION)
    truth_text = subprocess.run([str(python), str(scripts / "gym.py"), "truth", "--benchmark-version", BENCHMARK_VERSION],
                                cwd=work, capture_output=True, text=True, check=True).stdout
    model = work / "model"
    write_model_dir(model, truth_text, LATENCY)
    write_model_dir(work / "model-instant", truth_text, INSTANT)

    root = work / "root"
    make_root(root)
    cs_tp = case_set(inventory, env_int("BENCH_USERS", 3), env_int("BENCH_INJ", 2))
    cs_cap = case_set(inventory, env_int("BENCH_SCALE_USERS", 16), env_int("BENCH_SCALE_INJ", 5))
    cs_ovh = case_set(inventory, env_int("BENCH_OVH_USERS", 3), env_int("BENCH_OVH_INJ", 2))
    cs_tiny = {"banking": {"user_tasks": ["user_task_0"], "injection_tasks": []}}
    for name, cs in (("bench-throughput", cs_tp), ("bench-capacity", cs_cap), ("bench-overhead", cs_ovh),
                     ("bench-tiny", cs_tiny)):
        write_plan(root / "profiles" / f"{name}.toml", name, cs)
    # the plan's default jobs (4): where a model never run before starts
    write_plan(root / "profiles" / "bench-auto.toml", "bench-auto", cs_cap, jobs=4)
    lat = LATENCY
    say(f"model: simulated {MODEL}, seed {SEED}; latency {lat['base_ms']:g} ms + {lat['per_prompt_token_ms']:g} ms/prompt "
        f"token + {lat['per_completion_token_ms']:g} ms/completion token, capacity {lat['capacity']}")
    say(f"case sets ({BENCHMARK_VERSION}, {ATTACK}, suites {', '.join(SUITES)}): throughput {count_cases(cs_tp)}, "
        f"capacity {count_cases(cs_cap)}, overhead {count_cases(cs_ovh)} cases; pruefstand --jobs {JOBS}")
    say()

    ad, pf, throughput_ratio = throughput.run(binary, python, work, root, model, cs_tp)
    cap, capacity_fraction = capacity.run(binary, work, root, model, ad, pf)
    ovh = overhead.run(binary, python, work, root, cs_ovh)
    auto, pss_96, per_case, cpu_per_case = steering.run(binary, work, root, truth_text, cap, ovh)
    dm = daemon.run(binary, work, truth_text, root)
    es, frac, fixed, steered = early.run(binary, work)
    et = eta.run(binary, work)
    rl = real.run(binary, python, work)
    sv = serve.run(binary, work)
    a64 = arm64.run(work)
    tl = tools.run(binary, python, work)
    atk = attacker.run(binary, work)
    summary = {"latency": LATENCY, "jobs": JOBS, "agentdojo": ad and {k: v for k, v in ad.items() if k != "results"},
               "pruefstand": {k: v for k, v in pf.items() if k != "records"},
               "capacity": {k: v for k, v in cap.items() if k != "records"},
               "overhead": {n: {k: v for k, v in r.items() if k not in ("records", "results")} for n, r in ovh.items()},
               "auto": {c: {k: v for k, v in r.items() if k != "records"} for c, r in auto.items()},
               "gym_pss_mib_96": pss_96, "gym_pss_mib_per_case": per_case, "cpu_s_per_case": cpu_per_case,
               "daemon": dm, "throughput_ratio": throughput_ratio, "capacity_fraction": capacity_fraction,
               "early_stop": es, "eta": et, "real": rl, "serve": sv, "arm64": a64, "tools": tl,
               "attacker": atk}
    summary["effect"] = effect.run(binary, work)  # part 13, opt-in (BENCH_EFFECT=1): hours
    summary["rollouts"] = rollouts.run(binary, python, scripts, work, root, model, cs_tp)  # part 14
    (work / "bench.json").write_text(json.dumps(summary, indent=1))
    say(f"targets: throughput_ratio ≥ 10, capacity_fraction ≥ 0.85, idle_cpu_s ≤ 0.05, "
        f"idle_rss_mib ≤ 30, pickup_ms ≤ 500, capacity_auto_* ≥ 0.85, gym_pss_mib_96 ≤ 1024, "
        f"cpu_s_per_case ≤ 0.134, early_stop_fraction_asr01 ≤ 0.5, early_stop_fraction_asr30 ≤ 0.2, early_stop_fraction_with_reference ≤ 0.6 — printed, not asserted; details in {work / 'bench.json'}; "
        f"bench took {time.monotonic() - t_bench:.0f} s")
    say(f"throughput_ratio={fmt(throughput_ratio, 1)} capacity_fraction={fmt(capacity_fraction)} "
        f"idle_cpu_s={fmt(dm['idle_cpu_s'], 3)} idle_rss_mib={fmt(dm['idle_rss_mib'], 1)} pickup_ms={fmt(dm['pickup_ms'], 0)} "
        + " ".join(f"capacity_auto_{c}={fmt(auto[c]['capacity_fraction'] if c in auto else None)}" for c in AUTO_CAPACITIES)
        + f" gym_pss_mib_96={fmt(pss_96, 0)} cpu_s_per_case={fmt(cpu_per_case, 3)}"
        + f" early_stop_fraction_asr01={fmt(frac['asr01'])} early_stop_fraction_asr30={fmt(frac['asr30'])}"
          f" early_stop_fraction_with_reference={fmt(frac['with_reference'])}"
          f" early_stop_fraction_with_reference_p10={fmt(fixed.get('p10_fraction'))}"
          f" early_stop_fraction_with_reference_p90={fmt(fixed.get('p90_fraction'))}"
          f" early_stop_fraction_with_reference_steered={fmt(steered.get('median_fraction'))}"
          f" early_stop_fraction_with_reference_steered_p10={fmt(steered.get('p10_fraction'))}"
          f" early_stop_fraction_with_reference_steered_p90={fmt(steered.get('p90_fraction'))}"
        + f" eta_error_recent={fmt(et['eta_error_recent'])} eta_error_average={fmt(et['eta_error_average'])}"
        + f" prefix_cache_hit_rate_real={fmt(rl['prefix_cache_hit_rate_real'], 3)}"
        + f" prefix_cache_hit_rate_real_shuffled={fmt(rl['prefix_cache_hit_rate_real_shuffled'], 3)}"
        + f" real_throughput_ratio={fmt(rl['real_throughput_ratio'])}"
        + f" serve_rss_mib_start={fmt(sv['serve_rss_mib_start'], 1)} serve_rss_mib_stalled={fmt(sv['serve_rss_mib_stalled'], 1)}"
          f" serve_rss_mib_after={fmt(sv['serve_rss_mib_after'], 1)}"
        + f" arm64_emulation_slowdown={fmt(a64['arm64_emulation_slowdown'], 1)}"
        + f" tools_ratio_agentdojo={fmt(tl['tools_ratio_agentdojo'])} tools_ratio_inspect={fmt(tl['tools_ratio_inspect'])}"
        + f" prefix_cache_hit_rate_tools={fmt(tl['prefix_cache_hit_rate_tools'], 3)}"
        + f" prefix_cache_hit_rate_tools_shuffled={fmt(tl['prefix_cache_hit_rate_tools_shuffled'], 3)}"
        + f" attacker_busy_share_campaign_sim={fmt(_sim_busy(atk))}"
        + f" attacker_busy_share_campaign_real={fmt(_real_busy(atk))}")
    return 0


def _sim_busy(atk: dict) -> float | None:
    """The paced simulated server's busy share during the simulated attacker's campaign (part 12)."""
    return ((atk.get("paced") or {}).get("model") or {}).get("busy_share_campaign")


def _real_busy(atk: dict) -> float | None:
    """The real server's busy share during the attacker model's campaign (part 12), if it ran."""
    return ((atk.get("real") or {}).get("model") or {}).get("busy_share_campaign")
