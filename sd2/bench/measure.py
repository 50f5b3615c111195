"""One timed generation and what it yields for aggregation (`GenerationStats`); our runners (Engine).

Timing convention, identical for every method: wall time from just before the generate call to its
return (ours: `Engine.generate`, tokenisation, trace and metrics included; HF: `model.generate` on
pre-tokenised ids), with a device synchronisation on both ends. The prefill time is the time to
the first emitted token, seen the same way by both (ours: the first block `Engine.stream` yields;
HF: the first token its streamer receives); decode time = wall − prefill. With `--counterfactual` the
time our loop spends on the unsteered counterfactuals (`metrics.counterfactual_ms`, timed by the
decoder; the twin's prompt forward is the prefill block's share) is taken out of the wall and prefill
times, so every speed figure is that of the run alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from sd2.bench.plan import Cell
from sd2.bench.prompts import BenchPrompt
from sd2.config import DecodeConfig
from sd2.engine import Engine, GenerationResult
from sd2.trace import Block, BlockKind, SteeringOutcome


@dataclass(frozen=True)
class CounterfactualSums:
    """A generation's steered blocks against their unsteered counterfactuals (sd2.trace.Counterfactual),
    kept as sums so that prompts and cells pool them exactly."""

    n_blocks: int = 0  # speculative blocks with a counterfactual
    steered: float = 0.0  # Σ expected accepted drafts of each block's own (steered) draft
    unsteered: float = 0.0  # Σ the same for its unsteered counterfactual draft
    won: int = 0  # blocks whose steered draft expected more accepted drafts
    tied: int = 0
    lost: int = 0

    @property
    def gain(self) -> float:
        """Σ over blocks of steered − unsteered expected accepted drafts."""
        return self.steered - self.unsteered

    def __add__(self, other: CounterfactualSums) -> CounterfactualSums:
        return CounterfactualSums(
            self.n_blocks + other.n_blocks,
            self.steered + other.steered,
            self.unsteered + other.unsteered,
            self.won + other.won,
            self.tied + other.tied,
            self.lost + other.lost,
        )

    @classmethod
    def of(cls, blocks: Iterable[Block]) -> CounterfactualSums | None:
        """The sums over the blocks that carry a counterfactual; None when none does (an unsteered run,
        or one without counterfactuals)."""
        pairs = [b.counterfactual for b in blocks if b.counterfactual is not None]
        if not pairs:
            return None
        outcomes = [c.outcome for c in pairs]
        return cls(
            n_blocks=len(pairs),
            steered=sum(c.steered_expected_accepted for c in pairs),
            unsteered=sum(c.expected_accepted for c in pairs),
            won=outcomes.count(SteeringOutcome.WON),
            tied=outcomes.count(SteeringOutcome.TIED),
            lost=outcomes.count(SteeringOutcome.LOST),
        )


@dataclass(frozen=True)
class GenerationStats:
    """Counts and times of one generation, kept as sums so that cells pool them exactly."""

    token_ids: tuple[int, ...]  # emitted ids, the stop token included
    prefill_ms: float  # start → first emitted token
    wall_ms: float  # start → generate returned, less the time spent on counterfactuals
    judged_blocks: int  # verifier forwards that count for τ (ours: complete blocks; HF: all but the last)
    judged_tokens: int  # tokens those forwards emitted; τ = Σ judged_tokens / Σ judged_blocks
    accepted: int = 0  # accepted drafts in complete speculative blocks (ours only)
    drafted: int = 0  # drafted tokens in complete speculative blocks (ours only)
    histogram: tuple[int, ...] = ()  # h[j] = complete blocks accepting exactly j drafts (ours only)
    overlap_sum: float = 0.0  # Σ over judged positions of Σ_v min(p, q) (ours only)
    overlap_count: int = 0
    draft_ms: float = 0.0  # time in draft steps, and how many (ours only)
    draft_steps: int = 0
    verify_ms: float = 0.0  # time in verifier forwards after the prefill, and how many (ours only)
    verify_count: int = 0
    steer_ms: float = 0.0  # time computing steering vectors from verifier states (ours, SD² drafters)
    counterfactual_ms: float = 0.0  # time on unsteered counterfactuals, taken out of wall_ms (ours)
    counterfactual: CounterfactualSums | None = None  # steered vs unsteered drafts (ours, steered runs)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def decode_ms(self) -> float:
        return self.wall_ms - self.prefill_ms


@dataclass(frozen=True)
class Measurement:
    """A GenerationStats with the coordinates it was measured at."""

    method: str
    prompt_set: str
    prompt_id: str
    temperature: float
    k: int | None
    repeat: int  # -1 for warm-up runs (never aggregated)
    stats: GenerationStats
    sample: int = 0  # which independent sample of the prompt (BenchPlan.samples; always 0 at T = 0)


Runner = Callable[[BenchPrompt, DecodeConfig], GenerationStats]


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so wall-clock times cover it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ours_runner(engine: Engine, cell: Cell, counterfactual: bool = False) -> Runner:
    """Our loop via Engine.generate: `verifier`, `self`, or a named drafter (steered when it has a head).
    `counterfactual`: steered runs also record each block's unsteered counterfactual (sd2.counterfactual)."""
    engine_method = cell.method.drafter or "verifier"

    def run(prompt: BenchPrompt, decode: DecodeConfig) -> GenerationStats:
        request = replace(prompt.request(engine_method, decode), counterfactual=counterfactual)
        synchronize(engine.placement.device)
        start, first = time.perf_counter(), None
        for item in engine.stream(request):  # the first yield is the prefill block: first token out
            first = first or time.perf_counter()
            result = item
        synchronize(engine.placement.device)
        end = time.perf_counter()
        return stats_from_result(result, wall_ms=(end - start) * 1e3, prefill_ms=(first - start) * 1e3)

    return run


def stats_from_result(result: GenerationResult, wall_ms: float, prefill_ms: float) -> GenerationStats:
    """Pool-able sums from one Engine result (conventions of sd2.metrics). wall_ms, prefill_ms: as
    measured; the time spent on counterfactuals (`metrics.counterfactual_ms`, the prefill block's share
    for the unsteered twin's prompt forward) is taken out of them here."""
    metrics, blocks = result.metrics, result.blocks
    prefill_counterfactual_ms = sum(
        b.timings.counterfactual_ms for b in blocks if b.kind is BlockKind.PREFILL
    )
    decode = [b for b in blocks if b.kind is not BlockKind.PREFILL]
    judged = [b for b in blocks if b.counts_for_tau]
    overlaps = [o for b in blocks for o in b.overlaps]
    return GenerationStats(
        token_ids=tuple(result.token_ids),
        prefill_ms=prefill_ms - prefill_counterfactual_ms,
        wall_ms=wall_ms - metrics.counterfactual_ms,
        judged_blocks=len(judged),
        judged_tokens=sum(b.n_accepted + 1 for b in judged),
        accepted=metrics.accepted,
        drafted=metrics.drafted,
        histogram=tuple(metrics.histogram),
        overlap_sum=float(sum(overlaps)),
        overlap_count=len(overlaps),
        draft_ms=sum(b.timings.draft_ms for b in decode),
        draft_steps=sum(b.k for b in decode),
        verify_ms=sum(b.timings.verify_ms for b in decode),
        verify_count=len(decode),
        steer_ms=sum(b.timings.steer_ms for b in decode),
        counterfactual_ms=metrics.counterfactual_ms,
        counterfactual=CounterfactualSums.of(blocks),
    )
