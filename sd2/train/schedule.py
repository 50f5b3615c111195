"""Learning-rate schedule: linear warmup, then cosine decay to a floor (one phase at a time)."""

from __future__ import annotations

import math

import torch


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup: int, total: int, floor: float):
    """LambdaLR multiplier: step/warmup during warmup, then cosine from 1 to `floor` at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
