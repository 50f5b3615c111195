"""Training jobs: submit, observe (JSON or NDJSON stream), cancel."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.encoders import jsonable_encoder
from fastapi.responses import StreamingResponse

from service import queries
from service.deps import ApiKeyDep, Services, ServicesDep
from service.errors import FieldError, not_found
from service.schemas import TrainIn, TrainJobOut

router = APIRouter(tags=["train"])
JobId = Annotated[int, Path(ge=1, le=2**62)]
POLL_S = 0.2  # the stream polls the store, so it works the same across replicas sharing one DB
TERMINAL = ("succeeded", "failed", "cancelled")


@router.post(
    "/train",
    response_model=TrainJobOut,
    status_code=202,
    dependencies=[ApiKeyDep],
    summary="Queue a training job that registers a new drafter when it succeeds",
    responses={409: {"description": "the drafter name is taken"}, 422: {"description": "a field is invalid"}},
)
async def submit(body: TrainIn, services: ServicesDep):
    await services.find_method(body.base_drafter)
    await services.in_thread(_check, body, services)
    spec = body.model_dump(exclude={"name", "method", "base_drafter"})
    job_id = await services.in_thread(services.jobs.submit, body.name, body.method, body.base_drafter, spec)
    return await _job_or_404(services, job_id)


def _check(body: TrainIn, services: Services) -> None:
    engine, settings = services.host.engine, services.settings
    if body.method not in services.train_methods:
        raise FieldError(
            "method", f"this server trains {list(services.train_methods)}; {body.method!r} needs `sd2 train`"
        )
    if body.base_drafter not in engine.drafter_names():
        loaded = ", ".join(engine.drafter_names())
        raise FieldError("base_drafter", f"unknown drafter {body.base_drafter!r}; loaded: {loaded}")
    if body.steps > settings.max_train_steps:
        raise FieldError("steps", f"steps must be ≤ {settings.max_train_steps} on this server")
    if body.data is not None and sum(map(len, body.data)) > settings.max_train_chars:
        raise FieldError("data", f"data holds more than {settings.max_train_chars} characters")
    with services.db.read() as session:
        taken = body.name in engine.methods() or body.name in queries.job_names(session)
    if taken or (settings.drafters_dir / body.name).exists():
        raise FieldError("name", f"a drafter or job named {body.name!r} already exists", status_code=409)


async def _job_or_404(services: Services, job_id: int, after_point: int = 0) -> dict:
    job = await services.query(queries.get_job, job_id, after_point)
    if job is None:
        raise not_found("job_id", f"no job {job_id}")
    return job


@router.get("/train/{job_id}", response_model=TrainJobOut, summary="Status, progress and metric points")
async def get_job(job_id: JobId, services: ServicesDep):
    return await _job_or_404(services, job_id)


@router.get(
    "/train/{job_id}/stream",
    summary="NDJSON: one line per status/progress change with the new metric points, until the job ends",
    responses={200: {"content": {"application/x-ndjson": {}}}},
)
async def stream_job(job_id: JobId, services: ServicesDep) -> StreamingResponse:
    job = await _job_or_404(services, job_id)
    return StreamingResponse(_job_lines(services, job), media_type="application/x-ndjson")


async def _job_lines(services: Services, job: dict) -> AsyncIterator[str]:
    state = None
    while True:
        if job["points"] or (job["status"], job["progress"]) != state:
            state = (job["status"], job["progress"])
            line = {k: v for k, v in job.items() if k not in ("spec", "last_point_id")}
            yield json.dumps(jsonable_encoder(line)) + "\n"
        if job["status"] in TERMINAL:
            return
        await asyncio.sleep(POLL_S)
        job = await _job_or_404(services, job["id"], job["last_point_id"])


@router.post(
    "/train/{job_id}/cancel",
    response_model=TrainJobOut,
    dependencies=[ApiKeyDep],
    summary="Cancel a job (a queued job at once, a running one at its next step)",
)
async def cancel(job_id: JobId, services: ServicesDep):
    await _job_or_404(services, job_id)
    await services.in_thread(services.jobs.cancel, job_id)
    return await _job_or_404(services, job_id)
