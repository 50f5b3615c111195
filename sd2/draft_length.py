"""How many tokens a block drafts: k = auto across blocks, and a confidence stop inside one
(`DraftLength`, one request's policy).

k = auto picks, before each block, the k that maximises expected tokens per unit of time,

    S(k) = E[τ](α̂, k) / (k·c + r(k)),   E[τ] = (1 − α̂^{k+1}) / (1 − α̂),

with c = T_d(1) / T_v(1) (a draft step in verifier steps) and r(k) = T_v(k+1) / T_v(1) (a (k+1)-token
verify in verifier steps) measured once for the loaded pair (`measure_costs`), and α̂ the run's own
acceptance so far (`AcceptanceEstimate`). On a GPU r(k) ≈ 1 and long drafts pay; on a CPU r(k) grows
with k and short drafts win — the same rule finds both.

A request decoding among others (sd2.batching) keeps the draft lengths it has alone: its draws depend
on k, and with its seed it must give the tokens of its solo run whatever else decodes beside it.

The confidence stop (the idea of HF's `assistant_confidence_threshold` and SpecDec++) ends a block's draft
once the drafter's probability of its latest draft is ≤ `DecodeConfig.draft_threshold`.

Both are exact: the draft length depends only on the drafter's own draws and on tokens already
committed, and every position is still judged by the same rule
(docs/math.md#acceptance-and-rejection-sampling), so the output keeps the verifier's distribution.
A threshold of 0 never stops (a drafted token has q > 0); 1 always stops after the first draft (q ≤ 1).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from sd2.config import AUTO_MAX_K, DecodeConfig
from sd2.draft_step import DraftStep, EagerDraftStep
from sd2.kv_cache import rollback_cache
from sd2.metrics import expected_block_tokens
from sd2.trace import DraftStop

__all__ = [
    "AcceptanceEstimate",
    "CostProfile",
    "DraftLength",
    "DraftStop",
    "VerifyCosts",
    "measure_costs",
    "measure_verify_costs",
]


@dataclass(frozen=True)
class CostProfile:
    """A pair's measured costs, in units of one cached 1-token verifier forward T_v(1).

    draft_cost:   c = T_d(1) / T_v(1), one cached drafter step (its draft head included).
    verify_ratio: r[k] = T_v(k+1) / T_v(1) for k = 0..max_k (r[0] = 1), made non-decreasing in k.
    """

    draft_cost: float
    verify_ratio: tuple[float, ...]

    @property
    def max_k(self) -> int:
        return len(self.verify_ratio) - 1

    def block_cost(self, k: int) -> float:
        """The time of a block with k drafts, in verifier steps."""
        return k * self.draft_cost + self.verify_ratio[k]

    def best_k(self, alpha: float, max_k: int | None = None) -> int:
        """The k in 1..max_k with the most expected tokens per unit of time at acceptance α."""
        top = self.max_k if max_k is None else min(max_k, self.max_k)
        return max(range(1, top + 1), key=lambda k: expected_block_tokens(alpha, k) / self.block_cost(k))

    def to_dict(self) -> dict:
        return {"draft_cost": self.draft_cost, "verify_ratio": list(self.verify_ratio)}


class AcceptanceEstimate:
    """α̂ of a run so far: accepted drafts over judged draft positions, under a weak Beta prior.

    A block with n accepted of k drafts judged min(n + 1, k) positions (drafts after the first rejection
    were never judged); under i.i.d. acceptance this ratio is the maximum-likelihood α.
    """

    def __init__(self, prior: float = 0.5, weight: float = 2.0):
        self.accepted, self.judged = prior * weight, weight

    def update(self, n_accepted: int, k: int) -> None:
        if k > 0:
            self.accepted += n_accepted
            self.judged += min(n_accepted + 1, k)

    @property
    def value(self) -> float:
        return self.accepted / self.judged


class DraftLength:
    """One request's draft-length policy: how many drafts its next block may hold and why drafting stops
    there (module docstring). Built once per request by `DraftLength.of`; `update` after each block."""

    def __init__(self, k: int | None, max_k: int, threshold: float, costs: CostProfile | None = None):
        """k: a fixed k, or None for k = auto from `costs` (required then) and α̂; `max_k` caps k = auto;
        `threshold`: the confidence stop (0 never stops)."""
        if k is None and costs is None:
            raise ValueError("k = auto needs the pair's cost profile")
        self.k, self.max_k, self.threshold, self.costs = k, max_k, threshold, costs
        self.acceptance = AcceptanceEstimate()

    @classmethod
    def of(cls, config: DecodeConfig, costs: CostProfile | None = None) -> DraftLength:
        """The policy a decode config asks for (`costs`: the pair's profile, needed for k = auto)."""
        if not config.auto_k:
            return cls(int(config.k), int(config.k), config.draft_threshold)
        return cls(None, config.max_k, config.draft_threshold, costs)

    @property
    def longest(self) -> int:
        """The most drafts any block of this request can hold."""
        return self.max_k if self.k is None else self.k

    def next(self, room: int) -> tuple[int, DraftStop]:
        """The next block's k and its stop reason: the fixed k, or the best for α̂ so far under the cost
        profile, unless only `room` tokens fit."""
        k = self.k if self.k is not None else self.costs.best_k(self.acceptance.value, self.max_k)
        return (k, DraftStop.K) if k <= room else (room, DraftStop.LENGTH)

    def update(self, n_accepted: int, k: int) -> None:
        """What a finished block with k drafts accepted, for α̂."""
        self.acceptance.update(n_accepted, k)


def _median_ms(run: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median time of `run` in ms: between two CUDA events on a CUDA device (the kernels' own time, not
    the host's launch loop), by the wall clock elsewhere."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def _forward_step(model: nn.Module, context: int, width: int) -> Callable[[], None]:
    """A cached forward of `width` tokens after `context` tokens, with the logits of every position as a
    verify computes them, rolled back after each call (called once here: first calls of a shape are
    slower)."""
    device = model.get_input_embeddings().weight.device
    cache = rollback_cache(model)
    ids = torch.arange(context + width, device=device)[None] % model.config.vocab_size  # [1, C + W]
    model(input_ids=ids[:, :context], cache=cache, use_cache=True, logits_to_keep=1)

    def step() -> None:
        model(input_ids=ids[:, context:], cache=cache, use_cache=True, logits_to_keep=0)
        cache.crop(-width)

    step()
    return step


@dataclass(frozen=True)
class VerifyCosts:
    """The verifier's half of a cost profile: T_v(1) in ms and r[k] = T_v(k+1) / T_v(1), k = 0..max_k."""

    step_ms: float
    ratio: tuple[float, ...]


@torch.inference_mode()
def measure_verify_costs(verifier: nn.Module, max_k: int, context: int = 64, repeats: int = 5) -> VerifyCosts:
    """Time the verifier's cached forwards of 1..max_k+1 tokens as it will run (its batch-invariant
    kernels included), the widths taking turns in each of `repeats` rounds, each width's median kept. r is
    the non-decreasing fit of the measured ratios (`monotone_fit`), so timing noise never makes a longer
    verify look cheaper than a shorter one — and one slow measurement does not raise every longer k to
    its height, as a running maximum did (on a busy machine that could pin k = auto to 1 for a run)."""
    device = verifier.get_input_embeddings().weight.device
    steps = [_forward_step(verifier, context, width) for width in range(1, max_k + 2)]
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(repeats):  # every width once per round: a load that comes and goes slows all alike
        for width_times, step in zip(times, steps, strict=True):
            width_times.append(_median_ms(step, 1, device))
    step_ms, *longer = (statistics.median(width_times) for width_times in times)
    measured = [ms / step_ms for ms in longer]
    return VerifyCosts(step_ms, (1.0, *(max(1.0, r) for r in monotone_fit(measured))))


def monotone_fit(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest to `values` in least squares (pool adjacent violators: a run
    that decreases is replaced by its mean)."""
    blocks: list[list[float]] = []  # [mean, count] of each pooled run, means non-decreasing
    for value in values:
        blocks.append([value, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            previous = blocks[-1]
            previous[0] = (previous[0] * previous[1] + mean * count) / (previous[1] + count)
            previous[1] += count
    return [mean for mean, count in blocks for _ in range(int(count))]


@torch.inference_mode()
def measure_costs(
    verifier: nn.Module,
    drafter: nn.Module,
    draft_head: nn.Module | None = None,
    max_k: int = AUTO_MAX_K,
    verify: VerifyCosts | None = None,
    context: int = 64,
    repeats: int = 3,
    draft_step: DraftStep | None = None,
) -> CostProfile:
    """The pair's cost profile from timed forwards (a few seconds on a CPU; `verify` reuses the verifier's
    half when it was measured already). The drafter step is timed as decoding runs it: through
    `draft_step` (sd2.draft_step; default eager), its draft head included when it has one."""
    verify = verify or measure_verify_costs(verifier, max_k, context, repeats)
    drafter_ms = _draft_step_ms(draft_step or EagerDraftStep(drafter, draft_head), drafter, context, repeats)
    return CostProfile(draft_cost=drafter_ms / verify.step_ms, verify_ratio=verify.ratio[: max_k + 1])


def _draft_step_ms(step: DraftStep, drafter: nn.Module, context: int, repeats: int) -> float:
    """Median time of one cached one-token draft step after `context` tokens (unsteered)."""
    device = drafter.get_input_embeddings().weight.device
    ids = [i % drafter.config.vocab_size for i in range(context + 1)]
    step.start(ids[:context], room=1)

    def one() -> None:
        step.logits(ids[context:])
        step.crop_to(context)

    one()  # warm-up: first calls of a shape are slower (and a compiled step records its graph)
    return _median_ms(one, repeats, device)
