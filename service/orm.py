"""SQLAlchemy 2 models of the trace store (docs/trace.md#what-the-database-stores).

API schemas live in `service.schemas`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import ClassVar

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict] = {datetime: DateTime(timezone=True), dict: JSON, list: JSON}


class Comparison(Base):
    """One prompt decoded by several methods with the same settings and seed."""

    __tablename__ = "comparisons"

    id: Mapped[int] = mapped_column(primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    methods: Mapped[list] = mapped_column()
    runs: Mapped[list[Run]] = relationship(back_populates="comparison", order_by="Run.id")


class Run(Base):
    """One generation request and its outcome. Failed/cancelled runs keep the request, never blocks."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_method_created", "method", "created_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    status: Mapped[str] = mapped_column(String(16))  # succeeded | failed | cancelled
    error: Mapped[str | None] = mapped_column(Text)
    method: Mapped[str] = mapped_column(String(64))
    drafter: Mapped[str | None] = mapped_column(String(64), index=True)  # None for verifier/self
    steering: Mapped[bool] = mapped_column()  # whether a steering head was actually used
    prompt_set: Mapped[str | None] = mapped_column(String(64))
    prompt: Mapped[str | None] = mapped_column(Text)
    messages: Mapped[list | None] = mapped_column()
    config: Mapped[dict] = mapped_column()  # DecodeConfig as a dict
    precision: Mapped[str | None] = mapped_column(String(48))  # e.g. "cpu/bf16" (schema v3; NULL before)
    comparison_id: Mapped[int | None] = mapped_column(ForeignKey("comparisons.id", ondelete="SET NULL"))
    # The outcome (NULL unless succeeded); aggregates are columns so /stats is one GROUP BY.
    text: Mapped[str | None] = mapped_column(Text)
    token_ids: Mapped[list | None] = mapped_column()
    prompt_tokens: Mapped[int | None] = mapped_column()
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    n_tokens: Mapped[int | None] = mapped_column()
    tau: Mapped[float | None] = mapped_column(Float)
    acceptance_rate: Mapped[float | None] = mapped_column(Float)
    alpha_hat: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict | None] = mapped_column()  # GenerationMetrics.to_dict()

    comparison: Mapped[Comparison | None] = relationship(back_populates="runs")
    blocks: Mapped[list[BlockRow]] = relationship(
        back_populates="run", cascade="all, delete-orphan", passive_deletes=True, order_by="BlockRow.index"
    )


class BlockRow(Base):
    """One verifier forward of a run (sd2.trace.Block)."""

    __tablename__ = "blocks"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # sd2.trace.BlockKind: prefill, verifier, speculative
    k: Mapped[int] = mapped_column()
    n_accepted: Mapped[int] = mapped_column()
    complete: Mapped[bool] = mapped_column()
    overlaps: Mapped[list] = mapped_column()
    steering_norm: Mapped[float | None] = mapped_column(Float)
    layer_bias_norms: Mapped[list] = mapped_column()
    draft_ms: Mapped[float] = mapped_column(Float)
    verify_ms: Mapped[float] = mapped_column(Float)
    steer_ms: Mapped[float] = mapped_column(Float)
    total_ms: Mapped[float] = mapped_column(Float)
    draft_stop: Mapped[str | None] = mapped_column(String(16))  # sd2.trace.DraftStop (schema v4; NULL before)
    # sd2.trace.Counterfactual as a plain dict, when the run asked for it (schema v6; NULL without one)
    counterfactual: Mapped[dict | None] = mapped_column()
    counterfactual_ms: Mapped[float | None] = mapped_column(Float)  # schema v6; NULL before, read as 0.0
    batch_size: Mapped[int | None] = mapped_column()  # schema v7; NULL before, read as 1 (it ran alone)

    run: Mapped[Run] = relationship(back_populates="blocks")
    events: Mapped[list[TokenEventRow]] = relationship(
        back_populates="block",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="TokenEventRow.position",
    )


class TokenEventRow(Base):
    """One token of a block: drafts at positions 0..k-1, the extra (resampled/bonus) token after them."""

    __tablename__ = "token_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    block_id: Mapped[int] = mapped_column(ForeignKey("blocks.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column()
    is_extra: Mapped[bool] = mapped_column()
    token_id: Mapped[int] = mapped_column()
    text: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))  # accepted | rejected | discarded | resampled | bonus
    draft_prob: Mapped[float | None] = mapped_column(Float)
    target_prob: Mapped[float | None] = mapped_column(Float)
    # The rejection explainer (schema v6; NULL before, read back as None and [])
    target_rank: Mapped[int | None] = mapped_column()
    target_top: Mapped[list | None] = mapped_column()  # sd2.trace.Candidate dicts
    draft_top: Mapped[list | None] = mapped_column()
    residual_top: Mapped[list | None] = mapped_column()

    block: Mapped[BlockRow] = relationship(back_populates="events")


class DrafterRow(Base):
    """The drafter registry: configured drafters and those produced by training jobs."""

    __tablename__ = "drafters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    source: Mapped[str] = mapped_column(String(16))  # config | training
    path: Mapped[str] = mapped_column(Text)  # written by the server only, never taken from a request
    architecture: Mapped[str] = mapped_column(String(64))
    recipe: Mapped[str | None] = mapped_column(String(32))
    steering: Mapped[bool] = mapped_column()
    n_params: Mapped[int] = mapped_column()
    job_id: Mapped[int | None] = mapped_column(ForeignKey("training_jobs.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class TrainingJob(Base):
    """A training job: queued → running → succeeded | failed | cancelled."""

    __tablename__ = "training_jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))  # the drafter it will register
    method: Mapped[str] = mapped_column(String(16))  # pretrain | distill | sd2
    base_drafter: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict] = mapped_column()
    status: Mapped[str] = mapped_column(String(16), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    checkpoint: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    # The replica that queued the job, and until when its claim holds; that replica renews it while it
    # lives, and any replica fails a queued/running job whose claim lapsed (service/jobs.py).
    replica: Mapped[str | None] = mapped_column(String(80))
    lease_until: Mapped[datetime | None] = mapped_column()

    points: Mapped[list[MetricPoint]] = relationship(
        back_populates="job", cascade="all, delete-orphan", passive_deletes=True, order_by="MetricPoint.id"
    )


class MetricPoint(Base):
    """One scalar a training job reported at a step (loss, lr, ...)."""

    __tablename__ = "training_metric_points"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("training_jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column()
    name: Mapped[str] = mapped_column(String(32))
    value: Mapped[float] = mapped_column(Float)

    job: Mapped[TrainingJob] = relationship(back_populates="points")


class BenchmarkRow(Base):
    """One `sd2 bench` result stored through POST /benchmarks (schema v2; the per-generation rows of
    the bench JSON are not kept, every aggregated cell is)."""

    __tablename__ = "benchmarks"

    id: Mapped[int] = mapped_column(primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)  # when it was stored
    measured_at: Mapped[str] = mapped_column(String(40))  # the bench's own created_at (ISO 8601)
    label: Mapped[str | None] = mapped_column(String(200))
    command: Mapped[str] = mapped_column(Text)
    bench_schema_version: Mapped[int] = mapped_column()
    machine: Mapped[dict] = mapped_column()
    models: Mapped[dict] = mapped_column()
    plan: Mapped[dict] = mapped_column()
    prompt_sets: Mapped[list] = mapped_column()
    forward_times: Mapped[list] = mapped_column()
    cells: Mapped[list] = mapped_column()
    best_k: Mapped[list] = mapped_column()
