"""Several fine-tunes of one base on the same batches, one step each in turn, sharing the verifier.

A distill / SD² step is mostly the frozen verifier's forward. Runs that agree on SHARED_SETTINGS (the
data order: seed, batch size, accumulation, skipped batches, validation batches; and the precision the
verifier computes in) draw identical batches, so taking their steps in turn lets one verifier forward
per batch serve all of them: the same results as separate runs (`tests/sd2/train/test_lockstep.py`), at
one verifier forward per step instead of one per run and step.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from sd2.data.batches import Batch
from sd2.train.objectives import verifier_targets
from sd2.train.trainer import Trainer

log = logging.getLogger(__name__)

# settings that fix which batches a run draws, and how the verifier computes on them
SHARED_SETTINGS = ("seed", "batch_size", "grad_accum", "skip_batches", "precision", "eval_batches")


class SharedTargets:
    """`objectives.verifier_targets`, computed once per batch for every run that asks for it.

    Keeps the latest `capacity` batches (first in, first out): one optimiser step's micro-batches plus
    the validation batches, which every run evaluates in turn at the same step. Features are captured
    at `layers` (every steered run's head reads the same verifier layers) and handed only to the runs
    that ask for them.
    """

    def __init__(self, layers: tuple[int, ...] | None, capacity: int = 1):
        self.layers, self.capacity = layers, capacity
        self.computed = self.shared = 0  # verifier forwards run / saved, for logs and tests
        self._recent: OrderedDict[tuple[str, ...], tuple] = OrderedDict()

    def __call__(
        self, verifier: nn.Module, batch: Batch, mask: torch.Tensor, layers: tuple[int, ...] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if layers is not None and layers != self.layers:
            raise ValueError(f"verifier layers {layers} requested; this run shares {self.layers}")
        hit = self._recent.get(batch.ids)
        if hit is not None and torch.equal(hit[0], batch.input_ids) and torch.equal(hit[1], mask):
            self.shared += 1
            logits, features = hit[2], hit[3]
        else:
            self.computed += 1
            logits, features = verifier_targets(verifier, batch, mask, self.layers)  # [N, V], [B, T, n·D_v]
            self._recent[batch.ids] = (batch.input_ids, mask, logits, features)
            while len(self._recent) > self.capacity:
                self._recent.popitem(last=False)
        return logits, (features if layers is not None else None)


def share_verifier(trainers: Sequence[Trainer]) -> SharedTargets:
    """Give distill / SD² trainers of one verifier and one data order a common SharedTargets."""
    if not trainers:
        raise ValueError("no runs given")
    first = trainers[0]
    for trainer in trainers:
        if trainer.config.objective == "pretrain":
            raise ValueError(f"{trainer.config.out_dir}: pretraining runs no verifier, nothing to share")
        if trainer.data is not first.data or trainer.unwrapped().verifier is not first.unwrapped().verifier:
            raise ValueError(f"{trainer.config.out_dir}: runs in lockstep need the same verifier and data")
        for name in SHARED_SETTINGS:
            mine, theirs = getattr(trainer.config, name), getattr(first.config, name)
            if mine != theirs:
                raise ValueError(
                    f"{name} differs ({trainer.config.out_dir}: {mine!r}, {first.config.out_dir}: "
                    f"{theirs!r}): runs in lockstep must draw the same batches"
                )
    heads = {t.unwrapped().head.config.verifier_layers for t in trainers if t.unwrapped().head is not None}
    if len(heads) > 1:
        raise ValueError(f"steering heads read different verifier layers {sorted(heads)}; they must match")
    capacity = first.config.grad_accum + first.config.eval_batches
    shared = SharedTargets(next(iter(heads), None), capacity)
    note = lockstep_note([Path(t.config.out_dir).name for t in trainers])
    for trainer in trainers:
        trainer.unwrapped().targets = shared
        trainer.card["trainer"] = note  # every checkpoint's card says how its wall time was shared
    return shared


def lockstep_note(runs: Sequence[str]) -> str:
    """The card's `trainer` entry of a run trained in lockstep with `runs` (their folder names)."""
    return (
        f"sd2 train lockstep ({', '.join(runs)} on the same batches; wall_time_s is this run's share, "
        "the first run of each round carries the shared verifier forwards)"
    )


def run_in_lockstep(trainers: Sequence[Trainer]) -> list[Path]:
    """Run the trainers to completion, one optimiser step each in turn; returns their out_dirs."""
    shared = share_verifier(trainers)
    for trainer in trainers:
        trainer.start()
    running = list(trainers)
    while running:
        running = [trainer for trainer in running if trainer.advance()]
    outs = [trainer.finish() for trainer in trainers]
    log.info("verifier forwards on batches: %d run, %d shared", shared.computed, shared.shared)
    return outs
