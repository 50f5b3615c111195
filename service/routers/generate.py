"""POST /generate: one generation, as JSON or streamed as NDJSON (one line per block, then a summary)."""

from __future__ import annotations

import asyncio
import threading

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from sd2.engine import PreparedRequest
from sd2.trace import Block
from service import repository
from service.deps import Services, ServicesDep
from service.errors import public_error
from service.generation import admit, decode, prepare
from service.repository import RunRecord
from service.schemas import GenerateIn, GenerationOut
from service.streaming import Feed, ndjson_line, stream_work

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
    request = prepare(body, body.method, services.settings)
    await services.find_method(body.method)
    services.admission.acquire()  # Busy: 429 with Retry-After, nothing stored
    handed_over = False
    try:
        prepared = await services.in_decode_pool(admit, services.host, request)  # a refusal: 4xx
        if body.stream:
            handed_over = True  # the streaming worker releases the slot when the run ends
            return await _streamed(services, prepared, body.prompt_set)
        gone = threading.Event()  # a client that hangs up cancels its run at the next block (D13)
        watcher = asyncio.create_task(_watch_disconnect(http, gone))
        try:
            record = await services.in_decode_pool(
                decode, services.host, prepared, body.prompt_set, None, gone.is_set
            )
        finally:
            watcher.cancel()
    finally:
        if not handed_over:
            services.admission.release()
    run_id = await services.in_thread(repository.record_run, services.db, record)
    return outcome_response(run_id, record)


async def _watch_disconnect(http: Request, gone: threading.Event, interval_s: float = 0.2) -> None:
    """Set `gone` once the client of a plain (non-streamed) request has disconnected."""
    while not await http.is_disconnected():
        await asyncio.sleep(interval_s)
    gone.set()


def outcome_response(run_id: int, record: RunRecord) -> JSONResponse:
    if record.result is None:
        return JSONResponse(
            {"detail": f"the run {record.status}: {record.error}", "run_id": run_id, "status": record.status},
            status_code=500,
        )
    # Returned as-is (already the §6 shape): re-validating ~150 token events per run buys nothing.
    return JSONResponse({"run_id": run_id, **record.result.to_dict()})


async def _streamed(
    services: Services, prepared: PreparedRequest, prompt_set: str | None
) -> StreamingResponse:
    """Decode on the generation pool, streaming a line per block; a client that leaves makes the run
    stop at the next block and store a cancelled run (service.streaming)."""

    def work(feed: Feed) -> None:
        def on_block(block: Block) -> None:
            feed.put("block", block.to_dict())

        try:
            record = decode(services.host, prepared, prompt_set, on_block, feed.client_gone.is_set)
        except BaseException as err:
            feed.put("error", err)
            return
        finally:
            services.admission.release()  # the slot admitted in `generate`; storing needs no model
        try:
            feed.put("done", (repository.record_run(services.db, record), record))
        except BaseException as err:
            feed.put("error", err)

    return await stream_work(services, work, _ndjson, "application/x-ndjson", services.admission.release)


def _ndjson(item) -> tuple[str, bool]:
    kind, payload = item
    if kind == "block":
        return ndjson_line({"event": "block", "block": payload}), False
    if kind == "done":
        return ndjson_line(_summary(*payload)), True
    return ndjson_line({"event": "error", "status": "failed", "error": public_error(payload)}), True


def _summary(run_id: int, record: RunRecord) -> dict:
    if record.result is None:
        return {"event": "error", "run_id": run_id, "status": record.status, "error": record.error}
    summary = record.result.to_dict()
    del summary["blocks"]
    return {"event": "summary", "run_id": run_id, "status": record.status, **summary}
