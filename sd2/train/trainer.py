"""The training loop shared by the three recipes, on accelerate (CPU, one GPU, or `accelerate launch`)."""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from tqdm.auto import tqdm

from sd2.data.batches import Batch, ShardSet, batches, rank_batches
from sd2.devices import cpu_has_native_bf16
from sd2.draft_vocab import DraftVocab
from sd2.steering import SteeringHead
from sd2.train.checkpoint import load_trainer_state, save_checkpoint, verify_checkpoint
from sd2.train.config import TrainConfig
from sd2.train.objectives import StepOutput, VerifierTargets, distill_step, pretrain_step, verifier_targets
from sd2.train.schedule import warmup_cosine
from sd2.train.validation import measure_tau

log = logging.getLogger(__name__)


class TrainCallback:
    """Hooks for observers (the service records metric points through these). All optional."""

    def on_metric(self, step: int, name: str, value: float) -> None: ...

    def should_stop(self) -> bool:
        return False


@dataclass
class TrainData:
    """Where the examples come from; `description` goes into the checkpoint card."""

    train: ShardSet
    validation: ShardSet | None = None
    eval_prompts: list[list[int]] = field(default_factory=list)  # held-out prompt ids for τ
    description: dict = field(default_factory=dict)


class _Recipe(nn.Module):
    """Drafter (+ head) as one module for accelerate; the frozen verifier is held outside its parameters."""

    def __init__(self, config: TrainConfig, drafter: nn.Module, head: SteeringHead | None, verifier):
        super().__init__()
        self.config, self.drafter, self.head = config, drafter, head
        self._verifier = [verifier]  # a list keeps it out of .parameters() and state_dict()
        self.targets: VerifierTargets = verifier_targets  # lockstep runs swap in a shared one

    @property
    def verifier(self) -> nn.Module | None:
        return self._verifier[0]

    def forward(self, batch: Batch, generator: torch.Generator | None) -> StepOutput:
        if self.config.objective == "pretrain":
            return pretrain_step(self.drafter, batch)
        config = self.config
        return distill_step(
            self.drafter, self.verifier, batch, self.head, config.k, generator, self.targets, config.loss
        )

    def trainable(self) -> list[nn.Parameter]:
        params = [p for p in self.drafter.parameters() if p.requires_grad]  # freeze_*: set by the Trainer
        return params + (list(self.head.parameters()) if self.head is not None else [])


class _RunRng:
    """This run's own state of the global RNGs, in place only while the run computes (`active`).

    Randomness the trainer asks for takes an explicit generator (`Trainer.generator`: batch order, δ
    offsets). Modules draw from the process's global RNG instead and take no generator (dropout, which
    a drafter's config may enable): inside `active` they draw from this run's seeded state, and the
    process's own states (the CPU one and, on a GPU, that device's) are back in place when it ends. The
    trainer computes while holding its model lock, so no decode of a serving process runs meanwhile.
    """

    def __init__(self, seed: int, device: torch.device):
        self.cpu_state = torch.Generator().manual_seed(seed).get_state()  # = what torch.manual_seed sets
        self.device = device if device.type == "cuda" else None
        self.device_state = (
            torch.Generator(device=device).manual_seed(seed).get_state() if self.device is not None else None
        )

    @contextmanager
    def active(self) -> Iterator[None]:
        devices = [self.device] if self.device is not None else []
        with torch.random.fork_rng(devices=devices, device_type="cuda"):  # restores the process's states
            torch.set_rng_state(self.cpu_state)
            if self.device is not None:
                torch.cuda.set_rng_state(self.device_state, self.device)
            try:
                yield
            finally:
                self.cpu_state = torch.get_rng_state()
                if self.device is not None:
                    self.device_state = torch.cuda.get_rng_state(self.device)


