"""The steering gain of one cell (`sd2 bench --counterfactual`): each steered block's own draft against
the same drafter's unsteered draft from the same prefix, both judged by the verifier
(sd2.counterfactual, docs/metrics.md#steering-gain).

Conventions:
- per block, the expected accepted drafts of each draft, Σ_j Π_{i≤j} min(1, p_i/q_i) (exact counts at
  T = 0); gain = steered − unsteered; won / tied / lost by that difference (sd2.trace.steering_outcome).
- steered, unsteered and gain are pooled over every block of the cell (block-level means).
- the 95 % interval is not over blocks: blocks of one prompt share its context and are correlated, so
  each prompt is one paired sample, its mean gain per block (its samples pooled, `--samples`), and the
  interval is Student-t over those per-prompt means (sd2.stats.mean_interval).
- only the cell's first repetition counts: later ones redraw the same generations (they are for timing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from operator import add

from sd2.bench.measure import CounterfactualSums, Measurement
from sd2.stats import mean_interval


@dataclass(frozen=True)
class CellGain:
    """Steered against unsteered drafts over the blocks of one cell (conventions: module doc)."""

    n_prompts: int  # prompts with at least one counterfactual block: the interval's sample size
    n_blocks: int  # blocks with a counterfactual
    steered: float  # mean expected accepted drafts per block of the steered drafts (pooled over blocks)
    unsteered: float  # the same for the unsteered counterfactual drafts
    gain: float  # steered − unsteered, pooled over blocks
    prompt_gain: float  # mean over prompts of each prompt's mean gain per block
    low: float | None  # 95 % t interval of prompt_gain; None with a single prompt
    high: float | None
    won: int
    tied: int
    lost: int


def per_prompt_sums(runs: Sequence[Measurement]) -> dict[str, CounterfactualSums]:
    """prompt id → its counterfactual sums over the samples of the first timed repetition (warm-ups,
    repeat −1, never count); prompts without a counterfactual block (unsteered methods, or a first
    token that stopped the run) are left out."""
    timed = [m for m in runs if m.repeat >= 0]
    if not timed:
        return {}
    first = min(m.repeat for m in timed)
    sums: dict[str, CounterfactualSums] = {}
    for m in timed:
        record = m.stats.counterfactual
        if m.repeat == first and record is not None and record.n_blocks:
            sums[m.prompt_id] = sums[m.prompt_id] + record if m.prompt_id in sums else record
    return sums


def cell_gain(runs: Sequence[Measurement]) -> CellGain | None:
    """The steering gain of one cell's timed runs; None when none carries a counterfactual."""
    prompts = per_prompt_sums(runs)
    if not prompts:
        return None
    total = reduce(add, prompts.values())
    interval = mean_interval([s.gain / s.n_blocks for s in prompts.values()])
    return CellGain(
        n_prompts=len(prompts),
        n_blocks=total.n_blocks,
        steered=total.steered / total.n_blocks,
        unsteered=total.unsteered / total.n_blocks,
        gain=total.gain / total.n_blocks,
        prompt_gain=interval.mean,
        low=interval.low,
        high=interval.high,
        won=total.won,
        tied=total.tied,
        lost=total.lost,
    )
