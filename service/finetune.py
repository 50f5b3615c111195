"""The service's default `train_fn`: plain next-token fine-tuning of a loaded drafter.

A stand-in until `sd2 train` (issue 3) lands and replaces it: it implements only the `pretrain`
recipe (continued pretraining with next-token cross-entropy on the request's texts, or a few
built-in sentences), with torch directly — no distillation, no steering head. It is honest about
that: the job router refuses `distill` and `sd2` while this is the train_fn.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from sd2.models import CARD_FILE, context_length
from service.generation import ModelHost
from service.jobs import OnMetric, TrainSpec

log = logging.getLogger(__name__)

BUILTIN_TEXTS = (
    "The sky is blue because air scatters short wavelengths of sunlight more than long ones.",
    "Speculative decoding lets a small drafter propose tokens that a large verifier checks in one pass.",
    "A good explanation starts with the main idea, then gives one example, then a short summary.",
    "def mean(values):\n    return sum(values) / len(values)\n",
)


class NextTokenFineTuner:
    """train_fn for the `pretrain` recipe; see the module docstring for what it is not."""

    methods = ("pretrain",)

    def __init__(self, host: ModelHost):
        self.host = host

    def __call__(self, spec: TrainSpec, on_metric: OnMetric, should_stop: Callable[[], bool]) -> Path | None:
        if spec.method not in self.methods:
            raise ValueError(
                f"method {spec.method!r} needs `sd2 train` (issue 3); this server trains {self.methods}"
            )
        with self.host.lock:  # copy and tokenise while no decode uses the models
            base = self.host.engine.drafters.get(spec.base_drafter)
            if base is None:
                raise ValueError(f"base drafter {spec.base_drafter!r} is not loaded")
            limit = context_length(base.model)
            if spec.seq_len > limit:
                raise ValueError(f"seq_len {spec.seq_len} exceeds {spec.base_drafter!r}'s context of {limit}")
            model = copy.deepcopy(base.model).float().train()
            stream = _token_stream(self.host.engine.tokenizer, spec.data or BUILTIN_TEXTS)
        generator = torch.Generator().manual_seed(spec.seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)
        device = next(model.parameters()).device
        loss_value = float("nan")
        for step in range(1, spec.steps + 1):
            if should_stop():
                return None
            batch = _windows(stream, spec.seq_len, spec.batch_size, generator).to(device)  # [B, T]
            with self.host.lock:  # one step at a time, so /generate interleaves with a long job
                loss = model(input_ids=batch, labels=batch, use_cache=False).loss  # HF shifts labels by one
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            loss_value = loss.item()
            on_metric(step, {"loss": loss_value, "lr": spec.lr})
        card = {
            "recipe": "pretrain",
            "base": spec.base_drafter,
            "steps": spec.steps,
            "lr": spec.lr,
            "seq_len": spec.seq_len,
            "batch_size": spec.batch_size,
            "seed": spec.seed,
            "data": f"{len(spec.data)} request texts" if spec.data else "built-in sentences",
            "final_loss": loss_value,
            "trainer": "service.finetune.NextTokenFineTuner (stand-in until `sd2 train`, issue 3)",
        }
        save_atomically(model.eval(), self.host.engine.tokenizer, card, spec.output_dir)
        return spec.output_dir


def _token_stream(tokenizer, texts) -> torch.Tensor:
    """All texts tokenised and joined with EOS. Returns ids [N]."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids.extend([eos] if eos is not None else [])
    return torch.tensor(ids, dtype=torch.long)


def _windows(stream: torch.Tensor, seq_len: int, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """batch_size random windows of seq_len tokens (the stream repeats when it is shorter). → [B, T]"""
    repeats = seq_len // max(len(stream), 1) + 2
    looped = stream.repeat(repeats)  # [N·repeats] ≥ seq_len + N
    starts = torch.randint(0, len(looped) - seq_len + 1, (batch_size,), generator=generator)
    return torch.stack([looped[s : s + seq_len] for s in starts.tolist()])


def save_atomically(model, tokenizer, card: dict, target: Path) -> None:
    """Write the drafter folder into a temporary sibling, then rename it into place (never half-written)."""
    if target.exists():
        raise FileExistsError(f"a drafter folder named {target.name!r} already exists")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / CARD_FILE).write_text(json.dumps(card, indent=2, sort_keys=True))
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
