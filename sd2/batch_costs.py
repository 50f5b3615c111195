"""What one request's block costs when it decodes among n requests (sd2.batching), for k = auto under load.

Alone, a verify of k+1 tokens costs little more than one token on a CPU (the step is bound by dispatch),
so k = auto drafts long. In a batch the verifier's forward holds n·(k+1) rows and turns bound by
arithmetic: every draft a row adds costs the whole batch time. The profile of a row among n requests
keeps the unit of the solo one (T_v(1), a cached 1-token verifier forward alone):

    c_n    = T_d(n rows) / n / T_v(1)         one drafter step of n rows (one ragged forward), per row
    r_n(k) = T_v(n × (k+1) rows) / n / T_v(1)  one verifier forward of n requests' k+1 rows, per row

so `CostProfile.best_k` weighs a row's expected tokens against its share of the batch's time. Profiles are
measured for n a power of two (2, 4, …, MAX_REQUESTS) on first use and kept; a batch of n requests uses
the largest measured size ≤ n. Where the batch would run a model's calls one by one (sd2.batching:
a model off the invariant kernels, a compiled draft step), that half keeps its solo cost.

Dims: n requests, C context tokens per request, k drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sd2.draft_length import CostProfile, median_ms
from sd2.invariant import MAX_ROWS, is_batch_invariant
from sd2.kv_cache import crop_to, rollback_cache
from sd2.ragged import Segment, ragged_forward, supports_ragged

MAX_REQUESTS = 16  # the largest batch measured; larger batches use its profile
MAX_K = 8  # the longest draft a profile under load considers (n·(k+1) ≤ MAX_ROWS caps it further)
CONTEXT = 64  # tokens cached per request while timing (as the solo profile)
REPEATS = 2


def batchable(model: nn.Module) -> bool:
    """Whether a batch runs this model's calls of several requests as one ragged forward (sd2.batching)."""
    return is_batch_invariant(model) and supports_ragged(model)


def load_size(requests: int) -> int:
    """The measured batch size whose profile a batch of `requests` uses: the largest power of two ≤ it."""
    size = 1
    while size * 2 <= min(requests, MAX_REQUESTS):
        size *= 2
    return size


@dataclass(frozen=True)
class DrafterParts:
    """What a drafter step runs: the model, its reduced draft head (or None), whether its steps are
    batched (eager on invariant kernels) or run one by one."""

    model: nn.Module
    draft_head: nn.Module | None
    batched: bool


class LoadCosts:
    """The cost profiles of a row among n requests, measured on first use and kept: the verifier's half
    once per n, a drafter's half once per method and n. Not thread-safe: the batch's owner asks."""

    def __init__(self, verifier: nn.Module):
        self.verifier = verifier
        self._verify: dict[int, tuple[float, ...]] = {}  # n → r_n(0..K) in ms per row
        self._draft: dict[tuple[str, int], float] = {}  # (method, n) → ms per row

    def profile(
        self, method: str, parts: DrafterParts, solo: CostProfile, step_ms: float, requests: int
    ) -> CostProfile:
        """The profile k = auto uses for a row of `method` among `requests` requests; `solo` is the pair's
        own profile and `step_ms` its unit T_v(1) in ms."""
        n = load_size(requests)
        if n == 1:
            return solo
        if batchable(self.verifier):
            if n not in self._verify:
                self._verify[n] = _verify_ms_per_row(self.verifier, n)
            ratios = _running_max([ms / step_ms for ms in self._verify[n]])
        else:
            ratios = list(solo.verify_ratio)
        if not parts.batched:
            draft_cost = solo.draft_cost
        else:
            if (method, n) not in self._draft:
                self._draft[method, n] = _draft_ms_per_row(parts.model, parts.draft_head, n)
            draft_cost = self._draft[method, n] / step_ms
        longest = min(len(ratios), solo.max_k + 1)
        return CostProfile(draft_cost=draft_cost, verify_ratio=tuple(ratios[:longest]))

    def forget(self, method: str) -> None:
        """Drop a method's drafter halves (its drafter was replaced)."""
        for key in [key for key in self._draft if key[0] == method]:
            del self._draft[key]

    @property
    def measured_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self._verify))


def _running_max(values: list[float]) -> list[float]:
    """Timing noise never makes a longer verify look cheaper than a shorter one."""
    out, worst = [], 0.0
    for value in values:
        worst = max(worst, value)
        out.append(worst)
    return out


def _caches(model: nn.Module, n: int) -> list:
    """n caches of CONTEXT tokens each (different ids per request, as in a real batch)."""
    caches = []
    vocab = model.config.vocab_size
    for i in range(n):
        cache = rollback_cache(model)
        ragged_forward(
            model, [Segment([(7 * i + t) % vocab for t in range(CONTEXT)], cache, all_logits=False)]
        )
        caches.append(cache)
    return caches


@torch.inference_mode()
def _verify_ms_per_row(verifier: nn.Module, n: int) -> tuple[float, ...]:
    """T_v(n × (k+1) rows) / n in ms for k = 0..min(MAX_K, MAX_ROWS // n − 1), every row's logits kept."""
    device = verifier.get_input_embeddings().weight.device
    caches = _caches(verifier, n)
    times = []
    for k in range(min(MAX_K, MAX_ROWS // n - 1) + 1):

        def forward(k: int = k) -> None:
            ragged_forward(verifier, [Segment(list(range(1, k + 2)), cache) for cache in caches])
            for cache in caches:
                crop_to(cache, CONTEXT)

        forward()  # warm-up: first calls of a shape are slower
        times.append(median_ms(forward, REPEATS, device) / n)
    return tuple(times)


@torch.inference_mode()
def _draft_ms_per_row(drafter: nn.Module, draft_head: nn.Module | None, n: int) -> float:
    """T_d(n rows) / n in ms: one drafter step of n requests, only the last logits kept, as batched."""
    device = drafter.get_input_embeddings().weight.device
    caches = _caches(drafter, n)

    def step() -> None:
        ragged_forward(drafter, [Segment([1], cache, all_logits=False) for cache in caches], head=draft_head)
        for cache in caches:
            crop_to(cache, CONTEXT)

    step()
    return median_ms(step, REPEATS, device) / n
