"""Batched against serial decoding in one process (`sd2 bench --batch B …`).

For each method of our loop, prompt set, temperature, k and B: B requests (the set's prompts cycled,
request i seeded i), decoded two ways on the same engine, in turn per repetition:
  serial   each request's `generate` one after another (the service with SD2_MAX_BATCH=1); a request's
           latency is its end since the first one's start;
  batched  one `Engine.generate_batch` (what the service's scheduler does); a request's latency is
           when it finished.
Reported per way: aggregate tokens/s (all tokens / wall time), mean per-request decode tokens/s, p50/p95
latency; the median repetition by wall time. Every batched request's tokens are checked against its
serial (solo) run: `identical` counts the requests equal.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime

from sd2.bench.prompts import PromptSet
from sd2.config import DecodeConfig
from sd2.engine import VERIFIER_METHOD, Engine, GenerateRequest, GenerationResult

WAYS = ("serial", "batched")


@dataclass(frozen=True)
class Throughput:
    """One way of decoding B requests, timed."""

    wall_s: float
    tokens: int
    aggregate_tokens_per_s: float
    per_request_tokens_per_s: float | None  # mean of each request's own decode rate
    p50_latency_s: float
    p95_latency_s: float


@dataclass(frozen=True)
class BatchedRow:
    """B requests of one method, set, temperature and k: each way's throughput, and how many requests
    decoded batched gave exactly their solo tokens."""

    method: str
    prompt_set: str
    temperature: float
    k: int | str | None  # None: the verifier alone
    batch: int
    serial: Throughput
    batched: Throughput
    identical: int

    @property
    def ratio(self) -> float:
        """Batched aggregate tokens/s over serial."""
        return self.batched.aggregate_tokens_per_s / self.serial.aggregate_tokens_per_s

    def to_dict(self) -> dict:
        return asdict(self)


def batch_requests(
    prompt_set: PromptSet, method: str, batch: int, decode: DecodeConfig
) -> list[GenerateRequest]:
    """B requests from the set's prompts (cycled), request i seeded i."""
    prompts = prompt_set.prompts
    return [prompts[i % len(prompts)].request(method, replace(decode, seed=i)) for i in range(batch)]


def _serial(engine: Engine, requests) -> tuple[float, list[GenerationResult], list[float]]:
    start, results, done = time.perf_counter(), [], []
    for request in requests:
        results.append(engine.generate(request))
        done.append(time.perf_counter() - start)
    return time.perf_counter() - start, results, done


def _batched(engine: Engine, requests) -> tuple[float, list[GenerationResult], list[float]]:
    start = time.perf_counter()
    results = engine.generate_batch(requests)
    wall = time.perf_counter() - start
    return wall, results, [(r.metrics.decode_ms + r.metrics.prefill_ms) / 1e3 for r in results]


def _throughput(wall: float, results: Sequence[GenerationResult], latencies: Sequence[float]) -> Throughput:
    tokens = sum(len(r.token_ids) for r in results)
    per_request = [r.metrics.tokens_per_s for r in results if r.metrics.tokens_per_s]
    ordered = sorted(latencies)
    return Throughput(
        wall_s=wall,
        tokens=tokens,
        aggregate_tokens_per_s=tokens / wall,
        per_request_tokens_per_s=statistics.mean(per_request) if per_request else None,
        p50_latency_s=statistics.median(ordered),
        p95_latency_s=ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
    )


