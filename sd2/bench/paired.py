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
    def tau(self) -> float | None:
        """Pooled block efficiency; None without a complete speculative block (the verifier alone)."""
        blocks = sum(self.judged_blocks)
        return (sum(self.accepted) + blocks) / blocks if blocks else None

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
class Ratio:
    """A geometric-mean ratio over prompts with its 95 % bootstrap interval, and on how many prompts the
    numerator was the larger."""

    mean: float
    low: float
    high: float
    above: int
    n: int

    @property
    def outside_noise(self) -> bool:
        """Whether the interval excludes 1."""
        return self.low > 1 or self.high < 1

    def __str__(self) -> str:
        return f"{self.mean:.3f}× [{self.low:.3f}, {self.high:.3f}]"


def paired_ratio(num: Sequence[float], den: Sequence[float], draws: int = 2000, seed: int = 0) -> Ratio:
    """Geometric mean over i of num[i] / den[i] (positive values, the same prompts in the same order)
    with a 95 % percentile bootstrap interval, prompts resampled with replacement (seeded)."""
    if len(num) != len(den) or not num:
        raise ValueError(f"paired_ratio needs two non-empty lists of one length, got {len(num)}, {len(den)}")
    if min(num) <= 0 or min(den) <= 0:
        raise ValueError("paired_ratio takes positive values only")
    logs = [math.log(a / b) for a, b in zip(num, den, strict=True)]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(draws))
    low, high = means[int(0.025 * draws)], means[int(0.975 * draws) - 1]
    above = sum(x > 0 for x in logs)
    return Ratio(math.exp(statistics.fmean(logs)), math.exp(low), math.exp(high), above, len(logs))


@dataclass(frozen=True)
class Difference:
    """A difference of pooled τ over the same prompts with its 95 % bootstrap interval, and on how many
    prompts the first method's own τ was the higher."""

    mean: float
    low: float
    high: float
    above: int
    n: int

    @property
    def outside_noise(self) -> bool:
        """Whether the interval excludes 0."""
        return self.low > 0 or self.high < 0

    def __str__(self) -> str:
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def _pooled_tau(runs: MethodRuns, prompts: Sequence[int]) -> float:
    blocks = sum(runs.judged_blocks[i] for i in prompts)
    return (sum(runs.accepted[i] for i in prompts) + blocks) / blocks if blocks else 1.0


def tau_difference(a: MethodRuns, b: MethodRuns, draws: int = 2000, seed: int = 0) -> Difference:
    """τ of `a` − τ of `b`, both pooled over the same prompts, with a 95 % percentile bootstrap interval
    (prompts resampled with replacement, seeded; a resample without a judged block counts τ as 1)."""
    n = len(a.judged_blocks)
    if n == 0 or len(b.judged_blocks) != n:
        raise ValueError(
            f"tau_difference needs runs over the same prompts, got {n} and {len(b.judged_blocks)}"
        )
    everything = range(n)
    rng = random.Random(seed)
    diffs = []
    for _ in range(draws):
        sample = rng.choices(everything, k=n)
        diffs.append(_pooled_tau(a, sample) - _pooled_tau(b, sample))
    diffs.sort()
    above = sum(_pooled_tau(a, [i]) > _pooled_tau(b, [i]) for i in everything)
    observed = _pooled_tau(a, everything) - _pooled_tau(b, everything)
    return Difference(observed, diffs[int(0.025 * draws)], diffs[int(0.975 * draws) - 1], above, n)


def speedup(runs: MethodRuns, baseline: MethodRuns) -> Ratio:
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
