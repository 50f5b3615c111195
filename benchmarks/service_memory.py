"""Issue 4's memory check: the server's RSS with the embedded pair loaded, idle and under load.

Starts the real server (`python -m launcher serve`, i.e. uvicorn, on a free 127.0.0.1 port) as a
subprocess with SD2_HOME (the converted verifier) and a fresh SQLite file, waits for /health, then
samples the resident set size of the server *and its children* (psutil) every 50 ms:
  1. idle: for --idle-s seconds after /health answered;
  2. load: while --requests concurrent POST /generate requests run (methods cycled from --methods,
     --max-new-tokens each); reports the peak;
  3. after: --idle-s seconds after the last response.
Prints a Markdown table with machine, date and command, then PASS/FAIL against --limit-gb (target
2.5 GB), exit code 1 on FAIL. A benchmark, not a test: run it on a quiet machine.

    SD2_HOME=/tmp/sd2home .venv/bin/python benchmarks/service_memory.py --requests 6 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime

import httpx
import psutil

from sd2.bench.prompts import DEMO_PROMPTS
from sd2.paths import sd2_home

GB = 1e9
PROMPTS = DEMO_PROMPTS  # the benchmark harness's built-in demo prompts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=6, help="concurrent POST /generate requests")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--methods", nargs="+", default=["verifier", "self"], help="cycled over the requests")
    p.add_argument("--idle-s", type=float, default=3.0, help="seconds sampled idle, before and after load")
    p.add_argument("--limit-gb", type=float, default=2.5)
    p.add_argument("--startup-timeout-s", type=float, default=300.0)
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tree_rss(process: psutil.Process) -> int:
    """Resident bytes of a process and all its descendants (workers a server may fork)."""
    total = 0
    for p in [process, *process.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


@contextmanager
def running_server(env: Mapping[str, str], timeout_s: float = 300.0) -> Iterator[tuple[str, psutil.Process]]:
    """`sd2 serve` on a free loopback port in a subprocess; yields (base URL, its psutil.Process)."""
    port = free_port()
    command = [sys.executable, "-m", "launcher", "serve", "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile(mode="w+") as log:
        server = subprocess.Popen(command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(url, server, log, timeout_s)
            yield url, psutil.Process(server.pid)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _wait_healthy(url: str, server: subprocess.Popen, log, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the server exited with {server.returncode}:\n{log.read()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"no healthy server at {url} after {timeout_s} s")


class Sampler:
    """Samples tree_rss in a background thread; `window()` returns the samples taken during a block."""

    def __init__(self, process: psutil.Process, every_s: float = 0.05):
        self.process, self.every_s = process, every_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), tree_rss(self.process)))
            time.sleep(self.every_s)

    def between(self, start: float, end: float) -> list[int]:
        return [rss for t, rss in self.samples if start <= t <= end]


def generate_load(url: str, n: int, methods: list[str], max_new_tokens: int) -> list[dict]:
    """n concurrent POST /generate requests; returns the JSON bodies (raises on any non-200)."""

    def one(i: int) -> dict:
        body = {
            "prompt": PROMPTS[i % len(PROMPTS)],
            "method": methods[i % len(methods)],
            "max_new_tokens": max_new_tokens,
            "seed": i,
        }
        response = httpx.post(f"{url}/generate", json=body, timeout=600)
        response.raise_for_status()
        return response.json()

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def measure(args: argparse.Namespace, env: Mapping[str, str]) -> dict:
    with running_server(env, args.startup_timeout_s) as (url, process), Sampler(process) as sampler:
        t0 = time.monotonic()
        time.sleep(args.idle_s)
        t1 = time.monotonic()
        results = generate_load(url, args.requests, args.methods, args.max_new_tokens)
        t2 = time.monotonic()
        time.sleep(args.idle_s)
        t3 = time.monotonic()
    idle, load, after = sampler.between(t0, t1), sampler.between(t1, t2), sampler.between(t2, t3)
    return {
        "idle_gb": statistics.median(idle) / GB,
        "load_peak_gb": max(load) / GB,
        "after_gb": statistics.median(after) / GB,
        "peak_gb": max(idle + load + after) / GB,
        "load_s": t2 - t1,
        "tokens": sum(r["metrics"]["n_tokens"] for r in results),
        "runs": [r["run_id"] for r in results],
    }


def report(args: argparse.Namespace, m: dict, home: str) -> bool:
    ok = m["peak_gb"] <= args.limit_gb
    print(f"# service memory — {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"machine: {platform.node()}, {psutil.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"command: {shlex.join([sys.executable, *sys.argv])}  (SD2_HOME={home})")
    print()
    print("| phase | RSS (server + children) |")
    print("|---|---|")
    print(f"| idle, median over {args.idle_s:g} s | {m['idle_gb']:.3f} GB |")
    load = f"{args.requests} × {args.max_new_tokens} tokens, {'/'.join(args.methods)}"
    print(f"| load ({load}, {m['load_s']:.1f} s), peak | {m['load_peak_gb']:.3f} GB |")
    print(f"| after load, median over {args.idle_s:g} s | {m['after_gb']:.3f} GB |")
    print()
    print(f"{m['tokens']} tokens generated in runs {m['runs']}")
    print(f"{'PASS' if ok else 'FAIL'}: peak {m['peak_gb']:.3f} GB ≤ {args.limit_gb} GB")
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    home = str(sd2_home())
    with tempfile.TemporaryDirectory(prefix="sd2-memory-") as scratch:
        env = {
            "SD2_HOME": home,  # the converted embedded verifier lives here
            "SD2_DATABASE_URL": f"sqlite:///{scratch}/bench.db",  # a fresh store, not the user's
            "HF_HUB_OFFLINE": "1",
        }
        return 0 if report(args, measure(args, env), home) else 1


if __name__ == "__main__":
    sys.exit(main())
