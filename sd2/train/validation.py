"""Periodic validation: KL / agreement on held-out batches, and τ measured by the real engine."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from sd2.config import DecodeConfig
from sd2.data.batches import ShardSet
from sd2.decoding import SpeculativeDecoder
from sd2.metrics import summarize
from sd2.proposer import Proposer
from sd2.steering import SteeringHead
from sd2.train.offsets import prompt_lengths


def held_out_prompts(validation: ShardSet, count: int) -> list[list[int]]:
    """The chat-templated prompts of the first `count` validation rows (their responses are not used)."""
    prompts = []
    for row in range(min(count, len(validation))):
        length = int(prompt_lengths(validation.loss_mask[row : row + 1])[0])
        if length > 0:
            prompts.append(validation.input_ids[row, :length].tolist())
    return prompts


@torch.no_grad()
def measure_tau(
    verifier: nn.Module,
    drafter: nn.Module,
    head: SteeringHead | None,
    prompts: Sequence[Sequence[int]],
    k: int,
    max_new_tokens: int,
    stop_ids: frozenset[int],
) -> float | None:
    """Greedy τ over the prompts, pooled over blocks (token-weighted), by actually decoding."""
    config = DecodeConfig(k=k, temperature=0.0, max_new_tokens=max_new_tokens)
    accepted, blocks = 0, 0
    for prompt in prompts:
        trace = list(SpeculativeDecoder(verifier, Proposer(drafter, head), config, stop_ids).run(prompt))
        metrics = summarize(trace, k)
        complete = sum(metrics.histogram)
        accepted, blocks = accepted + metrics.accepted, blocks + complete
    return 1 + accepted / blocks if blocks else None
