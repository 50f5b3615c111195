"""A short fine-tune of a drafter an Engine has loaded, on a handful of texts: what the service's
training jobs run (`service.training`). Larger runs belong to `sd2 train` (sd2.train.run); both build
their Trainer with `build_trainer`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from sd2.data.batches import ShardSet
from sd2.data.examples import Example
from sd2.data.shards import ShardConfig, build_shards
from sd2.engine import Engine
from sd2.invariant import make_stock
from sd2.models import context_length, drafter_vocab
from sd2.prompts import encode_prompt
from sd2.train.build import StartingPoint, build_trainer
from sd2.train.config import TrainConfig
from sd2.train.trainer import TrainCallback, TrainData, Trainer

BUILTIN_TEXTS = (
    "The sky is blue because air scatters short wavelengths of sunlight more than long ones.",
    "Speculative decoding lets a small drafter propose tokens that a large verifier checks in one pass.",
    "A good explanation starts with the main idea, then gives one example, then a short summary.",
    "def mean(values):\n    return sum(values) / len(values)\n",
)
EVAL_PROMPTS = ("Why is the sky blue?", "Write a haiku about speculative decoding.")


@dataclass(frozen=True, kw_only=True)
class FineTune:
    """One fine-tune: which loaded drafter it starts from, the recipe, and the texts it learns."""

    objective: str  # pretrain | distill | sd2 (TrainConfig.objective)
    base: str  # a drafter the engine has loaded; its copy is trained, the loaded one is left alone
    out_dir: Path
    steps: int
    batch_size: int
    lr: float
    k: int
    seq_len: int
    seed: int
    precision: str = "auto"  # auto | fp32 | bf16 (TrainConfig.precision)
    loss: str = "kl"  # kl | tvd | mixed (TrainConfig.loss)
    texts: tuple[str, ...] | None = None  # None: BUILTIN_TEXTS
    card: dict = field(default_factory=dict)  # added to the checkpoint's card


def fine_tune_trainer(
    engine: Engine,
    job: FineTune,
    scratch: Path,
    *,
    callbacks: Sequence[TrainCallback] = (),
    model_lock: AbstractContextManager | None = None,
) -> Trainer:
    """The job's Trainer, its data written under `scratch` (which must outlive the run). The base is
    copied while holding `model_lock` (so no decode uses it mid-copy); the Trainer takes the lock one
    optimiser step at a time. Raises ValueError (UnknownDrafterError included) before any training."""
    with model_lock or nullcontext():
        base = engine.drafter(job.base)
        limit = context_length(base.model)
        if job.seq_len > limit:
            raise ValueError(f"seq_len {job.seq_len} exceeds {job.base!r}'s context of {limit}")
        drafter = make_stock(copy.deepcopy(base.model))  # trained on stock kernels (sd2.invariant)
        head = copy.deepcopy(base.head) if job.objective == "sd2" and base.head is not None else None
    data = text_data(engine.tokenizer, job.texts, job.seq_len, scratch)
    config = TrainConfig(
        objective=job.objective,
        out_dir=str(job.out_dir),
        steps=job.steps,
        batch_size=min(job.batch_size, len(data.train)),
        lr=job.lr,
        warmup_steps=min(10, job.steps // 5),
        k=job.k,
        eval_every=0,
        save_every=0,
        eval_prompts=len(data.eval_prompts),
        seed=job.seed,
        eval_max_new_tokens=32,
        precision=job.precision,
        loss=job.loss,
    )
    return build_trainer(  # fp32 copies in training mode; a new head where the base has none
        config,
        engine.verifier,
        data,
        StartingPoint(drafter, head, job.card, drafter_vocab(base.path)),
        engine.tokenizer,
        callbacks=callbacks,
        model_lock=model_lock,
    )


def text_data(tokenizer, texts: Sequence[str] | None, seq_len: int, scratch: Path) -> TrainData:
    """Texts as training rows (loss on every token, each cut to `seq_len`) and two chat prompts to
    measure τ; None trains on BUILTIN_TEXTS."""
    chosen = texts or BUILTIN_TEXTS
    examples = [
        Example(f"text-{i}", (), tuple(tokenizer(text, add_special_tokens=False)["input_ids"][:seq_len]))
        for i, text in enumerate(chosen)
    ]
    config = ShardConfig(seq_len=seq_len, min_response_tokens=2)
    build_shards(
        examples, scratch / "shards", tokenizer, config, {"kind": "request-texts", "count": len(chosen)}
    )
    shards = ShardSet(scratch / "shards")
    if len(shards) == 0:
        raise ValueError("data: every text is shorter than 2 tokens; nothing to train on")
    prompts = [encode_prompt(tokenizer, prompt=p) for p in EVAL_PROMPTS]
    description = {"sources": [f"{len(chosen)} request texts" if texts else "built-in sentences"]}
    return TrainData(shards, None, prompts, description)