def measure_batch(
    engine: Engine,
    requests: Sequence[GenerateRequest],
    repeats: int,
    label: tuple[str, str, float, int | str | None],
) -> BatchedRow:
    """Serial and batched, `repeats` times in turn, the median run of each by wall time.
    `label`: (method, prompt set, temperature, k) of the requests."""
    runs: dict[str, list] = {way: [] for way in WAYS}
    for _ in range(repeats):
        runs["serial"].append(_serial(engine, requests))
        runs["batched"].append(_batched(engine, requests))
    solo = [r.token_ids for r in runs["serial"][0][1]]
    identical = sum(r.token_ids == ids for r, ids in zip(runs["batched"][0][1], solo, strict=True))
    median = {way: sorted(done, key=lambda run: run[0])[len(done) // 2] for way, done in runs.items()}
    return BatchedRow(
        *label,
        batch=len(requests),
        **{way: _throughput(*median[way]) for way in WAYS},
        identical=identical,
    )


def run_batched(
    engine: Engine,
    methods: Sequence[str],
    prompt_sets: Sequence[PromptSet],
    batches: Sequence[int],
    decodes: Sequence[DecodeConfig],
    repeats: int = 1,
    on_row: Callable[[BatchedRow], None] | None = None,
) -> list[BatchedRow]:
    """Every (method, set, decode config, B) measured by `measure_batch`, after decoding each way once
    untimed (call `engine.warm_up()` once before, for the cost profiles)."""
    rows = []
    for method in methods:
        for prompt_set in prompt_sets:
            for decode in decodes:
                warm = batch_requests(prompt_set, method, min(2, max(batches)), decode)
                measure_batch(engine, warm, 1, ("", "", 0.0, 0))  # first calls of each shape are slower
                for batch in batches:
                    requests = batch_requests(prompt_set, method, batch, decode)
                    k = decode.k if method != VERIFIER_METHOD else None  # the baseline drafts nothing
                    label = (method, prompt_set.name, decode.temperature, k)
                    row = measure_batch(engine, requests, repeats, label)
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
    return rows


def describe(row: BatchedRow) -> str:
    """One line for a progress log."""
    return (
        f"{row.method} {row.prompt_set} T={row.temperature:g} k={row.k} B={row.batch}: serial "
        f"{row.serial.aggregate_tokens_per_s:.1f} tok/s, batched {row.batched.aggregate_tokens_per_s:.1f} "
        f"({row.ratio:.2f}×), identical {row.identical}/{row.batch}"
    )


def markdown_table(rows: Sequence[BatchedRow]) -> str:
    """The rows as a Markdown table (aggregate tokens/s, batched ÷ serial, per-request rate, latency)."""
    lines = [
        "| method | set | T | k | B | serial tok/s | batched tok/s | batched ÷ serial "
        "| per-request tok/s serial / batched | p50 latency s serial / batched "
        "| p95 latency s serial / batched | identical to solo |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s, b = row.serial, row.batched
        per_request = " / ".join(
            f"{t.per_request_tokens_per_s:.1f}" if t.per_request_tokens_per_s else "—" for t in (s, b)
        )
        lines.append(
            f"| {row.method} | {row.prompt_set} | {row.temperature:g} | {row.k or '—'} | {row.batch} | "
            f"{s.aggregate_tokens_per_s:.1f} | {b.aggregate_tokens_per_s:.1f} | **{row.ratio:.2f}×** | "
            f"{per_request} | {s.p50_latency_s:.2f} / {b.p50_latency_s:.2f} | "
            f"{s.p95_latency_s:.2f} / {b.p95_latency_s:.2f} | {row.identical}/{row.batch} |"
        )
    return "\n".join(lines)


def batched_record(rows: Sequence[BatchedRow], command: str, models: dict, created_at: datetime) -> dict:
    """The rows with what ran them: the command (repo-relative paths), the machine, the models."""
    from sd2.bench.report import machine_info, recorded_command

    return {
        "kind": "batched",
        "created_at": created_at.isoformat(timespec="seconds"),
        "command": recorded_command(command),
        "machine": machine_info(),
        "models": models,
        "rows": [row.to_dict() for row in rows],
    }


def batched_markdown(record: dict, rows: Sequence[BatchedRow]) -> str:
    machine = record["machine"]
    return "\n".join(
        [
            f"# Batched vs serial decoding — {record['created_at']}",
            "",
            f"`{record['command']}`",
            "",
            f"{machine['cpu_model']}, {record['models']['device']}, {record['models']['dtype']}; "
            "every batched request's tokens checked against its solo run.",
            "",
            markdown_table(rows),
            "",
        ]
    )
