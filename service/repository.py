"""Every write to the trace store. Each public function is one transaction (`Database.write`).

A run is written once, at its end, with all its blocks and token events in that same transaction:
a run that fails or is cancelled becomes one row with its status and error and no events, so the
store never holds a half-written trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import delete, insert, or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sd2.engine import GenerationResult
from sd2.trace import Block
from service.db import Database
from service.orm import (
    BenchmarkRow,
    BlockRow,
    Comparison,
    DrafterRow,
    MetricPoint,
    Run,
    TokenEventRow,
    TrainingJob,
    utcnow,
)
from service.trace_rows import block_params, event_params

TERMINAL_JOB_STATUSES = ("succeeded", "failed", "cancelled")


@dataclass
class RunRecord:
    """What to store about one generation: the request as received and its outcome (or error)."""

    method: str
    drafter: str | None  # the drafter name when the method is a loaded drafter
    steering: bool
    config: dict  # asdict(DecodeConfig)
    prompt: str | None
    messages: list[dict] | None
    prompt_set: str | None = None
    precision: str | None = None  # the engine's device and precision (Engine.precision)
    status: str = "succeeded"  # succeeded | failed | cancelled
    error: str | None = None
    result: GenerationResult | None = None  # only for succeeded runs


@dataclass
class DrafterInfo:
    name: str
    source: str  # config | training
    path: str
    architecture: str
    recipe: str | None
    steering: bool
    n_params: int
    job_id: int | None = None
    extra: dict = field(default_factory=dict)


def record_run(db: Database, record: RunRecord) -> int:
    """Store one run (and, if it succeeded, all its blocks and events) in one transaction; return its id."""
    with db.write() as session:
        return _insert_run(session, record)


def record_comparison(
    db: Database, methods: Sequence[str], records: Sequence[RunRecord]
) -> tuple[int, list[int]]:
    """Store a comparison and all its runs in one transaction."""
    with db.write() as session:
        comparison = Comparison(methods=list(methods))
        session.add(comparison)
        session.flush()
        return comparison.id, [_insert_run(session, r, comparison.id) for r in records]


def delete_run(db: Database, run_id: int) -> bool:
    """Delete a run; its blocks and events go with it (ON DELETE CASCADE). False if there was none."""
    with db.write() as session:
        session.execute(delete(TokenEventRow).where(TokenEventRow.run_id == run_id))
        session.execute(delete(BlockRow).where(BlockRow.run_id == run_id))
        return session.execute(delete(Run).where(Run.id == run_id)).rowcount > 0


def _insert_run(session: Session, record: RunRecord, comparison_id: int | None = None) -> int:
    result = record.result
    metrics = result.metrics if result is not None else None
    run = Run(
        status=record.status,
        error=record.error,
        method=record.method,
        drafter=record.drafter,
        steering=result.steering if result is not None else record.steering,
        prompt_set=record.prompt_set,
        prompt=record.prompt,
        messages=record.messages,
        config=record.config,
        precision=result.precision if result is not None else record.precision,
        comparison_id=comparison_id,
        text=result.text if result else None,
        token_ids=result.token_ids if result else None,
        prompt_tokens=result.prompt_tokens if result else None,
        finish_reason=result.finish_reason if result else None,
        n_tokens=metrics.n_tokens if metrics else None,
        tau=metrics.tau if metrics else None,
        acceptance_rate=metrics.acceptance_rate if metrics else None,
        alpha_hat=metrics.alpha_hat if metrics else None,
        tokens_per_s=metrics.tokens_per_s if metrics else None,
        metrics=metrics.to_dict() if metrics else None,
    )
    session.add(run)
    session.flush()  # assigns run.id
    if result is not None and result.blocks:
        _insert_blocks(session, run.id, result.blocks)
    return run.id


def _insert_blocks(session: Session, run_id: int, blocks: Sequence[Block]) -> None:
    """Bulk-insert the trace: one executemany for blocks, one for events (a 128-token run is ~150 rows)."""
    block_ids = session.scalars(
        insert(BlockRow).returning(BlockRow.id, sort_by_parameter_order=True),
        [block_params(run_id, b) for b in blocks],
    ).all()
    pairs = zip(block_ids, blocks, strict=True)
    events = [row for block_id, block in pairs for row in event_params(run_id, block_id, block)]
    if events:
        session.execute(insert(TokenEventRow), events)


def upsert_drafter(db: Database, info: DrafterInfo) -> None:
    """Insert or update the registry row. Replicas starting together register the same drafters at
    once: the one whose insert loses the race updates the row the other one inserted."""
    try:
        _upsert_drafter_once(db, info)
    except IntegrityError:
        _upsert_drafter_once(db, info)  # the row exists now: this time it is an update


def _upsert_drafter_once(db: Database, info: DrafterInfo) -> None:
    with db.write() as session:
        row = session.get(DrafterRow, info.name) or DrafterRow(name=info.name)
        row.source, row.path, row.architecture = info.source, info.path, info.architecture
        row.recipe, row.steering, row.n_params, row.job_id = (
            info.recipe,
            info.steering,
            info.n_params,
            info.job_id,
        )
        session.add(row)


ACTIVE_JOB_STATUSES = ("queued", "running")


def create_job(
    db: Database, name: str, method: str, base_drafter: str, spec: Mapping, replica: str, lease_s: float
) -> int:
    """A queued job, claimed by `replica` for `lease_s` seconds (renewed by `renew_leases`)."""
    with db.write() as session:
        job = TrainingJob(
            name=name,
            method=method,
            base_drafter=base_drafter,
            spec=dict(spec),
            status="queued",
            replica=replica,
            lease_until=utcnow() + timedelta(seconds=lease_s),
        )
        session.add(job)
        session.flush()
        return job.id


def start_job(db: Database, job_id: int) -> bool:
    """queued → running; False when the job was cancelled while it waited."""
    with db.write() as session:
        changed = session.execute(
            update(TrainingJob)
            .where(TrainingJob.id == job_id, TrainingJob.status == "queued")
            .values(status="running", started_at=utcnow())
        ).rowcount
        return changed > 0


def finish_job(
    db: Database, job_id: int, status: str, error: str | None = None, checkpoint: str | None = None
) -> None:
    """Move a job to a terminal status (once: a finished job never changes again)."""
    assert status in TERMINAL_JOB_STATUSES
    values: dict = {"status": status, "error": error, "checkpoint": checkpoint, "finished_at": utcnow()}
    if status == "succeeded":
        values["progress"] = 1.0
    with db.write() as session:
        session.execute(
            update(TrainingJob)
            .where(TrainingJob.id == job_id, TrainingJob.status.not_in(TERMINAL_JOB_STATUSES))
            .values(**values)
        )


def add_metric_points(
    db: Database, job_id: int, step: int, metrics: Mapping[str, float], progress: float
) -> None:
    with db.write() as session:
        session.add_all(
            MetricPoint(job_id=job_id, step=step, name=k, value=float(v)) for k, v in metrics.items()
        )
        session.execute(update(TrainingJob).where(TrainingJob.id == job_id).values(progress=progress))


def renew_leases(db: Database, replica: str, lease_s: float) -> int:
    """Extend the claim of `replica` on its queued and running jobs by `lease_s` from now."""
    with db.write() as session:
        return session.execute(
            update(TrainingJob)
            .where(TrainingJob.replica == replica, TrainingJob.status.in_(ACTIVE_JOB_STATUSES))
            .values(lease_until=utcnow() + timedelta(seconds=lease_s))
        ).rowcount


def fail_abandoned_jobs(db: Database, replica: str | None = None) -> int:
    """Mark failed the queued and running jobs no live replica holds: their lease lapsed (the replica
    died) or they have none (written before leases) — and, with `replica`, that replica's own (it is
    stopping). Jobs other live replicas hold are left alone. Returns how many failed."""
    abandoned = or_(TrainingJob.lease_until.is_(None), TrainingJob.lease_until < utcnow())
    if replica is not None:
        abandoned = or_(abandoned, TrainingJob.replica == replica)
    error = "the server running it stopped before the job finished"
    with db.write() as session:
        return session.execute(
            update(TrainingJob)
            .where(TrainingJob.status.in_(ACTIVE_JOB_STATUSES), abandoned)
            .values(status="failed", error=error, finished_at=utcnow())
        ).rowcount


def finish_job_if_queued(db: Database, job_id: int) -> None:
    """Cancel a job that has not started (a running job is stopped by its runner instead)."""
    with db.write() as session:
        session.execute(
            update(TrainingJob)
            .where(TrainingJob.id == job_id, TrainingJob.status == "queued")
            .values(status="cancelled", error="cancelled before it started", finished_at=utcnow())
        )


def record_benchmark(db: Database, result: Mapping) -> int:
    """Store one validated `sd2 bench` result (its aggregated cells, not its generation rows)."""
    with db.write() as session:
        row = BenchmarkRow(
            measured_at=result["created_at"],
            label=result.get("label"),
            command=result["command"],
            bench_schema_version=result["schema_version"],
            machine=result["machine"],
            models=result["models"],
            plan=result["plan"],
            prompt_sets=result["prompt_sets"],
            forward_times=result.get("forward_times") or [],
            cells=result["cells"],
            best_k=result.get("best_k") or [],
        )
        session.add(row)
        session.flush()
        return row.id


def delete_benchmark(db: Database, benchmark_id: int) -> bool:
    with db.write() as session:
        return session.execute(delete(BenchmarkRow).where(BenchmarkRow.id == benchmark_id)).rowcount > 0
