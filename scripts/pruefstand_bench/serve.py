"""Part 9 of scripts/bench — serve with slow readers: `pruefstand serve`'s RSS at start,
with BENCH_SERVE_CLIENTS clients that ask for a 600 KB report and never read
(connections beyond its cap are answered 503), and after they closed.

Not the daemon (daemon.py)."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

from .common import SKIP, env_int, fmt, proc_status, say


def serve_part(binary: Path, work: Path) -> dict:
    """`pruefstand serve` on a root with one 600 KB report: its RSS (MiB) at start, with
    BENCH_SERVE_CLIENTS connections asking for the report and reading nothing, and a few
    seconds after they closed. Printed, not asserted."""
    res = {"serve_rss_mib_start": None, "serve_rss_mib_stalled": None, "serve_rss_mib_after": None,
           "refused": None, "clients": env_int("BENCH_SERVE_CLIENTS", 100)}
    root = work / "serve-root"
    (root / "reports" / "big").mkdir(parents=True, exist_ok=True)
    (root / "pruefstand.toml").write_text('[paths]\nreports = "reports"\n')
    (root / "reports" / "big" / "report.html").write_text(
        "<html><head></head><body>" + "0123456789" * 60_000 + "</body></html>")
    proc = subprocess.Popen([str(binary), "--root", str(root), "serve", "--listen", "127.0.0.1:0"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(work / "serve.log", "ab"))
    clients = []
    try:
        address = proc.stdout.readline().decode().strip().removeprefix("http://").rstrip("/")
        host, port = address.rsplit(":", 1)
        rss = lambda: proc_status(proc.pid, "VmRSS") / 1024  # noqa: E731
        time.sleep(1.0)
        res["serve_rss_mib_start"] = rss()
        for _ in range(res["clients"]):
            c = socket.create_connection((host, int(port)))
            c.sendall(f"GET /reports/big/report.html HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
            clients.append(c)
        time.sleep(3.0)
        res["serve_rss_mib_stalled"] = rss()
        # A refused client got its 503 at once; one held reads its 200 (not read here).
        refused = 0
        for c in clients:
            c.settimeout(0.2)
            try:
                refused += c.recv(12).startswith(b"HTTP/1.1 503")
            except OSError:
                pass
        res["refused"] = refused
        for c in clients:
            c.close()
        clients = []
        time.sleep(3.0)
        res["serve_rss_mib_after"] = rss()
    except (OSError, ValueError, TypeError) as e:
        say(f"serve: measurement failed: {e}")
    finally:
        for c in clients:
            c.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    say(f"serve memory     : RSS {fmt(res['serve_rss_mib_start'], 1)} MiB at start, "
        f"{fmt(res['serve_rss_mib_stalled'], 1)} MiB with {res['clients']} clients reading nothing of a 600 KB "
        f"report ({res['refused']} answered 503), {fmt(res['serve_rss_mib_after'], 1)} MiB after they closed")
    return res


def run(binary: Path, work: Path) -> dict:
    """serve's RSS figures (None where not measured), printed."""
    say("== serve: clients that never read ==")
    sv = {"serve_rss_mib_start": None, "serve_rss_mib_stalled": None, "serve_rss_mib_after": None} \
        if "serve" in SKIP else serve_part(binary, work)
    say()
    return sv
