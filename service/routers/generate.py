"""POST /generate: one generation, as JSON or streamed as NDJSON (one line per block, then a summary)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from sd2.trace import Block
from service.deps import ServicesDep
from service.one_run import admitted, decode_stored, stream_stored
from service.repository import RunRecord
from service.schemas import GenerateIn, GenerationOut
from service.streaming import error_line, ndjson_line

router = APIRouter(tags=["generate"])

STREAM_DOC = (
    "With `stream: true` the response is `application/x-ndjson`: one line "
    '`{"event": "block", "block": {...}}` per block as it is decoded, then one line '
    '`{"event": "summary", "run_id": ..., "status": "succeeded", ...}` holding the fields of the JSON '
    "response except `blocks` (its totals equal the sum of the streamed blocks), or "
    '`{"event": "error", ...}` if the run failed.'
)


@router.post(
    "/generate",
    response_model=GenerationOut,
    summary="Decode one prompt and store the run",
    description="Returns the JSON of docs/trace.md#a-generation plus `run_id`. " + STREAM_DOC,
    responses={
        200: {"content": {"application/x-ndjson": {}}},
        413: {"description": "request body too large"},
        422: {"description": "a field is invalid (its name is in `detail[].loc`)"},
        429: {"description": "every generation slot is taken; retry after `Retry-After` seconds"},
        500: {"description": "the run failed; it is stored with status failed (`run_id`)"},
    },
)
async def generate(body: GenerateIn, services: ServicesDep, http: Request):
    prepared = await admitted(services, body, body.method)  # Busy: 429; a refusal: 4xx; nothing stored
    if body.stream:
        return await stream_stored(
            services, prepared, body.prompt_set, Block.to_dict, _ndjson, "application/x-ndjson"
        )
    run_id, record = await decode_stored(services, prepared, body.prompt_set, http)
    return outcome_response(run_id, record)


def outcome_response(run_id: int, record: RunRecord) -> JSONResponse:
    if record.result is None:
        return JSONResponse(
            {"detail": f"the run {record.status}: {record.error}", "run_id": run_id, "status": record.status},
            status_code=500,
        )
    # Returned as-is (already the §6 shape): re-validating ~150 token events per run buys nothing.
    return JSONResponse({"run_id": run_id, **record.result.to_dict()})


def _ndjson(item) -> tuple[str, bool]:
    kind, payload = item
    if kind == "block":
        return ndjson_line({"event": "block", "block": payload}), False
    if kind == "done":
        return ndjson_line(_summary(*payload)), True
    return error_line(payload), True


def _summary(run_id: int, record: RunRecord) -> dict:
    if record.result is None:
        return {"event": "error", "run_id": run_id, "status": record.status, "error": record.error}
    summary = record.result.to_dict()
    del summary["blocks"]
    return {"event": "summary", "run_id": run_id, "status": record.status, **summary}
