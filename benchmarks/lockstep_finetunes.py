"""Three fine-tunes separately vs in lockstep (`sd2 train lockstep`), side by side in one process.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/lockstep_finetunes.py [--steps 4] [--threads 2] [--data NAME]

On the real pair — the embedded SmolLM2-135M-Instruct verifier and the shipped `pretrained` drafter
(fp32 master weights) — two sets of the three equal-budget fine-tunes (distill, sd2, sd2-frozen;
8 × 256-token batches, bf16 autocast, k = 4) train on the same batches: one set with a verifier
forward per run and step (what three `sd2 train` runs do), the other sharing one forward per batch
(`sd2.train.lockstep`). A round is one optimiser step of each of the three; rounds alternate between
the sets so machine noise hits both; the first round is a warm-up. Prints the median seconds per round,
the ratio, and whether both sets logged identical losses (they must).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sd2.devices import default_placement
from sd2.models import load_causal_lm, load_tokenizer, resolve_model_path
from sd2.train.build import build_trainer, starting_point
from sd2.train.config import TrainConfig
from sd2.train.lockstep import share_verifier
from sd2.train.sources import training_data
from sd2.train.trainer import TrainData, Trainer

BASE = Path(__file__).resolve().parents[1] / "assets" / "drafters" / "pretrained"
RECIPES = {"distill": ("distill", False), "sd2": ("sd2", False), "sd2-frozen": ("sd2", True)}


def fine_tunes(root: Path, verifier, data: TrainData, steps: int, threads: int) -> list[Trainer]:
    """The three fine-tunes of the shipped base, as `sd2 train` would set them up."""
    trainers = []
    for name, (objective, frozen) in RECIPES.items():
        config = TrainConfig(
            objective=objective, out_dir=str(root / name), steps=steps, lr=5e-4, warmup_steps=1, k=4,
            freeze_drafter=frozen, eval_every=0, save_every=0, seed=4, threads=threads, precision="bf16",
        )  # fmt: skip
        trainers.append(build_trainer(config, verifier, data, starting_point(BASE, config, verifier)))
    return trainers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="rounds per set, the first one untimed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", default="sharegpt", help="training source (an `sd2 train --data` name)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    verifier_path = resolve_model_path(None)
    verifier = load_causal_lm(verifier_path, default_placement())
    data = training_data([args.data], load_tokenizer(verifier_path), eval_prompts=0, seq_len=256)
    data = TrainData(data.train)  # training batches only: the timing is of steps, not validation
    with tempfile.TemporaryDirectory(prefix="sd2-lockstep-") as scratch:
        separate = fine_tunes(Path(scratch) / "separate", verifier, data, args.steps, args.threads)
        lockstep = fine_tunes(Path(scratch) / "lockstep", verifier, data, args.steps, args.threads)
        shared = share_verifier(lockstep)
        seconds: dict[str, list[float]] = {"separate": [], "lockstep": []}
        for trainer in separate + lockstep:
            trainer.start()
        for _ in range(args.steps):
            for name, trainers in (("separate", separate), ("lockstep", lockstep)):
                start = time.perf_counter()
                for trainer in trainers:
                    trainer.advance()
                seconds[name].append(time.perf_counter() - start)
        identical = all(
            [h["loss"] for h in a.history] == [h["loss"] for h in b.history]
            for a, b in zip(separate, lockstep, strict=True)
        )
        for trainer in separate + lockstep:
            trainer.finish()
    median = {name: statistics.median(times[1:]) for name, times in seconds.items()}
    print(f"# Three fine-tunes, separate vs lockstep — {datetime.date.today()}")
    print(f"machine: {platform.platform()}, {args.threads} torch threads; data: {args.data}, 8 × 256, bf16")
    print("| set | s per round (distill + sd2 + sd2-frozen step) | verifier forwards |")
    print("|---|---|---|")
    print(f"| separate | {median['separate']:.2f} | {3 * args.steps} |")
    print(f"| lockstep | {median['lockstep']:.2f} | {shared.computed} (+{shared.shared} shared) |")
    print(f"speed-up: {median['separate'] / median['lockstep']:.2f}×; identical losses: {identical}")
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
