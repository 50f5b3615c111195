"""The service under concurrent load: N clients at once against one server, serial (SD2_MAX_BATCH=1)
and batched, while a prober times GET /health, GET /runs and GET /metrics throughout.

One process: the embedded pair (or --verifier) served by `create_app` under uvicorn on a free 127.0.0.1
port with a real SQLite file, one server per --max-batch value, the same Engine behind each. For each
--methods M, --max-batch B and --clients N: N threads each POST one /generate at the same moment (client
i gets held-out chat prompt i, cycled; greedy, --k, --max-new-tokens); a prober thread times /health,
/runs and /metrics back to back until all finished. Reports per burst how many were served (200),
refused (429, with Retry-After) or anything else, the runs stored (must equal the served count: nothing
lost, nothing refused written), aggregate tokens/s (all tokens / burst wall time), the mean per-request
tokens/s (its tokens / its latency), p50/p95 latency and the probes' median and max (target: max < 1 s);
then batched ÷ serial aggregate tokens/s per method and N. Markdown with machine, date and command; exit
1 when a request got neither 200 nor 429, a run is missing, or a probe took ≥ 1 s.

    .venv/bin/python benchmarks/service_load.py --methods verifier sd2 --clients 1 2 4 8 16 \
        --max-batch 1 8 --max-new-tokens 64
    .venv/bin/python benchmarks/service_load.py --clients 96 --max-new-tokens 8   # admission control
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
FALLBACK_PROMPT = "Say hi."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verifier", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    p.add_argument("--clients", nargs="+", type=int, default=[96], help="concurrent clients per burst")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--methods", "--method", nargs="+", default=["verifier"])
    p.add_argument("--k", default="auto", help="drafts per block (default auto)")
    p.add_argument("--queue", type=int, default=None, help="SD2_GENERATION_QUEUE (default: the service's)")
    p.add_argument(
        "--max-batch", nargs="+", type=int, default=None, help="SD2_MAX_BATCH values (default: the service's)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    return p.parse_args(argv)


def _prompts() -> list[dict]:
    """The held-out chat prompts as /generate fields (a prompt or a chat history), else one short
    fallback prompt (no assets folder: the admission test still runs anywhere)."""
    from sd2.bench.prompts import load_prompt_sets
    from sd2.paths import AssetsNotFoundError

    try:
        (chat,) = load_prompt_sets(names=["chat"])
    except AssetsNotFoundError:
        return [{"prompt": FALLBACK_PROMPT}]
    return [{"prompt": p.prompt} if p.prompt else {"messages": list(p.messages)} for p in chat.prompts]


def run(args: argparse.Namespace) -> list[dict]:
    import torch

    from sd2.engine import Engine
    from service.settings import Settings

    if args.threads:
        torch.set_num_threads(args.threads)
    # the shipped drafters only when a method is one of them (loading them costs seconds)
    shipped = any(m not in ("verifier", "self") for m in args.methods)
    engine = Engine.load(args.verifier, shipped=shipped, device="cpu")
    prompts = _prompts()
    bursts = []
    for max_batch in args.max_batch or [None]:
        home = Path(tempfile.mkdtemp(prefix="sd2-load-"))
        settings = Settings(home=home, verifier=args.verifier, device="cpu")
        if args.queue is not None:
            settings = replace(settings, generation_queue=args.queue)
        if max_batch is not None:
            settings = replace(settings, max_batch=max_batch)
        bursts += _serve(args, engine, settings, prompts)
    return bursts


def _serve(args: argparse.Namespace, engine, settings, prompts: list[dict]) -> list[dict]:
    """Every method's bursts against one server with these settings."""
    import httpx

    from service.app import create_app
    from service.threaded import serve_in_thread

    k = args.k if args.k == "auto" else int(args.k)
    results = []
    with serve_in_thread(create_app(settings, engine=engine)) as url:
        for method in args.methods:
            base = {"method": method, "max_new_tokens": args.max_new_tokens, "k": k}
            warm = {**base, **prompts[0]}
            httpx.post(f"{url}/generate", json=warm, timeout=600).raise_for_status()  # warm-up (stored)
            for clients in args.clients:
                bodies = [{**base, **prompts[i % len(prompts)]} for i in range(clients)]
                result = _burst(url, bodies, settings.home / "sd2.db")
                results.append(
                    {"method": method, "clients": clients, "max_batch": settings.max_batch, **result}
                )
                results[-1]["queue"] = settings.generation_queue
                print(_line(results[-1]), file=sys.stderr, flush=True)
    return results


