"""What every part of the bench shares: the repository, the benchmark's fixed choices
(AgentDojo version, suites, attack, the simulated model's name), the environment knobs
read by more than one part (BENCH_SKIP, BENCH_JOBS, the simulated latency, the seed),
printing, building the release binary and the venv, reading a run through the binary
(`show_run`: no part opens a run directory's files), the simulated model folder, case
sets and the plans written from them, and small /proc and Docker helpers.

Not here: a knob or helper of one part alone (it lives in that part's module), the
simulated server (sim.py) and the real one (vllm.py)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

# scripts/pruefstand_bench/common.py: the repository is three folders up
REPO = Path(__file__).resolve().parent.parent.parent
BENCHMARK_VERSION = "v1.2.2"
SUITES = ["workspace", "travel", "banking", "slack"]
ATTACK = "important_instructions"
MODEL = "bench/sim-8b"
API_KEY = "EMPTY"  # AgentDojo's `local` provider sends this fixed key
CLK_TCK = os.sysconf("SC_CLK_TCK")


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


SKIP = {s.strip() for s in os.environ.get("BENCH_SKIP", "").split(",") if s.strip()}
JOBS = env_int("BENCH_JOBS", 96)
LATENCY = {
    "base_ms": env_float("BENCH_BASE_MS", 40.0),
    "per_prompt_token_ms": env_float("BENCH_PROMPT_MS", 0.1),
    "per_completion_token_ms": env_float("BENCH_COMPLETION_MS", 20.0),
    "capacity": env_int("BENCH_CAPACITY", 32),
}
INSTANT = {"base_ms": 0.0, "per_prompt_token_ms": 0.0, "per_completion_token_ms": 0.0, "capacity": LATENCY["capacity"]}
SEED = env_int("BENCH_SEED", 2406)


def say(msg: str = "") -> None:
    print(msg, flush=True)


def fmt(x, digits=2) -> str:
    return "NA" if x is None else f"{x:.{digits}f}"


# --- build, venv, model folder -------------------------------------------------------


# This package: the bench's own code, not what the binary is built from (the single
# file it was had no .py name and so never counted).
BENCH_PACKAGE = Path(__file__).resolve().parent


def newest_source_mtime() -> float:
    """What the release binary is built from: the binary's and every crate's sources and
    manifests (crates/gym/build.rs embeds scripts/*.py etc.)."""
    newest = 0.0
    for base, exts in ((REPO / "src", (".rs",)), (REPO / "crates", (".rs", ".toml")),
                       (REPO / "scripts", (".py", ".txt", ".md", ".json", ".yaml", ".yml"))):
        for p in base.rglob("*"):
            if p.is_file() and p.name.endswith(exts) and "__pycache__" not in p.parts \
                    and BENCH_PACKAGE not in p.parents:
                newest = max(newest, p.stat().st_mtime)
    for name in ("Cargo.toml", "Cargo.lock", "build.rs"):
        if (REPO / name).exists():
            newest = max(newest, (REPO / name).stat().st_mtime)
    return newest


def ensure_binary() -> Path:
    if os.environ.get("BENCH_BIN"):
        return Path(os.environ["BENCH_BIN"]).resolve()
    binary = REPO / "target" / "release" / "pruefstand"
    if not binary.exists() or binary.stat().st_mtime < newest_source_mtime():
        say("building the release binary (cargo build --release) …")
        subprocess.run(["cargo", "build", "--release", "--bin", "pruefstand"], cwd=REPO, check=True)
        binary.touch()  # cargo may leave it untouched when only unrelated files changed
    return binary


def ensure_venv(binary: Path) -> tuple[Path, Path]:
    out = subprocess.run([str(binary), "setup"], capture_output=True, text=True, check=True).stdout
    python = re.search(r"venv: (.+)", out).group(1).strip()
    scripts = re.search(r"gym scripts: (.+)", out).group(1).strip()
    return Path(python), Path(scripts)


def gym_json(python: Path, scripts: Path, work: Path, *args: str) -> dict:
    out = subprocess.run([str(python), str(scripts / "gym.py"), *args], cwd=work, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


# --- runs, read through the binary -------------------------------------------------------

# `pruefstand show`'s exit status for a folder that is not a run directory (nothing to
# show), as distinct from a run it could not read (2).
NOT_A_RUN = 3


def show_run(binary: Path, run: Path | str, *flags: str, root: Path | None = None):
    """A run as the binary shows it (`pruefstand show`, docs/reports.md "A run as
    JSON"), never by opening its files: the run's object (facts, case counts, the
    verdict, the attacker's search), or with `--cases` / `--traces` the list of its case
    records / conversations; `--adaptive` reads the attacker's run of attempts. `run` is
    a run directory, or a word the binary resolves under `root` (a version name: its
    newest finished run). None when it is not a run (a run that failed before writing
    one); any other failure stops the bench with the binary's message."""
    argv = [str(binary)] + (["--root", str(root)] if root else []) + ["show", str(run), *flags]
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode == NOT_A_RUN:
        return None
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    if "--cases" in flags or "--traces" in flags:
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return json.loads(done.stdout)


def write_model_dir(path: Path, truth_text: str, latency: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "truth.json").write_text(truth_text)
    (path / "sim.toml").write_text(
        f"# scripts/bench: latency = base + prompt tokens × per_prompt + completion tokens × per_completion,\n"
        f"# at most `capacity` requests served at once (the rest queue).\n"
        f"seed = {SEED}\n\n[latency]\n"
        + "".join(f"{k} = {v}\n" for k, v in latency.items())
        + f'\n[models."{MODEL}"]\nsusceptibility = 0.35\nskill = 0.9\nerror_rate = 0.0\n'
    )


def make_root(root: Path) -> Path:
    """A bench root of its own for a part's runs (versions, profiles, reports and a
    pruefstand.toml); what each part copies or writes into it is its own."""
    for d in ("versions", "profiles", "reports"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "pruefstand.toml").write_text('[paths]\nreports = "reports"\n')
    return root


# --- case sets -------------------------------------------------------------------------


def natural_key(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def spread(items: list[str], k: int) -> list[str]:
    """k items evenly spread over the naturally sorted list (deterministic)."""
    items = sorted(items, key=natural_key)
    k = min(k, len(items))
    return [items[(i * len(items)) // k] for i in range(k)]


def case_set(inventory: dict, users: int, injections: int) -> dict:
    """Per suite: user tasks and injection tasks (those that ship a ground truth, so the
    simulated model can act an injection out)."""
    out = {}
    for s in SUITES:
        inv = inventory["suites"][s]
        out[s] = {"user_tasks": spread(inv["user_tasks"], users),
                  "injection_tasks": spread(inv["injection_tasks_with_ground_truth"], injections)}
    return out


def count_cases(cs: dict) -> int:
    return sum(len(v["user_tasks"]) * (1 + len(v["injection_tasks"])) + len(v["injection_tasks"]) for v in cs.values())


def write_plan(path: Path, name: str, cs: dict, jobs: int = JOBS) -> None:
    lines = [f"# written by scripts/bench: {count_cases(cs)} cases (clean + attacked + injection goals)",
             f'name = "{name}"', f'benchmark_version = "{BENCHMARK_VERSION}"', f'attacks = ["{ATTACK}"]',
             f"jobs = {jobs}", "case_timeout_s = 300", ""]
    for s, v in cs.items():
        lines += ["[[suites]]", f'name = "{s}"', f"user_tasks = {json.dumps(v['user_tasks'])}",
                  f"injection_tasks = {json.dumps(v['injection_tasks'])}", ""]
    path.write_text("\n".join(lines))




# --- processes -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def proc_status(pid: int, key: str) -> int | None:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])  # kB
    return None


def children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def loadavg() -> str:
    a = os.getloadavg()
    return f"{a[0]:.1f} {a[1]:.1f} {a[2]:.1f}"


def quantile(xs: list, q: float):
    """The q-quantile of xs, linear between order statistics (numpy's default); None
    for none."""
    if not xs:
        return None
    xs = sorted(xs)
    h = (len(xs) - 1) * q
    lo = int(h)
    return xs[lo] + (h - lo) * (xs[min(lo + 1, len(xs) - 1)] - xs[lo])


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)
