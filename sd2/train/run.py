"""Turning `sd2 train` arguments into a Trainer run (the command-line edge)."""

from __future__ import annotations

import argparse
import logging

import torch
from transformers import AutoModelForCausalLM

from sd2.devices import default_placement
from sd2.models import (
    drafter_weights_folder,
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
    stop_token_ids,
)
from sd2.steering import SteeringHead, has_steering_head, new_head_for
from sd2.train.checkpoint import verify_checkpoint
from sd2.train.config import TrainConfig
from sd2.train.init_drafter import DrafterShape, new_drafter
from sd2.train.sources import training_data
from sd2.train.trainer import Trainer

log = logging.getLogger(__name__)


def run_training(args: argparse.Namespace) -> None:
    config = TrainConfig(
        objective=args.objective,
        out_dir=args.out,
        steps=args.steps,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        k=args.k,
        freeze_drafter=getattr(args, "freeze_drafter", False),
        eval_every=args.eval_every,
        save_every=args.save_every,
        eval_prompts=args.eval_prompts,
        seed=args.seed,
        skip_batches=args.skip_batches,
        threads=args.threads,
        precision=args.precision,
    )
    if config.threads:
        torch.set_num_threads(config.threads)
    verifier_path = resolve_model_path(args.verifier)
    placement = default_placement()
    verifier = load_causal_lm(verifier_path, placement)
    tokenizer = load_tokenizer(verifier_path)
    drafter, head, card = _starting_point(args, config, verifier)
    data = training_data(
        [s.strip() for s in args.data.split(",") if s.strip()],
        tokenizer,
        config.eval_prompts,
        seq_len=args.seq_len,
        validation_name=args.validation_data,
    )
    card = {**card, "base_verifier": args.verifier or "SmolLM2-135M-Instruct (embedded)"}
    trainer = Trainer(
        config, drafter, verifier, data, head, tokenizer, stop_token_ids(verifier, tokenizer), card=card
    )
    out = trainer.run()
    log.info("checkpoint written to %s", out)
    print(out)


def load_trainable_drafter(path) -> torch.nn.Module:
    """fp32 master weights whatever the checkpoint stores (shipped drafters are bf16; on a GPU the
    trainer's autocast brings bf16 back for the forwards)."""
    return AutoModelForCausalLM.from_pretrained(drafter_weights_folder(str(path)), dtype=torch.float32)


def _starting_point(args, config: TrainConfig, verifier):
    """pretrain: a fresh drafter (or, with --from, the checkpoint to keep pretraining); distill/sd2:
    the --from checkpoint (+ a new or existing head for sd2)."""
    if config.objective == "pretrain" and args.base is None:
        shape = DrafterShape(layers=args.layers, hidden=args.hidden, ffn=args.ffn)
        return new_drafter(verifier, shape, seed=config.seed), None, {"architecture": shape.__dict__}
    base_card = verify_checkpoint(args.base)
    drafter = load_trainable_drafter(args.base)
    head = None
    if config.objective == "sd2":
        head = (
            SteeringHead.load(args.base).float()
            if has_steering_head(args.base)
            else new_head_for(verifier, drafter, k=config.k)
        )
    return drafter, head, {"initialised_from": str(args.base), "lineage": lineage(base_card)}


def lineage(base_card: dict) -> list[dict]:
    """The runs behind a starting checkpoint, most recent first: its own summary, then its lineage —
    so a fine-tune's card tells every stage's recipe, data, steps and tokens, not only the last one."""
    recipe = base_card.get("recipe") or {}
    data = base_card.get("data") or {}
    summary = {
        "initialised_from": base_card.get("initialised_from"),
        "exported_from": base_card.get("exported_from"),
        "objective": recipe.get("objective") if isinstance(recipe, dict) else recipe,
        "steps": base_card.get("steps"),
        "tokens_seen": base_card.get("tokens_seen"),
        "sources": data.get("sources") if isinstance(data, dict) else None,
        "wall_time_s": base_card.get("wall_time_s"),
        "final_metrics": base_card.get("final_metrics"),
    }
    return [summary, *base_card.get("lineage", [])]
