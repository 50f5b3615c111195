"""The service's `train_fn`: the three `sd2 train` recipes (pretrain, distill, sd2) on request texts.

A job fine-tunes a copy of a loaded drafter with `sd2.train.Trainer`, built by `build_trainer` as
`sd2 train` builds its own, holding the server's model lock one optimiser step at a time (so
/generate interleaves with a long job, and steering hooks on the shared verifier never overlap a
decode). Texts come from the request, or a few built-in sentences; larger runs belong to the
`sd2 train` command, whose checkpoints the server loads too.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from sd2.data.batches import ShardSet
from sd2.data.examples import Example
from sd2.data.shards import ShardConfig, build_shards
from sd2.models import context_length
from sd2.prompts import encode_prompt
from sd2.train.build import StartingPoint, build_trainer
from sd2.train.config import TrainConfig
from sd2.train.trainer import TrainCallback, TrainData
from service.generation import ModelHost
from service.jobs import OnMetric, TrainSpec

BUILTIN_TEXTS = (
    "The sky is blue because air scatters short wavelengths of sunlight more than long ones.",
    "Speculative decoding lets a small drafter propose tokens that a large verifier checks in one pass.",
    "A good explanation starts with the main idea, then gives one example, then a short summary.",
    "def mean(values):\n    return sum(values) / len(values)\n",
)
EVAL_PROMPTS = ("Why is the sky blue?", "Write a haiku about speculative decoding.")


class RecipeTrainer:
    """train_fn implementing pretrain / distill / sd2 with `sd2.train`."""

    methods = ("pretrain", "distill", "sd2")

    def __init__(self, host: ModelHost):
        self.host = host

    def __call__(self, spec: TrainSpec, on_metric: OnMetric, should_stop: Callable[[], bool]) -> Path | None:
        engine = self.host.engine
        with self.host.lock:  # copy the base while no decode uses it
            base = engine.drafters.get(spec.base_drafter)
            if base is None:
                raise ValueError(f"base drafter {spec.base_drafter!r} is not loaded")
            limit = context_length(base.model)
            if spec.seq_len > limit:
                raise ValueError(f"seq_len {spec.seq_len} exceeds {spec.base_drafter!r}'s context of {limit}")
            drafter = copy.deepcopy(base.model)
            head = copy.deepcopy(base.head) if spec.method == "sd2" and base.head is not None else None
        with tempfile.TemporaryDirectory(prefix="sd2-job-") as scratch:
            data = _request_data(engine.tokenizer, spec, Path(scratch))
            config = TrainConfig(
                objective=spec.method,
                out_dir=str(spec.output_dir),
                steps=spec.steps,
                batch_size=min(spec.batch_size, len(data.train)),
                lr=spec.lr,
                warmup_steps=min(10, spec.steps // 5),
                k=spec.k,
                eval_every=0,
                save_every=0,
                eval_prompts=len(data.eval_prompts),
                seed=spec.seed,
                eval_max_new_tokens=32,
                precision=spec.precision,
            )
            card = {"base": spec.base_drafter, "trainer": "service job (sd2.train)", "job_id": spec.job_id}
            trainer = build_trainer(  # fp32 copies in training mode; a new head where the base has none
                config,
                engine.verifier,
                data,
                StartingPoint(drafter, head, card),
                engine.tokenizer,
                callbacks=[_MetricBuffer(on_metric, should_stop)],
                model_lock=self.host.lock,
            )
            out = trainer.run()
        if should_stop():
            shutil.rmtree(out, ignore_errors=True)  # a cancelled job leaves no drafter behind
            return None
        return out


class _MetricBuffer(TrainCallback):
    """Collects one step's metrics and hands them to the job runner as one group."""

    def __init__(self, on_metric: OnMetric, should_stop: Callable[[], bool]):
        self.forward, self.stop = on_metric, should_stop

    def on_metric(self, step: int, name: str, value: float) -> None:
        self.forward(step, {name: value})

    def should_stop(self) -> bool:
        return self.stop()


def _request_data(tokenizer, spec: TrainSpec, scratch: Path) -> TrainData:
    """The request's texts as training rows (loss on every token) and two chat prompts to measure τ."""
    texts = spec.data or BUILTIN_TEXTS
    examples = [
        Example(
            f"text-{i}", (), tuple(tokenizer(text, add_special_tokens=False)["input_ids"][: spec.seq_len])
        )
        for i, text in enumerate(texts)
    ]
    config = ShardConfig(seq_len=spec.seq_len, min_response_tokens=2)
    build_shards(
        examples, scratch / "shards", tokenizer, config, {"kind": "request-texts", "count": len(texts)}
    )
    shards = ShardSet(scratch / "shards")
    if len(shards) == 0:
        raise ValueError("data: every text is shorter than 2 tokens; nothing to train on")
    prompts = [encode_prompt(tokenizer, prompt=p) for p in EVAL_PROMPTS]
    description = {"sources": [f"{len(texts)} request texts" if spec.data else "built-in sentences"]}
    return TrainData(shards, None, prompts, description)
