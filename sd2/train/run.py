"""Turning `sd2 train` arguments into a Trainer run (the command-line edge)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from sd2.devices import default_placement
from sd2.models import load_causal_lm, load_tokenizer, resolve_model_path, verifier_label
from sd2.train.build import build_trainer, starting_point
from sd2.train.config import TrainConfig
from sd2.train.init_drafter import DrafterShape
from sd2.train.lockstep import run_in_lockstep
from sd2.train.sources import training_data
from sd2.train.trainer import Trainer

log = logging.getLogger(__name__)


def run_training(args: argparse.Namespace) -> None:
    config = _config(args, args.objective, args.out, getattr(args, "freeze_drafter", False))
    verifier, tokenizer, data = _verifier_and_data(args, config)
    trainer = _trainer(args, config, verifier, tokenizer, data, args.base)
    out = trainer.run()
    log.info("checkpoint written to %s", out)
    print(out)


def run_lockstep(args: argparse.Namespace) -> None:
    """`sd2 train lockstep`: the --run fine-tunes (each from its --from base) on the same batches, one
    verifier pass per batch for all of them (`lockstep.run_in_lockstep`)."""
    plan = lockstep_configs(args)
    verifier, tokenizer, data = _verifier_and_data(args, plan[0][0])
    trainers = [_trainer(args, config, verifier, tokenizer, data, base) for config, base in plan]
    for out in run_in_lockstep(trainers):
        log.info("checkpoint written to %s", out)
        print(out)


# recipe name → (objective, freeze_drafter)
LOCKSTEP_RECIPES = {"distill": ("distill", False), "sd2": ("sd2", False), "sd2-frozen": ("sd2", True)}


def lockstep_configs(args: argparse.Namespace) -> list[tuple[TrainConfig, str]]:
    """(TrainConfig, base checkpoint) per --run RECIPE=OUT, the other settings common to all (checked
    before any model loads: each run needs its own folder and exactly one base)."""
    outs = [Path(out).resolve() for _, out in args.runs]
    if len(set(outs)) < len(outs):
        raise ValueError("each --run needs its own OUT folder")
    bases = lockstep_bases(args.bases, [recipe for recipe, _ in args.runs])
    plan = []
    for (recipe, out), base in zip(args.runs, bases, strict=True):
        objective, freeze_drafter = LOCKSTEP_RECIPES[recipe]
        plan.append((_config(args, objective, out, freeze_drafter), base))
    return plan


def lockstep_bases(entries: list[tuple[str | None, str]], recipes: list[str]) -> list[str]:
    """Each run's starting checkpoint from the --from entries: its recipe's own `RECIPE=PATH`, else the
    plain `PATH` every run shares."""
    shared = [path for recipe, path in entries if recipe is None]
    own: dict[str, str] = {}
    for recipe, path in entries:
        if recipe is None:
            continue
        if recipe in own:
            raise ValueError(f"--from {recipe}=… is given twice")
        if recipe not in recipes:
            raise ValueError(f"--from {recipe}={path} names a recipe with no --run {recipe}=OUT")
        own[recipe] = path
    if len(shared) > 1:
        raise ValueError(f"--from PATH is given {len(shared)} times ({', '.join(shared)}): give one")
    default = shared[0] if shared else None
    missing = [r for r in recipes if r not in own and default is None]
    if missing:
        hint = f"add --from PATH or --from {missing[0]}=PATH"
        raise ValueError(f"no base for the {', '.join(missing)} run: {hint}")
    return [own.get(recipe, default) for recipe in recipes]


def _config(args: argparse.Namespace, objective: str, out_dir: str, freeze_drafter: bool) -> TrainConfig:
    return TrainConfig(
        objective=objective,
        out_dir=out_dir,
        steps=args.steps,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        k=args.k,
        freeze_drafter=freeze_drafter,
        freeze_embeddings=getattr(args, "freeze_embeddings", False),  # pretrain has no --freeze-embeddings
        loss=getattr(args, "loss", "kl"),  # pretrain has no --loss
        eval_every=args.eval_every,
        save_every=args.save_every,
        eval_prompts=args.eval_prompts,
        seed=args.seed,
        skip_batches=args.skip_batches,
        threads=args.threads,
        precision=args.precision,
    )


def _verifier_and_data(args: argparse.Namespace, config: TrainConfig):
    if config.threads:  # this command's process: the Trainer leaves the threads to its caller
        torch.set_num_threads(config.threads)
    verifier_path = resolve_model_path(args.verifier)
    verifier = load_causal_lm(verifier_path, rank_placement(getattr(args, "dtype", None)))
    tokenizer = load_tokenizer(verifier_path)
    data = training_data(
        [s.strip() for s in args.data.split(",") if s.strip()],
        tokenizer,
        config.eval_prompts,
        seq_len=args.seq_len,
        validation_name=args.validation_data,
    )
    return verifier, tokenizer, data


def rank_placement(dtype: str | None):
    """This process's placement: under `accelerate launch` each rank loads its frozen verifier straight
    onto its own GPU (the device accelerate assigns it), never all onto cuda:0."""
    from accelerate import PartialState

    # cpu=True where there is no GPU: only then does accelerate run several CPU processes as one job (gloo)
    return default_placement(str(PartialState(cpu=not torch.cuda.is_available()).device), dtype)


def _trainer(
    args: argparse.Namespace, config: TrainConfig, verifier, tokenizer, data, base: str | None
) -> Trainer:
    """The run's Trainer, starting from the `base` checkpoint (None: a fresh pretraining drafter)."""
    start = starting_point(base, config, verifier, _drafter_shape(args))
    card = {"base_verifier": verifier_label(args.verifier)}
    return build_trainer(config, verifier, data, start, tokenizer, card=card)


def _drafter_shape(args: argparse.Namespace) -> DrafterShape:
    """A fresh drafter's shape: `sd2 train pretrain`'s --layers/--hidden/--ffn (the other commands
    start from a checkpoint)."""
    if not hasattr(args, "layers"):
        return DrafterShape()
    return DrafterShape(layers=args.layers, hidden=args.hidden, ffn=args.ffn)
