"""Pretraining step time: LM head on every position vs only on the trained ones, side by side.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/pretrain_head.py [--steps 6] [--threads 2] [--data NAME]

The shipped `pretrained` drafter (fp32 master weights, bf16 autocast as `sd2 train --precision bf16`)
takes the same training batches (8 × 256 tokens) as full optimiser steps two ways, alternating step
by step so machine noise hits both: the earlier formulation — logits [B, T, V] for every position,
cross-entropy masked afterwards — and `objectives.pretrain_step`, which selects the trained positions
before the 49 152-row tied LM head. Prints median seconds per step, the ratio, and the first-batch
loss of each (they must agree: the same loss, computed on fewer rows).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sd2.data.batches import ShardSet, batches
from sd2.data.shards import ShardConfig
from sd2.models import load_tokenizer, resolve_model_path
from sd2.train.objectives import pretrain_step
from sd2.train.offsets import trained_positions
from sd2.train.run import load_trainable_drafter
from sd2.train.sources import shard_folder

ROOT = Path(__file__).resolve().parents[1]


def every_position_loss(drafter, batch) -> torch.Tensor:
    """The earlier formulation: the head on all B × (T − 1) positions, masked mean afterwards."""
    logits = drafter(input_ids=batch.input_ids).logits[:, :-1]  # [B, T-1, V]
    mask = trained_positions(batch.loss_mask)[:, :-1]  # [B, T-1]
    per_position = F.cross_entropy(logits.float().transpose(1, 2), batch.input_ids[:, 1:], reduction="none")
    return per_position[mask].mean()


def one_step(selected: bool, drafter, batch, optimizer) -> tuple[float, float]:
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = pretrain_step(drafter, batch).loss if selected else every_position_loss(drafter, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start, float(loss.detach())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per formulation")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", default="sharegpt-turns", help="training source (sd2 train --data name)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(resolve_model_path(None))
    rows = ShardSet(shard_folder(args.data, "train", tokenizer, ShardConfig(seq_len=256)))
    data = list(itertools.islice(batches(rows, 8, seed=0, trim=True), args.steps + 1))  # + 1 warm-up
    learned = sum(int(trained_positions(b.loss_mask)[:, :-1].sum()) for b in data)
    slots = sum(b.input_ids[:, :-1].numel() for b in data)
    print(
        f"# Pretraining step, LM head on every position vs trained positions only — {datetime.date.today()}, "
        f"{platform.machine()}, {args.threads} threads, torch {torch.__version__}, bf16 autocast, "
        f"data {args.data}: {learned / slots:.0%} of positions learned\n"
    )
    runs = {}
    for selected in (False, True):
        drafter = load_trainable_drafter(ROOT / "assets" / "drafters" / "pretrained").train()
        runs[selected] = (drafter, torch.optim.AdamW(drafter.parameters(), lr=1e-4), [], [])
    for batch in data:
        for selected in (False, True):  # alternate, so noise from the rest of the machine hits both
            drafter, optimizer, times, losses = runs[selected]
            seconds, loss = one_step(selected, drafter, batch, optimizer)
            times.append(seconds)
            losses.append(loss)
    every, only = (statistics.median(runs[s][2][1:]) for s in (False, True))
    print("| head on | s/step | loss on batch 1 |")
    print("|---|---|---|")
    print(f"| every position | {every:.2f} | {runs[False][3][0]:.4f} |")
    print(f"| trained positions (pretrain_step) | {only:.2f} | {runs[True][3][0]:.4f} |")
    print(f"\nspeed-up {every / only:.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
