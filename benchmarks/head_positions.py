"""Training step time: output heads on every position vs only on the trained ones, side by side.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/head_positions.py [--steps 6] [--threads 2] [--data NAME]

For each recipe (pretrain, distill, sd2) on the real pair — the embedded SmolLM2-135M-Instruct verifier,
the shipped `pretrained` drafter (fp32 master weights) and the shipped `sd2` head — the same training
batches (8 × 256 tokens, bf16 autocast as `sd2 train --precision bf16`) run as full optimiser steps two
ways, alternating step by step so machine noise hits both: the earlier formulation — logits [B, T, V]
of every position from verifier and drafter, losses masked afterwards — and `sd2.train.objectives`,
which selects the trained positions before the 49 152-row output heads (`logits_at`). Prints median
seconds per step, the ratio, and each formulation's loss on the first batch (they must agree).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import platform
import time

import torch
import torch.nn.functional as F
from alternating_steps import alternate  # benchmarks/ is the script's directory

from sd2.data.batches import ShardSet, batches
from sd2.data.shards import ShardConfig
from sd2.devices import default_placement
from sd2.models import load_causal_lm, load_tokenizer, resolve_model_path
from sd2.steering import anchored_biases, captured_states, stack_features, steered
from sd2.train.objectives import distill_step, pretrain_step
from sd2.train.offsets import sample_anchors, trained_positions
from sd2.train.sources import shard_folder


def every_position_loss(recipe: str, drafter, head, verifier, batch) -> torch.Tensor:
    """The earlier formulation: full [B, T, V] logits, masked means afterwards."""
    ids = batch.input_ids  # [B, T]
    mask = trained_positions(batch.loss_mask)  # [B, T]
    if recipe == "pretrain":
        logits = drafter(input_ids=ids).logits[:, :-1]  # [B, T-1, V]
        per_position = F.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")
        return per_position[mask[:, :-1]].mean()
    layers = head.config.verifier_layers if head is not None else ()
    with torch.no_grad(), captured_states(verifier, layers) as states:
        target = verifier(input_ids=ids).logits  # [B, T, V]
    if head is None:
        draft = drafter(input_ids=ids).logits
    else:
        anchors = sample_anchors(batch.loss_mask, 4, torch.Generator().manual_seed(0))
        with steered(drafter, anchored_biases(head, stack_features(states, layers), anchors)):
            draft = drafter(input_ids=ids).logits
    target_logp, draft_logp = F.log_softmax(target.float(), -1), F.log_softmax(draft.float(), -1)
    return (target_logp.exp() * (target_logp - draft_logp)).sum(-1)[mask].mean()


def one_step(selected: bool, recipe: str, drafter, head, verifier, batch, optimizer) -> tuple[float, float]:
    """One optimiser step; returns (seconds, loss)."""
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if not selected:
            loss = every_position_loss(recipe, drafter, head, verifier, batch)
        elif recipe == "pretrain":
            loss = pretrain_step(drafter, batch).loss
        else:
            generator = torch.Generator().manual_seed(0)
            loss = distill_step(drafter, verifier, batch, head, 4, generator).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start, float(loss.detach())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per formulation and recipe")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", default="sharegpt", help="training source (an `sd2 train --data` name)")
    parser.add_argument("--recipes", nargs="+", default=["pretrain", "distill", "sd2"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    verifier_path = resolve_model_path(None)
    verifier = load_causal_lm(verifier_path, default_placement("cpu")).requires_grad_(False).eval()
    tokenizer = load_tokenizer(verifier_path)
    rows = ShardSet(shard_folder(args.data, "train", tokenizer, ShardConfig(seq_len=256)))
    data = list(itertools.islice(batches(rows, 8, seed=0, trim=True), args.steps + 1))  # + 1 warm-up
    learned = sum(int(trained_positions(b.loss_mask).sum()) for b in data)
    slots = sum(b.input_ids.numel() for b in data)
    print(
        f"# Output heads on every position vs trained positions only — {datetime.date.today()}, "
        f"{platform.machine()}, {args.threads} threads, torch {torch.__version__}, bf16 autocast, "
        f"data {args.data} ({learned / slots:.0%} of positions trained)\n"
    )
    print("| recipe | every position s/step | trained only s/step | speed-up | loss every | loss trained |")
    print("|---|---|---|---|---|---|")
    for recipe in args.recipes:

        def step(selected, drafter, head, batch, optimizer, recipe=recipe):
            return one_step(selected, recipe, drafter, head, verifier, batch, optimizer)

        result = alternate(recipe, data, step)
        (every, l_every), (only, l_only) = result[False], result[True]
        row = f"| {recipe} | {every:.2f} | {only:.2f} | {every / only:.2f}× | {l_every:.4f} | {l_only:.4f} |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
