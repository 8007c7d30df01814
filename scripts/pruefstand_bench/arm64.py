"""Part 10 of scripts/bench — arm64 under emulation (context for tests/arm64.rs, not a
target): the cross-built arm64 package (target/debian/pruefstand_*_arm64.deb, dev
profile) installed in a container of scripts/build-arm64-image's image (qemu-aarch64
through binfmt_misc; the script needs root the first time), its venv made, then one
`pruefstand run demo-baseline --plan klein` (tests/fixtures/arm64-klein.toml, 12 cases)
there and one natively with the amd64 dev build (target/debug/pruefstand, the same
profile): the wall-time ratio. NA without Docker, the package or the image.

Not tests/arm64.rs, which checks that the package works there: this only times it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from .common import REPO, SKIP, docker, ensure_venv, loadavg, say


def arm64_part(work: Path) -> dict:
    """The small plan emulated on arm64 and native here; the wall-time ratio."""
    out = {"arm64_s": None, "native_s": None, "arm64_emulation_slowdown": None}
    debs = sorted((REPO / "target" / "debian").glob("pruefstand_*_arm64.deb"))
    native = REPO / "target" / "debug" / "pruefstand"
    if shutil.which("docker") is None or not debs or not native.exists():
        out["skipped"] = "needs docker, target/debian/pruefstand_*_arm64.deb and target/debug/pruefstand"
        say(f"arm64            : NA ({out['skipped']})")
        return out
    built = subprocess.run([str(REPO / "scripts" / "build-arm64-image")], capture_output=True, text=True)
    if built.returncode != 0:
        out["skipped"] = "scripts/build-arm64-image failed: " + built.stderr.strip().splitlines()[-1]
        say(f"arm64            : NA ({out['skipped']})")
        return out
    image = built.stdout.strip().splitlines()[-1]
    plan = (REPO / "tests" / "fixtures" / "arm64-klein.toml").read_text()
    # The aarch64 wheels for bookworm's CPython 3.11, downloaded here once (tests/arm64.rs
    # fills the same folder): pip in the container installs from them alone.
    wheels = Path("/var/tmp/pruefstand-arm64/wheels-cp311")
    wheels.mkdir(parents=True, exist_ok=True)
    python, _ = ensure_venv(native)
    fetch = [str(python), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
             "--python-version", "3.11", "--abi", "cp311", "--abi", "abi3", "--abi", "none", "--dest", str(wheels),
             "-r", str(REPO / "scripts" / "requirements.txt")]
    for tag in ("manylinux2014", "manylinux_2_28", "manylinux_2_34"):
        fetch += ["--platform", f"{tag}_aarch64"]
    if subprocess.run(fetch, capture_output=True).returncode != 0:
        out["skipped"] = "pip download of the aarch64 wheels failed"
        say(f"arm64            : NA ({out['skipped']})")
        return out
    name = f"pruefstand-arm64-bench-{os.getpid()}"
    docker("run", "-d", "--platform", "linux/arm64", "--network", "host", "--name", name,
           "-v", f"{wheels}:/var/cache/pruefstand-wheels:ro", image, "sleep", "infinity")
    passed = ["PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT",
              "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"]

    def inside(user: str, *argv: str, timeout: float = 1800) -> tuple[subprocess.CompletedProcess, float]:
        env = ["-e", "PIP_FIND_LINKS=/var/cache/pruefstand-wheels", "-e", "PIP_NO_INDEX=1", "-e", "HOME=/home/anna" if user != "root" else "HOME=/root"]
        for v in passed:
            if os.environ.get(v):
                env += ["-e", f"{v}={os.environ[v]}"]
        t0 = time.monotonic()
        r = subprocess.run(["docker", "exec", "-u", user, "-w", "/home/anna" if user != "root" else "/tmp", *env,
                            name, *argv], capture_output=True, text=True, timeout=timeout)
        if r.returncode not in (0, 10, 11):
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()[-400:]}")
        return r, time.monotonic() - t0

    try:
        for path in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf"):
            if Path(path).is_file():
                docker("cp", path, f"{name}:{path}")
        docker("cp", str(debs[-1]), f"{name}:/tmp/{debs[-1].name}")
        (work / "arm64-klein.toml").write_text(plan)
        inside("root", "apt-get", "install", "-y", "-q", "--no-install-recommends", f"./{debs[-1].name}")
        inside("anna", "pruefstand", "init")
        docker("cp", str(work / "arm64-klein.toml"), f"{name}:/home/anna/pruefstand/profiles/klein.toml")
        inside("root", "chown", "anna:anna", "/home/anna/pruefstand/profiles/klein.toml")
        _, setup_s = inside("anna", "pruefstand", "setup")
        _, out["arm64_s"] = inside("anna", "pruefstand", "--root", "/home/anna/pruefstand", "run", "demo-baseline",
                                   "--plan", "klein")
    except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        out["skipped"] = f"the emulated run failed: {e}"
        say(f"arm64            : NA ({out['skipped']})")
        return out
    finally:
        docker("rm", "-f", name, check=False)
    root = work / "arm64-native"
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run([str(native), "init", str(root), "--from", str(REPO)], capture_output=True, check=True)
    (root / "profiles" / "klein.toml").write_text(plan)
    t0 = time.monotonic()
    r = subprocess.run([str(native), "--root", str(root), "run", "demo-baseline", "--plan", "klein"],
                       capture_output=True, text=True, cwd=root)
    out["native_s"] = time.monotonic() - t0
    if r.returncode not in (0, 10, 11):
        out["skipped"] = f"the native run exited {r.returncode}"
        say(f"arm64            : NA ({out['skipped']})")
        return out
    out["arm64_emulation_slowdown"] = out["arm64_s"] / out["native_s"]
    say(f"arm64 (emulated) : venv {setup_s:.0f} s; `run demo-baseline --plan klein` (12 cases) {out['arm64_s']:.1f} s "
        f"emulated, {out['native_s']:.1f} s native (amd64 dev build) = {out['arm64_emulation_slowdown']:.1f}× slower; "
        f"load average {loadavg()}")
    return out


def run(work: Path) -> dict:
    """The emulation slowdown (None where not run), printed."""
    say("== arm64 under emulation: the small plan, emulated vs native ==")
    if "arm64" in SKIP:
        a64 = {"arm64_emulation_slowdown": None, "skipped": "BENCH_SKIP"}
    else:
        a64 = arm64_part(work)
    say()
    return a64