def _burst(url: str, bodies: list[dict], db: Path) -> dict:
    """All bodies POSTed at once while the prober runs; what came back and what was stored."""
    import httpx
    import torch

    probes: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while not done.is_set():
                for path in ("/health", "/runs?limit=5", "/metrics"):
                    start = time.perf_counter()
                    http.get(path).raise_for_status()
                    probes.append(time.perf_counter() - start)

    def generate(job: tuple[httpx.Client, dict]) -> tuple[httpx.Response, float]:
        client, body = job
        start = time.perf_counter()
        response = client.post("/generate", json=body)
        return response, time.perf_counter() - start

    with sqlite3.connect(db) as conn:
        before = conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'succeeded'").fetchone()[0]
    # The clients exist before the burst: building many httpx clients (SSL contexts) in the same
    # process as the server would time the load generator, not the server.
    clients = [httpx.Client(base_url=url, timeout=1200) for _ in bodies]
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    start = time.perf_counter()
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(generate, zip(clients, bodies, strict=True)))
    wall_s = time.perf_counter() - start
    done.set()
    prober.join(30)
    for client in clients:
        client.close()
    codes = [r.status_code for r, _ in answers]
    other = [f"{r.status_code}: {r.text[:200]}" for r, _ in answers if r.status_code not in (200, 429)]
    served = [(len(r.json()["token_ids"]), latency) for r, latency in answers if r.status_code == 200]
    latencies = sorted(latency for _, latency in served)
    retry_after = {r.headers.get("Retry-After") for r, _ in answers if r.status_code == 429}
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'succeeded'").fetchone()[0] - before
    return {
        "served": codes.count(200),
        "refused": codes.count(429),
        "other": len(other),
        "first_error": other[0] if other else None,
        "retry_after": sorted(x for x in retry_after if x is not None),
        "stored": stored,
        "wall_s": wall_s,
        "tokens_per_s": sum(n for n, _ in served) / wall_s,
        "per_request_tokens_per_s": statistics.mean(n / t for n, t in served) if served else float("nan"),
        "latency_p50_s": statistics.median(latencies) if latencies else float("nan"),
        "latency_p95_s": latencies[round(0.95 * (len(latencies) - 1))] if latencies else float("nan"),
        "probes": len(probes),
        "probe_median_s": statistics.median(probes) if probes else float("nan"),
        "probe_max_s": max(probes) if probes else float("nan"),
        "threads": torch.get_num_threads(),
    }


def _line(r: dict) -> str:
    return (
        f"{r['method']} clients={r['clients']} max_batch={r['max_batch']}: {r['served']} served, "
        f"{r['tokens_per_s']:.1f} tok/s, p95 {r['latency_p95_s']:.2f} s, "
        f"probe max {r['probe_max_s'] * 1e3:.0f} ms"
        + (f"; first error {r['first_error']}" if r["other"] else "")
    )


def _ok(r: dict) -> bool:
    return r["other"] == 0 and r["stored"] == r["served"] and r["probe_max_s"] < PROBE_TARGET_S


def report(args: argparse.Namespace, bursts: list[dict]) -> tuple[str, bool]:
    ok = all(_ok(r) for r in bursts)
    lines = [
        "# The service under concurrent load",
        "",
        f"- {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}; {_cpu()}, {os.cpu_count()} CPUs, torch threads "
        f"{bursts[0]['threads']}, Python {platform.python_version()}",
        f"- command: `{shlex.join(['python', 'benchmarks/service_load.py', *sys.argv[1:]])}`",
        f"- k {args.k}, greedy, at most {args.max_new_tokens} new tokens, held-out chat prompts",
        "",
        "| method | clients | queue | max batch | served (200) | refused (429) | other | stored runs "
        "| wall s | aggregate tok/s | per-request tok/s | latency p50 / p95 s | probes | probe median ms "
        "| probe max ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in bursts:
        lines.append(
            f"| {r['method']} | {r['clients']} | {r['queue']} | {r['max_batch']} | {r['served']} | "
            f"{r['refused']} (Retry-After {', '.join(r['retry_after']) or '-'}) | {r['other']} | "
            f"{r['stored']} | {r['wall_s']:.1f} | {r['tokens_per_s']:.1f} | "
            f"{r['per_request_tokens_per_s']:.1f} | {r['latency_p50_s']:.2f} / {r['latency_p95_s']:.2f} | "
            f"{r['probes']} | {r['probe_median_s'] * 1e3:.0f} | {r['probe_max_s'] * 1e3:.0f} |"
        )
    serial = {(r["method"], r["clients"]): r for r in bursts if r["max_batch"] == 1 and r["tokens_per_s"]}
    ratios = [
        (r, serial[r["method"], r["clients"]])
        for r in bursts
        if r["max_batch"] != 1 and (r["method"], r["clients"]) in serial
    ]
    if ratios:
        lines += [
            "",
            "| method | clients | max batch | batched ÷ serial aggregate tok/s "
            "| p95 latency s batched / serial |",
            "|---|---|---|---|---|",
        ]
        for r, s in ratios:
            lines.append(
                f"| {r['method']} | {r['clients']} | {r['max_batch']} | "
                f"**{r['tokens_per_s'] / s['tokens_per_s']:.2f}×** | "
                f"{r['latency_p95_s']:.2f} / {s['latency_p95_s']:.2f} |"
            )
    lines += [
        "",
        f"**{'PASS' if ok else 'FAIL'}**: every request 200 or 429, every served run stored, "
        f"/health, /runs and /metrics max < {PROBE_TARGET_S:.0f} s throughout.",
    ]
    return "\n".join(lines), ok


def _cpu() -> str:
    from sd2.devices import cpu_model

    return cpu_model() or platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text, ok = report(args, run(args))
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
