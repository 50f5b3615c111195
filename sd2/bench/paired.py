"""Paired speed measurement: every method decodes every prompt, in an order that rotates from prompt to
prompt, so a shared machine's drift falls on all methods alike; speeds are compared as per-prompt ratios.

`sd2 bench` runs its cells one after another (all prompts of one method, then the next), which is what
its tables want but leaves a slow minute on one method's cells: on a shared 2-core machine that swings a
speed-up by ±10 %. Here prompt i runs the methods in the order methods[i mod M:] + methods[:i mod M],
each once, and a comparison is the geometric mean over prompts of the ratio of their decode time per
token, with a 95 % bootstrap interval over prompts (`paired_ratio`). τ pools the prompts as `sd2 bench`
does (sd2.metrics.block_efficiency): Σ (accepted + 1) over complete blocks / their number.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for annotations: the τ statistics below serve scripts that load no models
    from sd2.bench.prompts import BenchPrompt
    from sd2.config import DecodeConfig
    from sd2.engine import Engine, GenerationResult


@dataclass
class MethodRuns:
    """One method's generations over a prompt set, one entry per prompt in prompt order."""

    ms_per_token: list[float] = field(default_factory=list)  # decode ms per token after the first
    judged_blocks: list[int] = field(default_factory=list)  # complete speculative blocks
    accepted: list[int] = field(default_factory=list)  # accepted drafts in them
    alphas: list[float] = field(default_factory=list)  # α̂ of the prompts that judged a draft
    costs: list[float] = field(default_factory=list)  # c in decoding, of the prompts that drafted
    outputs: list[list[int]] = field(default_factory=list)  # emitted token ids

    def add(self, result: GenerationResult) -> None:
        metrics = result.metrics
        self.ms_per_token.append(metrics.decode_ms / max(1, metrics.n_tokens - 1))
        self.judged_blocks.append(sum(metrics.histogram))
        self.accepted.append(metrics.accepted)
        self.outputs.append(list(result.token_ids))
        if metrics.alpha_hat is not None:
            self.alphas.append(metrics.alpha_hat)
        if metrics.cost_ratio is not None:
            self.costs.append(metrics.cost_ratio)

    @property
    def tau_cells(self) -> list[tuple[int, int]]:
        """Per prompt: (judged tokens, judged blocks), a complete block judging accepted + 1 tokens."""
        return [(n + blocks, blocks) for n, blocks in zip(self.accepted, self.judged_blocks, strict=True)]

    @property
    def tau(self) -> float | None:
        """Pooled block efficiency; None without a complete speculative block (the verifier alone)."""
        return pooled_tau(self.tau_cells) if sum(self.judged_blocks) else None

    @property
    def alpha_hat(self) -> float | None:
        return statistics.fmean(self.alphas) if self.alphas else None

    @property
    def cost(self) -> float | None:
        """Median over prompts of c = draft step ÷ verifier forward, as measured in decoding."""
        return statistics.median(self.costs) if self.costs else None

    @property
    def total_ms_per_token(self) -> float:
        return math.fsum(self.ms_per_token)


@dataclass(frozen=True)
class Interval:
    """A paired estimate over n prompts with its 95 % bootstrap interval, and on how many prompts the
    first side was the larger: a ratio (no difference at 1) or a difference (no difference at 0)."""

    mean: float
    low: float
    high: float
    above: int
    n: int
    ratio: bool

    @property
    def outside_noise(self) -> bool:
        """Whether the interval excludes "no difference"."""
        neutral = 1.0 if self.ratio else 0.0
        return self.low > neutral or self.high < neutral

    def __str__(self) -> str:
        if self.ratio:
            return f"{self.mean:.3f}× [{self.low:.3f}, {self.high:.3f}]"
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def _percentile_bounds(estimates: list[float]) -> tuple[float, float]:
    """The 2.5 % and 97.5 % points of bootstrap estimates."""
    ordered = sorted(estimates)
    return ordered[int(0.025 * len(ordered))], ordered[int(0.975 * len(ordered)) - 1]


