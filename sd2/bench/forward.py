"""Isolated forward times for the machine's own ceiling S_fwd = τ · T_v(1) / (k · T_d(1) + T_v(k+1)).

Each time is one cached forward after a prompt prefill, on the benchmark's own prompts: T(1) keeps
the last position's logits (a decode or draft step), T(k+1) keeps all k+1 (a verify step), exactly as
`sd2.decoding` calls the models. The cache is cropped back after each timed forward, so every
repetition sees the same context. Sampling and Python bookkeeping are deliberately left out: what
the engine spends on them is what S_fwd / measured speed-up exposes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from sd2.bench.measure import synchronize
from sd2.kv_cache import rollback_cache
from sd2.metrics import forward_ceiling


@dataclass
class ForwardTimes:
    """Median isolated forward times (ms) on one prompt set."""

    prompt_set: str
    verifier_ms: dict[int, float] = field(default_factory=dict)  # tokens per forward (1, k+1) → T_v
    drafter_ms: dict[str, float] = field(default_factory=dict)  # drafter name ("self" = verifier) → T_d(1)

    def ceiling(self, tau: float | None, k: int, drafter: str) -> float | None:
        """S_fwd at τ and k for that drafter, or None when τ or a time is missing."""
        t_v1, t_vk, t_d = self.verifier_ms.get(1), self.verifier_ms.get(k + 1), self.drafter_ms.get(drafter)
        if tau is None or t_v1 is None or t_vk is None or t_d is None:
            return None
        return forward_ceiling(tau, k, t_v1, t_d, t_vk)

    def ms_per_token(self, tau: float | None, k: int | None, drafter: str | None) -> float | None:
        """Forward time per emitted token if nothing but forwards cost time: T_v(1) for the baselines,
        (k · T_d(1) + T_v(k+1)) / τ for a speculative method."""
        if k is None or drafter is None:
            return self.verifier_ms.get(1)
        t_vk, t_d = self.verifier_ms.get(k + 1), self.drafter_ms.get(drafter)
        return (k * t_d + t_vk) / tau if tau and t_vk is not None and t_d is not None else None

    def cost_ratio(self, drafter: str) -> float | None:
        """c_fwd = T_d(1) / T_v(1): the Leviathan cost ratio from isolated forwards."""
        t_v1, t_d = self.verifier_ms.get(1), self.drafter_ms.get(drafter)
        return t_d / t_v1 if t_v1 and t_d is not None else None


@torch.inference_mode()
def time_forward(model: nn.Module, prompt_ids: Sequence[int], n_tokens: int, repeats: int) -> list[float]:
    """Times (ms) of `repeats` cached forwards of n_tokens tokens after a prompt prefill (one warm-up)."""
    device = model.get_input_embeddings().weight.device
    cache = rollback_cache(model)
    model(
        input_ids=torch.tensor([list(prompt_ids)], device=device),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    new = torch.tensor([[prompt_ids[i % len(prompt_ids)] for i in range(n_tokens)]], device=device)  # [1, T]
    keep = 1 if n_tokens == 1 else 0  # a verify step keeps every position's logits
    times = []
    for _ in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        model(input_ids=new, cache=cache, use_cache=True, logits_to_keep=keep)
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
        cache.crop(-n_tokens)
    return times[1:]


def measure_forward_times(
    prompt_set: str,
    verifier: nn.Module,
    drafters: dict[str, nn.Module],
    prompts: Sequence[Sequence[int]],
    ks: Sequence[int],
    repeats: int,
) -> ForwardTimes:
    """T_v(1), T_v(k+1) for each k, and T_d(1) for each drafter, as medians over prompts × repeats."""
    result = ForwardTimes(prompt_set)
    for n_tokens in sorted({1, *(k + 1 for k in ks)}):
        samples = [t for ids in prompts for t in time_forward(verifier, ids, n_tokens, repeats)]
        result.verifier_ms[n_tokens] = statistics.median(samples)
    for name, model in drafters.items():
        if model is verifier:
            result.drafter_ms[name] = result.verifier_ms[1]
            continue
        samples = [t for ids in prompts for t in time_forward(model, ids, 1, repeats)]
        result.drafter_ms[name] = statistics.median(samples)
    return result
