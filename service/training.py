"""The service's `train_fn`: the three `sd2 train` recipes (pretrain, distill, sd2) on request texts.

A job fine-tunes a copy of a loaded drafter (`sd2.train.fine_tune`, whose Trainer `build_trainer` builds
as `sd2 train` builds its own), holding the server's model lock one optimiser step at a time (so
/generate interleaves with a long job, and steering hooks on the shared verifier never overlap a
decode). Texts come from the request, or a few built-in sentences; larger runs belong to the
`sd2 train` command, whose checkpoints the server loads too.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from sd2.train.fine_tune import fine_tune_trainer
from sd2.train.trainer import TrainCallback
from service.generation import ModelHost
from service.jobs import OnMetric, TrainSpec


class RecipeTrainer:
    """train_fn implementing pretrain / distill / sd2 with `sd2.train`."""

    methods = ("pretrain", "distill", "sd2")

    def __init__(self, host: ModelHost):
        self.host = host

    def __call__(self, spec: TrainSpec, on_metric: OnMetric, should_stop: Callable[[], bool]) -> Path | None:
        with tempfile.TemporaryDirectory(prefix="sd2-job-") as scratch:
            callbacks = [_MetricBuffer(on_metric, should_stop)]
            trainer = fine_tune_trainer(
                self.host.engine, spec.job, Path(scratch), callbacks=callbacks, model_lock=self.host.lock
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
