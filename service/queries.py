"""Reads from the trace store, shaped as the API's JSON (writes live in `service.repository`)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from service.orm import BenchmarkRow, BlockRow, DrafterRow, MetricPoint, Run, TrainingJob
from service.trace_rows import block_dict

RUN_SUMMARY_FIELDS = (
    *("id", "created_at", "status", "error", "method", "drafter", "steering", "prompt_set", "prompt"),
    *("messages", "config", "precision", "comparison_id", "text", "n_tokens", "tau", "acceptance_rate"),
    "alpha_hat",
    "tokens_per_s",
)


def as_utc(moment: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; every timestamp the service writes is UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def run_summary(run: Run) -> dict:
    data = {name: getattr(run, name) for name in RUN_SUMMARY_FIELDS}
    data["created_at"] = as_utc(run.created_at)
    return data


def list_runs(
    session: Session,
    *,
    method: str | None = None,
    drafter: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[dict], int]:
    """Newest first, filtered; returns (page, total matching). `since` / `until` in naive UTC, as the
    stored `created_at` (schemas.UtcMoment brings query strings there)."""
    conditions = []
    if method is not None:
        conditions.append(Run.method == method)
    if drafter is not None:
        conditions.append(Run.drafter == drafter)
    if status is not None:
        conditions.append(Run.status == status)
    if since is not None:
        conditions.append(Run.created_at >= since)
    if until is not None:
        conditions.append(Run.created_at < until)
    total = session.scalar(select(func.count(Run.id)).where(*conditions)) or 0
    rows = session.scalars(
        select(Run)
        .where(*conditions)
        .order_by(Run.created_at.desc(), Run.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    return [run_summary(r) for r in rows], total


def get_run(session: Session, run_id: int) -> dict | None:
    """A run with its blocks in the shape of sd2's Block.to_dict(), or None."""
    run = session.scalar(
        select(Run).where(Run.id == run_id).options(selectinload(Run.blocks).selectinload(BlockRow.events))
    )
    if run is None:
        return None
    data = run_summary(run)
    data.update(
        token_ids=run.token_ids,
        prompt_tokens=run.prompt_tokens,
        finish_reason=run.finish_reason,
        metrics=run.metrics,
        blocks=[block_dict(b) for b in run.blocks],
    )
    return data


def stats(session: Session) -> list[dict]:
    """Means of τ, acceptance, α̂ and tokens/s over succeeded runs, per (method, prompt set)."""
    rows = session.execute(
        select(
            Run.method,
            Run.prompt_set,
            func.count(Run.id),
            func.coalesce(func.sum(Run.n_tokens), 0),
            func.avg(Run.tau),
            func.avg(Run.acceptance_rate),
            func.avg(Run.alpha_hat),
            func.avg(Run.tokens_per_s),
        )
        .where(Run.status == "succeeded")
        .group_by(Run.method, Run.prompt_set)
        .order_by(Run.method, Run.prompt_set)
    ).all()
    keys = (
        "method",
        "prompt_set",
        "n_runs",
        "n_tokens",
        "tau",
        "acceptance_rate",
        "alpha_hat",
        "tokens_per_s",
    )
    return [dict(zip(keys, row, strict=True)) for row in rows]


def drafter_rows(session: Session) -> dict[str, DrafterRow]:
    return {row.name: row for row in session.scalars(select(DrafterRow)).all()}


def get_job(session: Session, job_id: int, after_point: int = 0) -> dict | None:
    """A job with its metric points whose id is > after_point (all of them by default)."""
    job = session.get(TrainingJob, job_id)
    if job is None:
        return None
    points = session.scalars(
        select(MetricPoint)
        .where(MetricPoint.job_id == job_id, MetricPoint.id > after_point)
        .order_by(MetricPoint.id)
    ).all()
    return {
        "id": job.id,
        "name": job.name,
        "method": job.method,
        "base_drafter": job.base_drafter,
        "status": job.status,
        "progress": job.progress,
        "error": job.error,
        "created_at": as_utc(job.created_at),
        "started_at": as_utc(job.started_at),
        "finished_at": as_utc(job.finished_at),
        "spec": job.spec,
        "points": [{"step": p.step, "name": p.name, "value": p.value} for p in points],
        "last_point_id": points[-1].id if points else after_point,
    }


def job_names(session: Session) -> set[str]:
    """Drafter names claimed by jobs that have not failed (a name is registered once)."""
    return set(
        session.scalars(
            select(TrainingJob.name).where(TrainingJob.status.in_(("queued", "running", "succeeded")))
        )
    )


def benchmark_summary(row: BenchmarkRow) -> dict:
    methods = list(dict.fromkeys(c["method"] for c in row.cells))
    return {
        "id": row.id,
        "created_at": as_utc(row.created_at),
        "measured_at": row.measured_at,
        "label": row.label,
        "command": row.command,
        "bench_schema_version": row.bench_schema_version,
        "machine": row.machine,
        "methods": methods,
        "prompt_sets": [s.get("name", "?") for s in row.prompt_sets],
        "n_cells": len(row.cells),
    }


def list_benchmarks(session: Session, limit: int, offset: int) -> tuple[list[dict], int]:
    """Stored benchmark results, newest first."""
    total = session.scalar(select(func.count()).select_from(BenchmarkRow)) or 0
    rows = session.scalars(
        select(BenchmarkRow)
        .order_by(BenchmarkRow.created_at.desc(), BenchmarkRow.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return [benchmark_summary(r) for r in rows], total


def get_benchmark(session: Session, benchmark_id: int) -> dict | None:
    row = session.get(BenchmarkRow, benchmark_id)
    if row is None:
        return None
    return {
        **benchmark_summary(row),
        "models": row.models,
        "plan": row.plan,
        "prompt_set_details": row.prompt_sets,
        "forward_times": row.forward_times,
        "cells": row.cells,
        "best_k": row.best_k,
    }
