"""Putting a training run together: its starting point (a checkpoint, a fresh drafter, or models in
memory) and the Trainer on top. `sd2 train` (single and lockstep runs) and the service's jobs all build
their Trainer with `build_trainer`."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from sd2.draft_vocab import DraftVocab
from sd2.models import drafter_card, drafter_vocab, drafter_weights_folder, stop_token_ids
from sd2.steering import SteeringHead, has_steering_head, new_head_for
from sd2.train.checkpoint import verify_checkpoint
from sd2.train.config import TrainConfig
from sd2.train.init_drafter import DrafterShape, new_drafter
from sd2.train.trainer import TrainCallback, TrainData, Trainer
from sd2.verifier_embeddings import attach_verifier_embeddings, loading_weights


class StartingPoint(NamedTuple):
    """What a run starts from: the drafter, its steering head (None: none yet), what the
    checkpoint's card says about where they came from, and the reduced draft vocabulary its
    checkpoints keep shipping (it depends on the verifier's output, not on the drafter's weights)."""

    drafter: nn.Module
    head: SteeringHead | None
    card: dict
    draft_vocab: DraftVocab | None = None


def build_trainer(
    config: TrainConfig,
    verifier: nn.Module | None,
    data: TrainData,
    start: StartingPoint,
    tokenizer=None,
    *,
    card: dict | None = None,
    callbacks: Sequence[TrainCallback] = (),
    model_lock: AbstractContextManager | None = None,
) -> Trainer:
    """The run's Trainer: fp32 master weights in training mode, a fresh (zero-steering) head for an sd2
    run that starts without one, the verifier's stop tokens for τ; `card` adds to the start's card."""
    drafter = start.drafter.float().train()
    head = start.head
    if config.objective == "sd2" and head is None and verifier is not None:  # else Trainer refuses
        head = new_head_for(verifier, drafter, k=config.k)
    if head is not None:
        head = head.float().train()
    stop_ids = (
        stop_token_ids(verifier, tokenizer) if verifier is not None and tokenizer is not None else frozenset()
    )
    return Trainer(
        config,
        drafter,
        verifier,
        data,
        head,
        tokenizer,
        stop_ids,
        callbacks=callbacks,
        card={**start.card, **(card or {})},
        model_lock=model_lock,
        draft_vocab=start.draft_vocab,
    )


def starting_point(
    base: str | Path | None, config: TrainConfig, verifier: nn.Module, shape: DrafterShape | None = None
) -> StartingPoint:
    """pretrain: a fresh drafter of `shape` (default DrafterShape()) seeded by config.seed, or, with a
    base, the checkpoint to keep pretraining; distill/sd2: the base checkpoint (+ its head for sd2,
    where it has one)."""
    if config.objective == "pretrain" and base is None:
        shape = shape or DrafterShape()
        drafter = new_drafter(verifier, shape, seed=config.seed)
        return StartingPoint(drafter, None, {"architecture": shape.__dict__})
    base_card = verify_checkpoint(base)
    drafter = load_trainable_drafter(base, verifier)
    head = SteeringHead.load(base).float() if config.objective == "sd2" and has_steering_head(base) else None
    card = {"initialised_from": str(base), "lineage": lineage(base_card)}
    return StartingPoint(drafter, head, card, drafter_vocab(base))


def load_trainable_drafter(path, verifier: nn.Module | None = None) -> torch.nn.Module:
    """fp32 master weights whatever the checkpoint stores (shipped drafters are bf16; on a GPU the
    trainer's autocast brings bf16 back for the forwards). A drafter that borrows its verifier's
    embeddings takes them from `verifier`."""
    card = drafter_card(path)
    with loading_weights(card):
        drafter = AutoModelForCausalLM.from_pretrained(drafter_weights_folder(str(path)), dtype=torch.float32)
    attach_verifier_embeddings(drafter, card, verifier, str(path))
    return drafter


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
