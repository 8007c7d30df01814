"""scripts/pruefstand_bench — pruefstand's shipped benchmark of its performance targets,
run as `scripts/bench` (a launcher that calls main.main()).

One invocation, plain python3 (stdlib only; AgentDojo runs in the managed venv), no
arguments: the environment knobs below choose what runs.

The parts, one module each (each module's docstring says what it measures):

  1. main.py        builds the release binary if it is stale, ensures the venv (`pruefstand
                    setup`), writes a simulated model folder (sim.toml + truth.json) and
                    serves it with `pruefstand sim-serve` (sim.py) on a free 127.0.0.1 port —
                    a fresh server per contender, same seed, same latency model; runs the
                    parts in this order and writes bench.json
  2. throughput.py  AgentDojo's own sequential runner vs `pruefstand run`, same case set
  3. capacity.py    a voll-shaped slice against the server's ideal time
  4. overhead.py    framework overhead with an instant model
  5. steering.py    concurrency steered by the server (no --jobs); the gym's memory
  6. daemon.py      the daemon at rest and its pickup latency
  7. early.py       early stopping on real `voll` runs
  7b. eta.py        the ETA against the real end
  8. real.py        the real vLLM (CPU build): prefix cache by order, throughput
  9. serve.py       `pruefstand serve` with clients that never read
 10. arm64.py       arm64 under emulation (context, not a target)
 11. tools.py       a model that calls tools: AgentDojo's runner, inspect_evals, pruefstand
 12. attacker.py    the adaptive attacker: budget curves, transfer, cost per attempt, busy share
 14. rollouts.py    the environment's rollouts (steered concurrency) vs `pruefstand run` and AgentDojo's runner

Shared: common.py (knobs, printing, build, venv, case sets, plans, /proc helpers),
sim.py (the simulated server), contenders.py (the two runners on it), vllm.py (the real
server in Docker).

Results are printed, never asserted. The last line is machine-readable:
  throughput_ratio=… capacity_fraction=… idle_cpu_s=… idle_rss_mib=… pickup_ms=…
  capacity_auto_8=… capacity_auto_32=… capacity_auto_128=… gym_pss_mib_96=… cpu_s_per_case=…
  early_stop_fraction_asr01=… early_stop_fraction_asr30=… early_stop_fraction_with_reference=…
  early_stop_fraction_with_reference_p10=… early_stop_fraction_with_reference_p90=…
  early_stop_fraction_with_reference_steered=… early_stop_fraction_with_reference_steered_p10=…
  early_stop_fraction_with_reference_steered_p90=… eta_error_recent=… eta_error_average=…
  prefix_cache_hit_rate_real=… prefix_cache_hit_rate_real_shuffled=… real_throughput_ratio=…
  serve_rss_mib_start=… serve_rss_mib_stalled=… serve_rss_mib_after=…
  arm64_emulation_slowdown=… tools_ratio_agentdojo=… tools_ratio_inspect=…
  prefix_cache_hit_rate_tools=… prefix_cache_hit_rate_tools_shuffled=… attacker_busy_share_campaign_sim=…
  attacker_busy_share_campaign_real=…

Environment (all optional):
  BENCH_USERS=3 BENCH_INJ=2            throughput case set: per suite, user tasks × injection tasks
  BENCH_SCALE_USERS=16 BENCH_SCALE_INJ=5   capacity slice (0 = reuse the throughput run)
  BENCH_OVH_USERS=3 BENCH_OVH_INJ=2    overhead case set (instant model)
  BENCH_JOBS=96                        pruefstand's --jobs (3 × capacity: see README)
  BENCH_BASE_MS=40 BENCH_PROMPT_MS=0.1 BENCH_COMPLETION_MS=20 BENCH_CAPACITY=32 BENCH_SEED=2406
  BENCH_IDLE_S=60                      daemon idle windows
  BENCH_AUTO_CAPACITIES=8,32,128      server capacities of the no---jobs runs
  BENCH_EARLY_SEEDS=8 BENCH_EARLY_JOBS=4   early stopping: voll runs per ASR, their --jobs (cases in flight)
  BENCH_EARLY_REF_SEEDS=20 BENCH_EARLY_REF_JOBS=8   demo-kandidat's orders per setting, the fixed setting's --jobs
  BENCH_REAL_IMAGE=pruefstand-vllm-cpu:current   the real part's image
  BENCH_REAL_MODEL=/var/tmp/pruefstand-vllm-cpu/current/model   its model folder
  BENCH_REAL_READY_S=900 BENCH_REAL_TIMEOUT_S=5400   server start-up limit; limit per pass
  BENCH_TOOLS_MODEL=/var/tmp/pruefstand-vllm-cpu/qwen/current/model   the tools part's model folder
  BENCH_TOOLS_PLAN=FILE                the tools part's cases from a plan (default: 12 few-turn cases)
  BENCH_TOOLS_PARSER=xlam_per_call     the tool parser (xlam: vLLM's own, without the plugin)
  BENCH_INSPECT_VENV=/var/tmp/pruefstand-bench-inspect   inspect's venv (made when missing)
  BENCH_TOOLS_ONLY=pruefstand,agentdojo,inspect,order   a subset of the tools part
  BENCH_TOOLS_ORDER_OF_HARNESSES=pruefstand,agentdojo,inspect   their order
  BENCH_TOOLS_ORDER=1 BENCH_TOOLS_GYM_JOBS=4 BENCH_TOOLS_TIMEOUT_S=5400   order passes (0: none), their jobs; limit per pass
  BENCH_SERVE_CLIENTS=100              serve: clients that never read
  BENCH_ETA_BASE_MS=600 BENCH_ETA_CAPACITY=8   the ETA runs' simulated latency per call and server capacity
  BENCH_ATTACKER_BASE_MS=2000 BENCH_ATTACKER_TOKEN_MS=30   the attacker part's paced server: ms per call, per completion token
  BENCH_SKIP=agentdojo,capacity,overhead,auto,daemon,early,eta,real,serve,arm64,tools,rollouts   parts to leave out (reported NA)
  BENCH_WORK=DIR                       work folder (default: a fresh temp folder, kept)
  BENCH_BIN=PATH                       use this binary; no build
  BENCH_FAKE_NVML=PATH                 fake libnvidia-ml .so (default: built from
                                       tests/fixtures/fake_nvml.c when present)
"""
