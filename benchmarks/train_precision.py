"""Training step time, fp32 vs bf16 autocast (`sd2 train --precision`), side by side in one process.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/train_precision.py [--steps 6] [--threads 2]

For each recipe (pretrain, distill, sd2) on the real pair — the embedded SmolLM2-135M-Instruct verifier
and the shipped `pretrained` drafter (+ the shipped `sd2` head) — it runs the same ShareGPT training
batches (8 × 256 tokens) as full optimiser steps, alternating fp32 and bf16 step by step so machine
noise hits both, and prints median seconds per step, the speed ratio, and the loss each precision
computes on the first (identical) batch. The first step of each precision is a warm-up, not timed.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import platform
import time

import torch
from alternating_steps import alternate  # benchmarks/ is the script's directory

from sd2.data.batches import ShardSet, batches
from sd2.data.shards import ShardConfig
from sd2.devices import default_placement
from sd2.models import load_causal_lm, load_tokenizer, resolve_model_path
from sd2.train.objectives import distill_step, pretrain_step
from sd2.train.sources import shard_folder


def one_step(recipe: str, drafter, head, verifier, batch, optimizer, bf16: bool) -> tuple[float, float]:
    """One optimiser step; returns (seconds, loss)."""
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if recipe == "pretrain":
            out = pretrain_step(drafter, batch)
        else:
            generator = torch.Generator().manual_seed(0)
            out = distill_step(drafter, verifier, batch, head if recipe == "sd2" else None, 4, generator)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start, float(out.loss.detach())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per precision and recipe")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recipes", nargs="+", default=["pretrain", "distill", "sd2"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    verifier_path = resolve_model_path(None)
    verifier = load_causal_lm(verifier_path, default_placement("cpu")).requires_grad_(False).eval()
    tokenizer = load_tokenizer(verifier_path)
    rows = ShardSet(shard_folder("sharegpt", "train", tokenizer, ShardConfig(seq_len=256)))
    data = list(itertools.islice(batches(rows, 8, seed=0, trim=True), args.steps + 1))  # + 1 warm-up
    print(
        f"# fp32 vs bf16 training steps — {datetime.date.today()}, {platform.machine()}, "
        f"{args.threads} threads, torch {torch.__version__}, bf16 CPU support: "
        f"{torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()}\n"
    )
    print("| recipe | fp32 s/step | bf16 s/step | speed-up | loss fp32 | loss bf16 |")
    print("|---|---|---|---|---|---|")
    for recipe in args.recipes:

        def step(bf16, drafter, head, batch, optimizer, recipe=recipe):
            return one_step(recipe, drafter, head, verifier, batch, optimizer, bf16)

        result = alternate(recipe, data, step)
        (fp32, loss32), (bf16, loss16) = result[False], result[True]
        row = f"| {recipe} | {fp32:.2f} | {bf16:.2f} | {fp32 / bf16:.2f}× | {loss32:.4f} | {loss16:.4f} |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