def paired_ratio(num: Sequence[float], den: Sequence[float], draws: int = 2000, seed: int = 0) -> Interval:
    """Geometric mean over i of num[i] / den[i] (positive values, the same prompts in the same order)
    with a 95 % percentile bootstrap interval, prompts resampled with replacement (seeded)."""
    if len(num) != len(den) or not num:
        raise ValueError(f"paired_ratio needs two non-empty lists of one length, got {len(num)}, {len(den)}")
    if min(num) <= 0 or min(den) <= 0:
        raise ValueError("paired_ratio takes positive values only")
    logs = [math.log(a / b) for a, b in zip(num, den, strict=True)]
    rng = random.Random(seed)
    low, high = _percentile_bounds([statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(draws)])
    above = sum(x > 0 for x in logs)
    return Interval(
        math.exp(statistics.fmean(logs)), math.exp(low), math.exp(high), above, len(logs), ratio=True
    )


def pooled_tau(cells: Sequence[tuple[int, int]]) -> float:
    """τ pooled over prompts from their (judged tokens, judged blocks): Σ tokens / Σ blocks (0 without
    a block)."""
    return sum(t for t, _ in cells) / max(1, sum(b for _, b in cells))


def pooled_tau_difference(
    a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]], draws: int = 2000, seed: int = 0
) -> Interval:
    """Pooled τ of `a` − pooled τ of `b`, each given per prompt as (judged tokens, judged blocks) for
    the same prompts in the same order, with a 95 % percentile bootstrap interval (prompts resampled
    with replacement, seeded); `above` counts the prompts where a's own τ is the higher."""
    n = len(a)
    if n == 0 or len(b) != n:
        raise ValueError(f"a τ difference needs runs over the same prompts, got {n} and {len(b)}")
    rng = random.Random(seed)
    estimates = []
    for _ in range(draws):
        sample = [rng.choice(range(n)) for _ in range(n)]
        estimates.append(pooled_tau([a[i] for i in sample]) - pooled_tau([b[i] for i in sample]))
    low, high = _percentile_bounds(estimates)
    above = sum(pooled_tau([x]) > pooled_tau([y]) for x, y in zip(a, b, strict=True))
    return Interval(pooled_tau(a) - pooled_tau(b), low, high, above, n, ratio=False)


def tau_difference(a: MethodRuns, b: MethodRuns, draws: int = 2000, seed: int = 0) -> Interval:
    """τ of `a` − τ of `b` over the same prompts (`pooled_tau_difference`)."""
    return pooled_tau_difference(a.tau_cells, b.tau_cells, draws, seed)


def speedup(runs: MethodRuns, baseline: MethodRuns) -> Interval:
    """How many times faster `runs` decodes than `baseline`, paired per prompt (time per token)."""
    return paired_ratio(baseline.ms_per_token, runs.ms_per_token)


def rotated(methods: Sequence[str], index: int) -> list[str]:
    """The order prompt `index` runs the methods in: each method starts once every len(methods) prompts."""
    shift = index % len(methods)
    return [*methods[shift:], *methods[:shift]]


def run_paired(
    engine: Engine,
    prompts: Iterable[BenchPrompt],
    methods: Sequence[str],
    decode: DecodeConfig,
    warm_up: bool = True,
) -> dict[str, MethodRuns]:
    """Decode every prompt with every method in rotating order (`rotated`); method → its runs. With
    `warm_up`, each method first decodes the first prompt once untimed (first calls of a shape are slow)."""
    prompts = list(prompts)
    if not prompts or not methods:
        raise ValueError("run_paired needs at least one prompt and one method")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods must be distinct, got {list(methods)}")
    if warm_up:
        for method in methods:
            engine.generate(prompts[0].request(method, decode))
    runs = {method: MethodRuns() for method in methods}
    for i, prompt in enumerate(prompts):
        for method in rotated(methods, i):
            runs[method].add(engine.generate(prompt.request(method, decode)))
    return runs
