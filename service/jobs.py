"""Training jobs: a queue, one worker thread, statuses in the DB, and an injectable `train_fn`.

    train_fn(spec, on_metric, should_stop) -> checkpoint folder, or None when it stopped early

`on_metric(step, {"loss": 2.31, ...})` stores metric points and the progress fraction step/steps;
`should_stop()` turns True when the job is cancelled or the server shuts down. A train_fn takes
`ModelHost.lock` around each use of the shared models, so decoding and training interleave instead
of corrupting each other. When it returns a folder, the runner loads it as a drafter, adds it to
the Engine and the registry, and it appears in GET /drafters.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sd2.train.fine_tune import FineTune
from service import repository
from service.db import Database
from service.errors import public_error
from service.generation import ModelHost

log = logging.getLogger(__name__)
LEASES_PER_RENEWAL = 3  # a replica renews its jobs' leases (and fails abandoned ones) 3× per lease


def replica_id() -> str:
    """This process's name in the store: host, pid and a random part (pids repeat across restarts)."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """A queued job: its id, the drafter name it registers, and what it trains. `job.out_dir` is
    SD2_HOME/drafters/<name>, built from a validated name, never from a path in a request."""

    job_id: int
    name: str
    job: FineTune


OnMetric = Callable[[int, Mapping[str, float]], None]
TrainFn = Callable[[TrainSpec, OnMetric, Callable[[], bool]], Path | None]


class JobRunner:
    """Runs queued jobs one at a time in a worker thread; cancellation is cooperative.

    Jobs live in a store replicas may share, each claimed by the replica that queued it (its queue is
    in that process's memory). A second thread renews this replica's claims every `renew_s` and fails
    the jobs whose claim lapsed `lease_s` after their replica died, so a replica starting beside live
    ones never fails their jobs, and a crashed one's jobs do not stay "running" forever.
    """

    def __init__(
        self,
        db: Database,
        host: ModelHost,
        train_fn: TrainFn,
        drafters_dir: Path,
        lease_s: float = 30.0,
        renew_s: float | None = None,
    ):
        """`lease_s`: how long after its replica died a job is failed (Settings.job_lease_s); `renew_s`:
        how often leases are renewed (default lease_s / 3)."""
        renew_s = lease_s / LEASES_PER_RENEWAL if renew_s is None else renew_s
        if not 0 < renew_s < lease_s:
            raise ValueError(f"renew_s ({renew_s}) must lie in (0, lease_s = {lease_s})")
        self.db, self.host, self.train_fn, self.drafters_dir = db, host, train_fn, drafters_dir
        self.replica, self.lease_s, self.renew_s = replica_id(), lease_s, renew_s
        self._queue: queue.Queue[TrainSpec | None] = queue.Queue()
        self._cancelled: set[int] = set()
        self._unrecorded: dict[int, str] = {}  # job id → error, for failures the store refused to record
        self._shutdown = threading.Event()
        self._thread = threading.Thread(target=self._work, name="sd2-train-worker", daemon=True)
        self._leases = threading.Thread(target=self._keep_leases, name="sd2-train-leases", daemon=True)

    def start(self) -> None:
        """Fail the jobs no live replica holds (left by a replica that died), then start serving."""
        abandoned = repository.fail_abandoned_jobs(self.db)
        if abandoned:
            log.warning("marked %d training job(s) of a stopped server as failed", abandoned)
        self._thread.start()
        self._leases.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the running job to stop, wait for the worker, and fail this replica's jobs still queued
        (no other replica can run them: the queue is this process's)."""
        self._shutdown.set()
        self._queue.put(None)
        self._thread.join(timeout)
        self._leases.join(timeout)
        try:
            repository.fail_abandoned_jobs(self.db, replica=self.replica)
        except Exception:  # the store is down: the leases lapse and another replica fails them
            log.warning("could not mark this server's queued training jobs as failed")

    def submit(self, name: str, method: str, base_drafter: str, spec: Mapping) -> int:
        """Store the job (`spec`: TrainIn's other fields, as the job's row keeps them) and queue it."""
        job_id = repository.create_job(self.db, name, method, base_drafter, spec, self.replica, self.lease_s)
        job = FineTune(
            objective=method,
            base=base_drafter,
            out_dir=self.drafters_dir / name,
            steps=spec["steps"],
            batch_size=spec["batch_size"],
            lr=spec["lr"],
            k=spec["k"],
            seq_len=spec["seq_len"],
            seed=spec["seed"],
            precision=spec.get("precision", "auto"),
            loss=spec.get("loss", "kl"),  # jobs stored before the field train with KL
            texts=tuple(spec["data"]) if spec.get("data") else None,
            card={"base": base_drafter, "trainer": "service job (sd2.train)", "job_id": job_id},
        )
        self._queue.put(TrainSpec(job_id=job_id, name=name, job=job))
        return job_id

    def cancel(self, job_id: int) -> None:
        """A queued job is cancelled at once; a running one at its next step."""
        self._cancelled.add(job_id)
        repository.finish_job_if_queued(self.db, job_id)

    @property
    def alive(self) -> bool:
        """Whether the worker thread is running (GET /ready reports it)."""
        return self._thread.is_alive()

    def _work(self) -> None:
        while not self._shutdown.is_set():
            spec = self._queue.get()
            if spec is None:
                return
            self._record_unrecorded()
            try:
                if repository.start_job(self.db, spec.job_id):  # False: cancelled while queued
                    self._run(spec)
            except Exception as err:  # the store failed around the job: it fails, the worker lives on
                log.exception("training job %d: the store failed", spec.job_id)
                self._unrecorded[spec.job_id] = f"the store failed: {type(err).__name__}"
                self._record_unrecorded()

    def _keep_leases(self) -> None:
        while not self._shutdown.wait(self.renew_s):
            try:
                repository.renew_leases(self.db, self.replica, self.lease_s)
                abandoned = repository.fail_abandoned_jobs(self.db)
                if abandoned:
                    log.warning("marked %d training job(s) of a server that stopped as failed", abandoned)
            except Exception:  # the store is down; retried at the next renewal
                log.warning("could not renew this server's training-job leases", exc_info=True)

    def _record_unrecorded(self) -> None:
        """Mark failed the jobs whose failure the store could not take yet (retried before each job)."""
        for job_id, error in list(self._unrecorded.items()):
            try:
                repository.finish_job(self.db, job_id, "failed", error=error)
            except Exception:
                log.warning("training job %d: its failure is not recorded yet (the store is down)", job_id)
                return
            del self._unrecorded[job_id]

    def _run(self, spec: TrainSpec) -> None:
        def should_stop() -> bool:
            return self._shutdown.is_set() or spec.job_id in self._cancelled

        def on_metric(step: int, metrics: Mapping[str, float]) -> None:
            repository.add_metric_points(self.db, spec.job_id, step, metrics, min(step / spec.job.steps, 1.0))

        try:
            checkpoint = self.train_fn(spec, on_metric, should_stop)
            if checkpoint is None or should_stop():
                repository.finish_job(self.db, spec.job_id, "cancelled", error="cancelled before it finished")
                return
            self._register(spec, Path(checkpoint))
        except Exception as err:  # the job fails with its error; the worker keeps serving
            log.exception("training job %d failed", spec.job_id)
            repository.finish_job(self.db, spec.job_id, "failed", error=public_error(err))
            return
        repository.finish_job(self.db, spec.job_id, "succeeded", checkpoint=str(checkpoint))

    def _register(self, spec: TrainSpec, checkpoint: Path) -> None:
        with self.host.lock:
            drafter = self.host.engine.load_drafter(spec.name, checkpoint)
        repository.upsert_drafter(self.db, drafter_info(drafter, source="training", job_id=spec.job_id))


def drafter_info(drafter, source: str, job_id: int | None = None) -> repository.DrafterInfo:
    """Registry row of a loaded sd2.models.Drafter."""
    architectures = getattr(drafter.model.config, "architectures", None) or [drafter.model.config.model_type]
    recipe = drafter.card.get("recipe")
    if isinstance(recipe, dict):  # an sd2.train card stores its whole TrainConfig
        recipe = recipe.get("objective")
    return repository.DrafterInfo(
        name=drafter.name,
        source=source,
        path=drafter.path,
        architecture=str(architectures[0]),
        recipe=recipe,
        steering=drafter.head is not None,
        n_params=drafter.n_params,
        job_id=job_id,
    )
