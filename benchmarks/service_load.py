"""Admission control under load: N concurrent short generations against one server, while a prober
times GET /health, GET /runs and GET /metrics throughout.

One process: the embedded pair (or --verifier) served by `create_app` under uvicorn on a free
127.0.0.1 port with a real SQLite file. --clients threads each POST one short greedy /generate at the
same moment; a prober thread times /health, /runs and /metrics back to back until they all finished. Reports
how many were served (200), refused (429, with Retry-After) or anything else, the runs stored (must
equal the served count: nothing lost, nothing refused written), and the probes' median and max
latency (target: max < 1 s). Prints a Markdown table with machine, date and command; exit 1 when a
request got neither 200 nor 429, a run is missing, or a probe took ≥ 1 s.

    SD2_HOME=/tmp/sd2home .venv/bin/python benchmarks/service_load.py --clients 96
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROBE_TARGET_S = 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verifier", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--clients", type=int, default=96)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--method", default="verifier")
    p.add_argument("--queue", type=int, default=None, help="SD2_GENERATION_QUEUE (default: the service's)")
    p.add_argument("--max-batch", type=int, default=None, help="SD2_MAX_BATCH (default: the service's)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    import httpx
    import torch

    from sd2.engine import Engine
    from service.app import create_app
    from service.settings import Settings
    from service.threaded import serve_in_thread

    if args.threads:
        torch.set_num_threads(args.threads)
    home = Path(tempfile.mkdtemp(prefix="sd2-load-"))
    settings = Settings(home=home, verifier=args.verifier, device="cpu")
    if args.queue is not None:
        settings = replace(settings, generation_queue=args.queue)
    if args.max_batch is not None:
        settings = replace(settings, max_batch=args.max_batch)
    # the shipped drafters only when the method is one of them (loading them costs seconds)
    engine = Engine.load(args.verifier, shipped=args.method not in ("verifier", "self"), device="cpu")
    body = {"prompt": "Say hi.", "method": args.method, "max_new_tokens": args.max_new_tokens, "k": 4}
    probes: list[float] = []
    done = threading.Event()

    def probe(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while not done.is_set():
                for path in ("/health", "/runs?limit=5", "/metrics"):
                    start = time.perf_counter()
                    http.get(path).raise_for_status()
                    probes.append(time.perf_counter() - start)

    latencies: list[float] = []

    def generate(client: httpx.Client) -> httpx.Response:
        start = time.perf_counter()
        response = client.post("/generate", json=body)
        latencies.append(time.perf_counter() - start)
        return response

    with serve_in_thread(create_app(settings, engine=engine)) as url:
        httpx.post(f"{url}/generate", json=body, timeout=600).raise_for_status()  # warm-up (stored)
        # The clients exist before the burst: building 96 httpx clients (SSL contexts) in the same
        # process as the server would time the load generator, not the server.
        clients = [httpx.Client(base_url=url, timeout=600) for _ in range(args.clients)]
        prober = threading.Thread(target=probe, args=(url,), daemon=True)
        prober.start()
        start = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            responses = list(pool.map(generate, clients))
        wall_s = time.perf_counter() - start
        done.set()
        prober.join(30)
        for client in clients:
            client.close()
    codes = [r.status_code for r in responses]
    tokens = sum(len(r.json()["token_ids"]) for r in responses if r.status_code == 200)
    served_latency = sorted(latencies)
    retry_after = {r.headers.get("Retry-After") for r in responses if r.status_code == 429}
    with sqlite3.connect(home / "sd2.db") as conn:
        stored = conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'succeeded'").fetchone()[0] - 1
    return {
        "served": codes.count(200),
        "refused": codes.count(429),
        "other": len(codes) - codes.count(200) - codes.count(429),
        "retry_after": sorted(x for x in retry_after if x is not None),
        "stored": stored,
        "queue": settings.generation_queue,
        "wall_s": wall_s,
        "max_batch": settings.max_batch,
        "tokens_per_s": tokens / wall_s,
        "latency_p50_s": statistics.median(served_latency),
        "latency_p95_s": served_latency[round(0.95 * (len(served_latency) - 1))],
        "probes": len(probes),
        "probe_median_s": statistics.median(probes) if probes else float("nan"),
        "probe_max_s": max(probes) if probes else float("nan"),
        "threads": torch.get_num_threads(),
    }


def report(args: argparse.Namespace, r: dict) -> tuple[str, bool]:
    ok = r["other"] == 0 and r["stored"] == r["served"] and r["probe_max_s"] < PROBE_TARGET_S
    lines = [
        "# Service under load: admission control",
        "",
        f"- {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch threads {r['threads']}, Python {platform.python_version()}",
        f"- command: `{shlex.join([sys.executable, *sys.argv])}`",
        "",
        "| clients | queue | max batch | served (200) | refused (429) | other | stored runs | wall s "
        "| aggregate tok/s | latency p50 / p95 s | probes | probe median ms | probe max ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {args.clients} | {r['queue']} | {r['max_batch']} | {r['served']} | {r['refused']} (Retry-After "
        f"{', '.join(r['retry_after']) or '-'}) | {r['other']} | {r['stored']} | {r['wall_s']:.1f} "
        f"| {r['tokens_per_s']:.1f} | {r['latency_p50_s']:.2f} / {r['latency_p95_s']:.2f} "
        f"| {r['probes']} | {r['probe_median_s'] * 1e3:.0f} | {r['probe_max_s'] * 1e3:.0f} |",
        "",
        f"**{'PASS' if ok else 'FAIL'}**: every request 200 or 429, every served run stored, "
        f"/health, /runs and /metrics max < {PROBE_TARGET_S:.0f} s throughout.",
    ]
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text, ok = report(args, run(args))
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
