"""Stored runs: list, read, export, delete, and aggregate statistics."""

from __future__ import annotations

import csv
import io
import json
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from fastapi.encoders import jsonable_encoder
from fastapi.responses import Response

from service import queries, repository
from service.deps import ApiKeyDep, ServicesDep
from service.errors import not_found
from service.schemas import Name, RunDetail, RunPage, StatsRow, UtcMoment

router = APIRouter(tags=["runs"])
RunId = Annotated[int, Path(ge=1, le=2**62, description="a run id from POST /generate or GET /runs")]
CSV_COLUMNS = (
    "block_index",
    "block_kind",
    "position",
    "token_id",
    "text",
    "status",
    "draft_prob",
    "target_prob",
    "target_rank",
    "source",  # "trace": the block's token events; "counterfactual": its unsteered counterfactual's drafts
    "survival",  # counterfactual rows: P(this and every earlier draft accepted); empty on trace rows
)


@router.get("/runs", response_model=RunPage, summary="List runs, newest first")
async def list_runs(
    services: ServicesDep,
    method: Annotated[Name | None, Query()] = None,
    drafter: Annotated[Name | None, Query()] = None,
    status: Literal["succeeded", "failed", "cancelled"] | None = None,
    since: Annotated[
        UtcMoment | None, Query(description="created at or after (ISO 8601; naive = UTC)")
    ] = None,
    until: Annotated[UtcMoment | None, Query(description="created before (ISO 8601; naive = UTC)")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
):
    items, total = await services.query(
        queries.list_runs,
        method=method,
        drafter=drafter,
        status=status,
        since=since,
        until=until,
        limit=limit,
        offset=offset,
    )
    return {"items": items, "total": total, "limit": limit, "offset": offset}


async def _run_or_404(services, run_id: int) -> dict:
    run = await services.query(queries.get_run, run_id)
    if run is None:
        raise not_found("run_id", f"no run {run_id}")
    return run


@router.get("/runs/{run_id}", response_model=RunDetail, summary="A run with its blocks and token events")
async def get_run(run_id: RunId, services: ServicesDep):
    return await _run_or_404(services, run_id)


@router.get(
    "/runs/{run_id}/export",
    summary="Download a run as JSON (everything) or CSV (one row per token event and counterfactual draft)",
    responses={200: {"content": {"application/json": {}, "text/csv": {}}}},
)
async def export_run(
    run_id: RunId, services: ServicesDep, format: Literal["json", "csv"] = "json"
) -> Response:
    run = await _run_or_404(services, run_id)
    # The file name is built from the integer id only; nothing from the request reaches a path.
    disposition = {"Content-Disposition": f'attachment; filename="run-{run_id}.{format}"'}
    if format == "json":
        body = json.dumps(jsonable_encoder(run), ensure_ascii=False, indent=2)
        return Response(body, media_type="application/json", headers=disposition)
    return Response(_csv(run), media_type="text/csv", headers=disposition)


def _csv(run: dict) -> str:
    """Per block, its token events (drafts, then the extra token), then its counterfactual's drafts."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for block in run["blocks"]:
        tokens = [*block["drafts"], *([block["extra"]] if block["extra"] else [])]
        counterfactual = block["counterfactual"]["drafts"] if block["counterfactual"] else []
        for source, rows in (("trace", tokens), ("counterfactual", counterfactual)):
            for position, t in enumerate(rows):
                row = (block["index"], block["kind"], position, t["token_id"], t["text"], t["status"])
                probs = (t["draft_prob"], t["target_prob"], t["target_rank"])
                writer.writerow((*row, *probs, source, t.get("survival")))
    return out.getvalue()


@router.delete(
    "/runs/{run_id}", status_code=204, dependencies=[ApiKeyDep], summary="Delete a run and its trace"
)
async def delete_run(run_id: RunId, services: ServicesDep) -> Response:
    if not await services.in_thread(repository.delete_run, services.db, run_id):
        raise not_found("run_id", f"no run {run_id}")
    return Response(status_code=204)


@router.get(
    "/stats", response_model=list[StatsRow], summary="τ, acceptance and tokens/s per method and prompt set"
)
async def stats(services: ServicesDep):
    return await services.query(queries.stats)
