"""Batched against serial decoding in one process: B requests decoded together (`Engine.generate_batch`,
what the service's scheduler does) against the same B decoded one after another (the serial path,
SD2_MAX_BATCH=1), for each method and B, with every batched request's tokens checked against its solo
run.

For each method and B in --batches: B held-out prompts (cycled from the chosen prompt sets), greedy (or
--temperature with per-request seeds), --max-new-tokens each. Serial: each request's `generate` in turn;
its wall time is the sum, a request's latency its end since the start. Batched: one `generate_batch`;
every request's latency is when it finished. Batched twice: with each row's solo draft lengths, and with
greedy k = auto rows drafting for the batch's costs (sd2.batch_costs, what the service does; at T = 0
the tokens are the same, at T > 0 rows keep their solo lengths anyway). Reports aggregate tokens/s (all
tokens / wall time), the mean per-request decode tokens/s, p50/p95 latency, and batched ÷ serial
aggregate. Repeats alternate serial and batched (--repeats) and keep the median. Markdown on stdout
(machine, date, command), JSON with --out.

    .venv/bin/python benchmarks/batched_decoding.py --methods verifier sd2 --batches 1 2 4 8 16
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from sd2.bench.prompts import load_prompt_sets
from sd2.config import DecodeConfig
from sd2.devices import cpu_model
from sd2.engine import Engine, GenerateRequest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=["verifier", "sd2"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    p.add_argument("--prompt-sets", nargs="+", default=["chat"])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", default="auto", help="drafts per block for speculative methods (default auto)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--dtype", default=None, help="auto | bf16 | fp32 (default: $SD2_DTYPE, else auto)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return p.parse_args(argv)


def _requests(prompts, method: str, batch: int, args) -> list[GenerateRequest]:
    k = args.k if args.k == "auto" else int(args.k)
    return [
        GenerateRequest(
            messages=tuple(prompts[i % len(prompts)].messages),
            method=method,
            decode=DecodeConfig(
                k=k, temperature=args.temperature, seed=i, max_new_tokens=args.max_new_tokens
            ),
        )
        for i in range(batch)
    ]


def _serial(engine: Engine, requests) -> tuple[float, list, list[float]]:
    start, results, done = time.perf_counter(), [], []
    for request in requests:
        results.append(engine.generate(request))
        done.append(time.perf_counter() - start)
    return time.perf_counter() - start, results, done


def _batched(engine: Engine, requests, load_aware: bool = True) -> tuple[float, list, list[float]]:
    start = time.perf_counter()
    results = engine.generate_batch(requests, load_aware=load_aware)
    wall = time.perf_counter() - start
    return wall, results, [r.metrics.decode_ms / 1e3 + r.metrics.prefill_ms / 1e3 for r in results]


def _summary(wall: float, results, latencies: list[float]) -> dict:
    tokens = sum(len(r.token_ids) for r in results)
    per_request = [r.metrics.tokens_per_s for r in results if r.metrics.tokens_per_s]
    ordered = sorted(latencies)
    return {
        "wall_s": wall,
        "tokens": tokens,
        "aggregate_tokens_per_s": tokens / wall,
        "per_request_tokens_per_s": statistics.mean(per_request) if per_request else None,
        "p50_latency_s": statistics.median(ordered),
        "p95_latency_s": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine = Engine.load(dtype=args.dtype)
    engine.warm_up(max_batch=max(args.batches))
    prompts = [p for s in load_prompt_sets(names=args.prompt_sets) for p in s.prompts]
    rows, mismatches = [], 0
    for method in args.methods:
        for batch in args.batches:
            requests = _requests(prompts, method, batch, args)
            serial, solo_k, batched = [], [], []
            for _ in range(args.repeats):
                serial.append(_serial(engine, requests))
                solo_k.append(_batched(engine, requests, load_aware=False))
                batched.append(_batched(engine, requests))
            solo_ids = [r.token_ids for r in serial[0][1]]
            same = min(
                sum(r.token_ids == ids for r, ids in zip(runs[0][1], solo_ids, strict=True))
                for runs in (solo_k, batched)
            )
            mismatches += batch - same
            pick = lambda runs: sorted(runs, key=lambda run: run[0])[len(runs) // 2]  # noqa: E731
            s, b, f = _summary(*pick(serial)), _summary(*pick(batched)), _summary(*pick(solo_k))
            rows.append(
                {
                    "method": method,
                    "batch": batch,
                    "serial": s,
                    "batched_solo_k": f,
                    "batched": b,
                    "identical": same,
                }
            )
            serial_rate, batched_rate = s["aggregate_tokens_per_s"], b["aggregate_tokens_per_s"]
            print(
                f"{method} B={batch}: serial {serial_rate:.1f} tok/s, batched {batched_rate:.1f} tok/s "
                f"({batched_rate / serial_rate:.2f}×; solo k "
                f"{f['aggregate_tokens_per_s'] / serial_rate:.2f}×), identical {same}/{batch}",
                file=sys.stderr,
                flush=True,
            )
    record = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/batched_decoding.py "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(),
        "precision": engine.precision,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "rows": rows,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(markdown(record))
    return 1 if mismatches else 0


def markdown(record: dict) -> str:
    lines = [
        f"Batched vs serial decoding — {record['measured_at']}, {record['cpu']}, {record['precision']}",
        "",
        f"`{record['command']}`",
        "",
        "| method | B | serial tok/s | batched, solo k: tok/s (÷ serial) | batched tok/s | batched ÷ serial "
        "| per-request tok/s serial / batched | p50 latency s serial / batched "
        "| p95 latency s serial / batched | identical to solo |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        s, b, f = row["serial"], row["batched"], row["batched_solo_k"]
        ratio = b["aggregate_tokens_per_s"] / s["aggregate_tokens_per_s"]
        solo_k = f["aggregate_tokens_per_s"] / s["aggregate_tokens_per_s"]
        lines.append(
            f"| {row['method']} | {row['batch']} | {s['aggregate_tokens_per_s']:.1f} | "
            f"{f['aggregate_tokens_per_s']:.1f} ({solo_k:.2f}×) | "
            f"{b['aggregate_tokens_per_s']:.1f} | **{ratio:.2f}×** | "
            f"{s['per_request_tokens_per_s']:.1f} / {b['per_request_tokens_per_s']:.1f} | "
            f"{s['p50_latency_s']:.2f} / {b['p50_latency_s']:.2f} | "
            f"{s['p95_latency_s']:.2f} / {b['p95_latency_s']:.2f} | "
            f"{row['identical']}/{row['batch']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
