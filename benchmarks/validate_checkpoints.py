"""Validation metrics of drafter checkpoints without training: KL / top-1 agreement on held-out
validation rows and τ decoded by the engine on 4 validation prompts — exactly what `sd2 train` logs.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/validate_checkpoints.py \
        --validation-data synth:SYNTH_VAL.jsonl assets/drafters/*

Used for the "stage-2 checkpoint" column of assets/drafters/README.md (stage 3). Checkpoints with a
steering head are validated steered.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from sd2.devices import default_placement
from sd2.models import load_causal_lm, load_tokenizer, resolve_model_path
from sd2.steering import SteeringHead, has_steering_head
from sd2.train.build import StartingPoint, build_trainer, load_trainable_drafter
from sd2.train.config import TrainConfig
from sd2.train.sources import validation_data
from sd2.train.trainer import TrainData


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--validation-data", default="sharegpt")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model_path(None)
    verifier = load_causal_lm(path, default_placement("cpu"))
    tokenizer = load_tokenizer(path)
    rows, prompts, _ = validation_data(args.validation_data, tokenizer, 4, seq_len=args.seq_len)
    data = TrainData(train=rows, validation=rows, eval_prompts=prompts)  # nothing is trained
    print("| checkpoint | val KL | top-1 agreement | τ |\n|---|---|---|---|")
    for folder in args.checkpoints:
        drafter = load_trainable_drafter(folder)
        head = SteeringHead.load(folder).float() if has_steering_head(folder) else None
        with tempfile.TemporaryDirectory() as scratch:
            config = TrainConfig(
                objective="sd2" if head is not None else "distill", out_dir=f"{scratch}/unused", k=args.k
            )
            trainer = build_trainer(config, verifier, data, StartingPoint(drafter, head, {}), tokenizer)
            m = trainer.validate()
        print(
            f"| {folder} | {m['val_loss']:.3f} | {m['val_agreement']:.3f} | {m['val_tau']:.3f} |", flush=True
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
