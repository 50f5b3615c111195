"""Two variants of a training step on the same batches, alternating step by step, in one process.

Shared by `train_precision.py` (fp32 vs bf16) and `head_positions.py` (heads on every position vs on
trained positions). Each variant gets its own copy of the shipped `pretrained` drafter (fp32 master
weights; + the shipped `sd2` head for the sd2 recipe) and optimiser; alternating makes noise from the
rest of the machine hit both. The first step of each variant is a warm-up, not timed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from sd2.steering import SteeringHead
from sd2.train.build import load_trainable_drafter

DRAFTERS = Path(__file__).resolve().parents[1] / "assets" / "drafters"

# step(variant, drafter, head, batch, optimizer) -> (seconds, loss) for one full optimiser step
Step = Callable[
    [bool, torch.nn.Module, SteeringHead | None, object, torch.optim.Optimizer], tuple[float, float]
]


def alternate(recipe: str, data: Sequence, step: Step) -> dict[bool, tuple[float, float]]:
    """variant (False, True) → (median seconds per step after the warm-up, loss on the first batch)."""
    runs = {}
    for variant in (False, True):
        drafter = load_trainable_drafter(DRAFTERS / "pretrained").train()
        head = SteeringHead.load(DRAFTERS / "sd2").float().train() if recipe == "sd2" else None
        params = list(drafter.parameters()) + (list(head.parameters()) if head is not None else [])
        runs[variant] = (drafter, head, torch.optim.AdamW(params, lr=1e-4), [], [])
    for batch in data:
        for variant in (False, True):
            drafter, head, optimizer, times, losses = runs[variant]
            seconds, loss = step(variant, drafter, head, batch, optimizer)
            times.append(seconds)
            losses.append(loss)
    return {v: (statistics.median(runs[v][3][1:]), runs[v][4][0]) for v in (False, True)}