class Trainer:
    """Runs one TrainConfig to completion (or cancellation), checkpointing and resuming from out_dir.

    It leaves process-wide state alone (a serving process runs it beside its decodes): CPU threads are
    the caller's to set (`sd2 train` applies `TrainConfig.threads`, the Trainer does not), and the seed
    drives this run's own generators (`generator`, `rng`), never the process's global RNG state.
    Build one with `sd2.train.build.build_trainer`.
    """

    def __init__(
        self,
        config: TrainConfig,
        drafter: nn.Module,
        verifier: nn.Module | None,
        data: TrainData,
        head: SteeringHead | None = None,
        tokenizer=None,
        stop_ids: frozenset[int] = frozenset(),
        callbacks: Sequence[TrainCallback] = (),
        card: dict | None = None,
        model_lock: AbstractContextManager | None = None,
        draft_vocab: DraftVocab | None = None,
    ):
        if config.objective != "pretrain" and verifier is None:
            raise ValueError(f"objective {config.objective} needs the verifier")
        if config.objective == "sd2" and head is None:
            raise ValueError("objective sd2 needs a steering head")
        per_epoch = len(data.train) // config.batch_size
        if config.skip_batches and config.skip_batches >= per_epoch:
            raise ValueError(
                f"skip_batches {config.skip_batches} is not below the {per_epoch} batches of one epoch "
                f"({len(data.train)} rows, batch_size {config.batch_size})"
            )
        self.config, self.data, self.tokenizer, self.stop_ids = config, data, tokenizer, stop_ids
        self.callbacks, self.card = list(callbacks), dict(card or {})
        self.draft_vocab = draft_vocab  # shipped with every checkpoint, unchanged
        # held around every use of the (possibly shared) verifier, e.g. a server's decoding lock
        self.model_lock = model_lock or nullcontext()
        # autocast is ours, not accelerate's mixed_precision: that one is a process-wide singleton, and
        # the service runs jobs of different precisions in one process
        # Train where the verifier lives: a service's CPU engine keeps its verifier on the CPU even on a
        # GPU host (moving the shared model would leave its decodes mixing devices).
        verifier_device = verifier.get_input_embeddings().weight.device if verifier is not None else None
        on_cpu = not torch.cuda.is_available() or (
            verifier_device is not None and verifier_device.type == "cpu"
        )
        self.accelerator = Accelerator(cpu=on_cpu, mixed_precision="no")
        self.bf16 = autocast_precision(config.precision) == "bf16"
        self.recipe = _Recipe(config, drafter, head if config.objective == "sd2" else None, verifier)
        if verifier is not None:
            verifier.requires_grad_(False).eval()
            if not _same_device(verifier_device, self.accelerator.device):  # a rank's own copy (run.py)
                verifier.to(self.accelerator.device)
        if config.freeze_drafter:
            drafter.requires_grad_(False)
        if config.freeze_embeddings:
            for embeddings in (drafter.get_input_embeddings(), drafter.get_output_embeddings()):
                embeddings.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.recipe.trainable(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.scheduler = warmup_cosine(self.optimizer, config.warmup_steps, config.steps, config.min_lr_ratio)
        self.recipe, self.optimizer, self.scheduler = self.accelerator.prepare(
            self.recipe, self.optimizer, self.scheduler
        )
        self.generator = torch.Generator(device=self.accelerator.device).manual_seed(config.seed)
        self.rng = _RunRng(config.seed, self.accelerator.device)
        self.step, self.epoch, self.tokens_seen, self.wall_s = 0, 0, 0, 0.0
        self.batch_index = config.skip_batches  # a resumed run overwrites it with its saved position
        self.history: list[dict] = []

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> Path:
        """Train until `steps` (resuming if out_dir holds a checkpoint of this run); returns out_dir."""
        self.start()
        while self.advance():
            pass
        return self.finish()

    # `run` in three parts, so several trainers can take turns step by step (`lockstep.run_in_lockstep`)

    def start(self) -> None:
        """Resume from out_dir if it holds this run, open the progress bar and the batch stream."""
        self._resume()
        name = Path(self.config.out_dir).name
        self._progress = tqdm(
            total=self.config.steps, initial=self.step, desc=f"{self.config.objective} {name}", unit="step"
        )
        self._data = self._batches()
        self._cancelled = False

    def advance(self) -> bool:
        """One optimiser step (+ the validation and checkpoint due after it); False once done."""
        cfg = self.config
        if self.step >= cfg.steps or self._cancelled:
            return False
        start = time.perf_counter()
        with self.model_lock:
            metrics = self._optimizer_step(self._data)
        self.wall_s += time.perf_counter() - start
        self.step += 1
        self._progress.update(1)
        self._progress.set_postfix(loss=f"{metrics['loss']:.3f}")
        self._emit(metrics | {"lr": self.scheduler.get_last_lr()[0], "tokens_seen": self.tokens_seen})
        self._cancelled = any(cb.should_stop() for cb in self.callbacks)
        if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
            with self.model_lock:
                self._emit(self.validate())
        if cfg.save_every and self.step % cfg.save_every == 0 and self.step < cfg.steps:
            self.save()
        return self.step < cfg.steps and not self._cancelled

    def finish(self) -> Path:
        """Final validation and checkpoint; returns out_dir."""
        self._progress.close()
        with self.model_lock:
            final = self.validate()
        self._emit(final)
        return self.save(final_metrics=final, cancelled=self._cancelled)

    def _optimizer_step(self, data: Iterator[Batch]) -> dict[str, float]:
        with self.rng.active():
            return self._accumulate(data)

    def _accumulate(self, data: Iterator[Batch]) -> dict[str, float]:
        totals: dict[str, float] = {}
        for _ in range(self.config.grad_accum):
            batch = _to_device(next(data), self.accelerator.device)
            with torch.autocast(self.accelerator.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                out = self.recipe(batch, self.generator)
            self.accelerator.backward(out.loss / self.config.grad_accum)
            self.tokens_seen += int(out.metrics["tokens"])
            for name, value in out.metrics.items():
                totals[name] = totals.get(name, 0.0) + value / self.config.grad_accum
        self.accelerator.clip_grad_norm_(self.unwrapped().trainable(), self.config.clip_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return totals

    def _batches(self) -> Iterator[Batch]:
        """Endless seeded epochs from the saved position, so a resumed run sees the same batches.

        Under `accelerate launch` with N processes each rank trains on its own batch of every round of
        N (`rank_batches`): one step sees N different batches, an effective batch of N · batch_size.
        """
        rank, ranks = self.accelerator.process_index, self.accelerator.num_processes
        while True:
            for resume_at, batch in rank_batches(
                self.data.train,
                self.config.batch_size,
                self.config.seed,
                self.epoch,
                start=self.batch_index,
                rank=rank,
                ranks=ranks,
                trim=True,
            ):
                self.batch_index = resume_at
                yield batch
            if self.batch_index == 0:
                raise ValueError(
                    f"the training data has fewer rows ({len(self.data.train)}) than batch_size "
                    f"{self.config.batch_size} × {ranks} process(es)"
                )
            self.epoch, self.batch_index = self.epoch + 1, 0

    def _emit(self, metrics: dict[str, float]) -> None:
        self.history.append({"step": self.step, **metrics})
        for callback in self.callbacks:
            for name, value in metrics.items():
                if value is not None:
                    callback.on_metric(self.step, name, float(value))

    # --- validation --------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Held-out loss (and agreement) plus τ measured by decoding held-out prompts with the engine."""
        with self.rng.active():
            return self._validate()

    def _validate(self) -> dict[str, float]:
        recipe = self.unwrapped()
        recipe.eval()
        results: dict[str, float] = {}
        if self.data.validation is not None and len(self.data.validation) >= self.config.batch_size:
            sums: dict[str, float] = {}
            val = batches(self.data.validation, self.config.batch_size, seed=12345, trim=True)
            for count, batch in enumerate(val, start=1):
                out = recipe(
                    _to_device(batch, self.accelerator.device),
                    torch.Generator(device=self.accelerator.device).manual_seed(count),
                )
                for name, value in out.metrics.items():
                    sums[name] = sums.get(name, 0.0) + value
                if count == self.config.eval_batches:
                    break
            results = {f"val_{n}": v / count for n, v in sums.items() if n != "tokens"}
        if recipe.verifier is not None and self.data.eval_prompts:
            tau = measure_tau(
                recipe.verifier,
                recipe.drafter,
                recipe.head,
                self.data.eval_prompts,
                self.config.k,
                self.config.eval_max_new_tokens,
                self.stop_ids,
            )
            results["val_tau"] = tau
        recipe.train()
        shown = {name: round(value, 4) for name, value in results.items() if value is not None}
        log.info("step %d validation: %s", self.step, shown)
        return results

    # --- checkpoints -------------------------------------------------------------------------

    def save(self, final_metrics: dict | None = None, cancelled: bool = False) -> Path:
        recipe = self.unwrapped()
        state = {
            "step": self.step,
            "epoch": self.epoch,
            "batch_index": self.batch_index,
            "tokens_seen": self.tokens_seen,
            "wall_s": self.wall_s,
            "history": self.history,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": self.rng.cpu_state,
            "config": self.config.to_dict(),
        }
        card = {
            **self.card,
            "recipe": self.config.to_dict(),
            "data": self.data.description,
            "steps": self.step,
            "tokens_seen": self.tokens_seen,
            "wall_time_s": round(self.wall_s, 1),
            "machine": _machine(),
            "final_metrics": final_metrics,
            "cancelled": cancelled,
            "steering": recipe.head is not None,
        }
        if self.accelerator.is_main_process:
            save_checkpoint(
                self.config.out_dir,
                recipe.drafter,
                recipe.head,
                card,
                state,
                self.tokenizer,
                draft_vocab=self.draft_vocab,
            )
        return Path(self.config.out_dir)

    def _resume(self) -> None:
        """Continue a run from its own checkpoint (same config), bit-identically on CPU."""
        out = Path(self.config.out_dir)
        if not out.exists():
            return
        verify_checkpoint(out)
        state = load_trainer_state(out)
        if state is None or _identity(state["config"]) != _identity(self.config.to_dict()):
            raise ValueError(f"{out} holds a checkpoint of a different run; choose another out_dir")
        from sd2.train.resume import load_weights

        load_weights(self.unwrapped(), out)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        self.rng.cpu_state = state["torch_rng"]
        self.step, self.epoch, self.batch_index = state["step"], state["epoch"], state["batch_index"]
        self.tokens_seen, self.wall_s, self.history = state["tokens_seen"], state["wall_s"], state["history"]
        log.info("resumed %s at step %d", out, self.step)

    def unwrapped(self) -> _Recipe:
        return self.accelerator.unwrap_model(self.recipe)


def _identity(config: dict) -> dict:
    """The settings that define a run; CPU threads may change between a run and its resumption.
    Checkpoints written before `precision` and `skip_batches` existed ran at "auto" and skipped none."""
    defaults = {"precision": "auto", "skip_batches": 0}
    return defaults | {name: value for name, value in config.items() if name != "threads"}


def _to_device(batch: Batch, device: torch.device) -> Batch:
    return Batch(
        batch.input_ids.to(device), batch.attention_mask.to(device), batch.loss_mask.to(device), batch.ids
    )


def autocast_precision(precision: str) -> str:
    """What a TrainConfig.precision means on this machine: "bf16" or "no" (fp32 forwards)."""
    if precision == "auto":
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    if precision == "bf16" and not torch.cuda.is_available() and not cpu_has_native_bf16():
        log.warning(
            "this CPU has neither AVX-512 BF16 nor AMX: bf16 autocast emulates bf16 and runs many times "
            "slower than fp32 (--precision fp32 or auto)"
        )
    return "no" if precision == "fp32" else "bf16"


def _machine() -> str:
    device = (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else f"CPU × {torch.get_num_threads()} threads"
    )
    return f"{platform.node() or 'host'} · {device} · torch {torch.__version__}"


def _same_device(a: torch.device, b: torch.device) -> bool:
    """cuda and cuda:0 are the same device; torch.device equality says they are not."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)
