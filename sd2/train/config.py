"""Training settings: one frozen dataclass, validated at the edge."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sd2.choices import LOSSES

OBJECTIVES = ("pretrain", "distill", "sd2")
PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run. Defaults follow the paper's recipe scaled to a small CPU-trainable drafter."""

    objective: str  # pretrain | distill | sd2
    out_dir: str  # the checkpoint folder this run writes (and resumes from)
    steps: int = 1000  # optimiser steps
    batch_size: int = 8  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimiser step
    lr: float = 3e-4  # peak learning rate (small drafters tolerate more than the paper's 1e-5 on 8B pairs)
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr (paper: 1e-6 / 1e-5)
    warmup_steps: int = 50  # linear warmup, then cosine — never both at once (the official bug)
    weight_decay: float = 0.01  # AdamW's torch default, as in the paper
    clip_norm: float = 0.5  # gradient clipping, as in the paper
    k: int = 8  # offsets δ are drawn from 1..k, matching the draft length used at inference
    freeze_drafter: bool = False  # sd2 ablation: train only the steering head
    # the drafter's token embeddings and LM head stay as they start (a cut drafter's are the verifier's,
    # so its export can take them from the verifier instead of storing a copy)
    freeze_embeddings: bool = False
    loss: str = "kl"  # distill / sd2: forward KL, TV distance (1 − acceptance) or their mean (sd2.losses)
    eval_every: int = 200  # steps between validations (0 = only at the end)
    save_every: int = 200  # steps between checkpoints (0 = only at the end)
    eval_batches: int = 4  # validation batches for KL / agreement
    eval_prompts: int = 4  # held-out prompts decoded by the engine to measure τ
    eval_max_new_tokens: int = 48
    seed: int = 0  # seeds data order, δ draws and init
    # batches of the first epoch's order skipped at the start: a run continuing another run's data order
    # (same seed) with `skip_batches` = that run's steps × grad_accum sees only rows the other did not
    skip_batches: int = 0
    threads: int = 0  # torch CPU threads (0 = torch's default)
    # forwards under autocast: bf16 (fp32 master weights, fp32 losses) or fp32; auto = bf16 on a CUDA
    # GPU that supports it, fp32 on CPU (bf16 on CPUs with AVX-512 BF16 / AMX: distill/sd2 steps ≈ 2× faster)
    precision: str = "auto"

    def __post_init__(self) -> None:
        checks = [
            (self.objective in OBJECTIVES, "objective", f"must be one of {OBJECTIVES}", self.objective),
            (self.steps >= 1, "steps", "must be ≥ 1", self.steps),
            (self.batch_size >= 1, "batch_size", "must be ≥ 1", self.batch_size),
            (self.grad_accum >= 1, "grad_accum", "must be ≥ 1", self.grad_accum),
            (self.lr > 0, "lr", "must be > 0", self.lr),
            (0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]", self.min_lr_ratio),
            (self.warmup_steps >= 0, "warmup_steps", "must be ≥ 0", self.warmup_steps),
            (self.skip_batches >= 0, "skip_batches", "must be ≥ 0", self.skip_batches),
            (1 <= self.k <= 64, "k", "must be in 1..64", self.k),
            (self.precision in PRECISIONS, "precision", f"must be one of {PRECISIONS}", self.precision),
            (self.loss in LOSSES, "loss", f"must be one of {LOSSES}", self.loss),
            (self.loss == "kl" or self.objective != "pretrain", "loss", "is for distill and sd2", self.loss),
            (
                not self.freeze_drafter or self.objective == "sd2",
                "freeze_drafter",
                "only applies to sd2",
                True,
            ),
            (
                not self.freeze_embeddings or self.objective != "pretrain",
                "freeze_embeddings",
                "is for distill and sd2",
                True,
            ),
        ]
        for ok, field, rule, value in checks:
            if not ok:
                raise ValueError(f"{field} {rule}, got {value!r}")

    def to_dict(self) -> dict:
        return asdict(self)
