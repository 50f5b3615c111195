"""POST /compare: one prompt through several methods with the same settings and seed, one after another;
as one JSON answer, or streamed as NDJSON so each method's column fills while it decodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from sd2.engine import PreparedRequest
from sd2.trace import Block
from service import repository
from service.deps import Services, ServicesDep
from service.generation import admit, decode, decode_together, prepare
from service.repository import RunRecord
from service.schemas import CompareIn, CompareOut
from service.streaming import Feed, error_line, ndjson_line, stream_work

router = APIRouter(tags=["generate"])

Emit = Callable[[str, dict], None]  # (event, fields) → one NDJSON line

STREAM_DOC = (
    "With `stream: true` the response is `application/x-ndjson`, in decoding order: for each method "
    '`{"event": "method", "index": i, "method": ...}` as it starts, `{"event": "block", "index": i, '
    '"method": ..., "block": {...}}` per block, and `{"event": "result", "index": i, "method": ..., '
    '"status": ..., ...}` with the run\'s fields except `blocks` (or `error`) when it ends; then '
    '`{"event": "summary", "comparison_id": ..., "run_ids": [...], "status": ...}` once all are stored. '
    "A client that leaves stops the method decoding (stored as cancelled) and the ones not started."
)


@router.post(
    "/compare",
    response_model=CompareOut,
    summary="Decode one prompt with several methods",
    description=(
        "Every method decodes the same prompt with the same settings and seed. Decoding is lossless, so at "
        "temperature 0 every method returns the *same text* (the verifier's greedy output) and differs only "
        "in acceptance (τ, acceptance rate) and speed; at T > 0 the texts follow the same distribution but "
        "differ token by token because drafters consume randomness differently. All runs and the comparison "
        "are stored in one transaction. " + STREAM_DOC
    ),
    responses={
        200: {"content": {"application/x-ndjson": {}}},
        422: {"description": "a field is invalid"},
        429: {"description": "every generation slot is taken; retry after `Retry-After` seconds"},
        500: {"description": "a method's run failed"},
    },
)
async def compare(body: CompareIn, services: ServicesDep):
    requests = [prepare(body, method, services.settings) for method in body.methods]
    for method in body.methods:
        await services.find_method(method)
    services.admission.acquire()  # one slot for the whole comparison; Busy: 429, nothing stored
    handed_over = False
    try:
        prepared = [await services.in_decode_pool(admit, services.host, r) for r in requests]  # all first
        if body.stream:
            handed_over = True  # the streaming worker releases the slot when the last method ends
            return await _streamed(services, body.methods, prepared, body.prompt_set)
        records = await services.in_decode_pool(_decode_all, services, prepared, body.prompt_set)
    finally:
        if not handed_over:
            services.admission.release()
    comparison_id, run_ids = await services.in_thread(
        repository.record_comparison, services.db, body.methods, records
    )
    failed = [(m, r) for m, r in zip(body.methods, records, strict=True) if r.result is None]
    if failed:
        detail = "; ".join(f"{m}: {r.error}" for m, r in failed)
        return JSONResponse(
            {"detail": f"runs failed: {detail}", "comparison_id": comparison_id, "run_ids": run_ids},
            status_code=500,
        )
    results = [{"run_id": i, **r.result.to_dict()} for i, r in zip(run_ids, records, strict=True)]
    return JSONResponse({"comparison_id": comparison_id, "results": results})


def _decode_all(
    services: Services,
    prepared: Sequence[PreparedRequest],
    prompt_set: str | None,
    emit: Emit | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> list[RunRecord]:
    """Decode the prepared requests: side by side when nothing streams (`decode_together`), else each
    in turn so a stream holds one method's blocks after another (each beside other clients' requests).
    Returns the records of the methods that started: all of them, unless `should_stop` said to stop
    (the one running is then cancelled)."""
    if emit is None:
        return decode_together(services.host, prepared, prompt_set, should_stop)
    records = []
    for index, request in enumerate(prepared):
        if should_stop():
            break
        method = request.request.method
        on_block = None
        if emit is not None:
            emit("method", {"index": index, "method": method})

            def on_block(block: Block, index: int = index, method: str = method) -> None:
                emit("block", {"index": index, "method": method, "block": block.to_dict()})

        record = decode(services.host, request, prompt_set, on_block, should_stop)
        records.append(record)
        if emit is not None:
            emit("result", {"index": index, "method": method, **_outcome(record)})
    return records


def _outcome(record: RunRecord) -> dict:
    if record.result is None:
        return {"status": record.status, "error": record.error}
    fields = record.result.to_dict()
    del fields["blocks"]
    return {"status": record.status, **fields}


async def _streamed(
    services: Services, methods: Sequence[str], prepared: Sequence[PreparedRequest], prompt_set: str | None
):
    def work(feed: Feed) -> None:
        def emit(event: str, fields: dict) -> None:
            feed.put("line", {"event": event, **fields})

        try:
            records = _decode_all(services, prepared, prompt_set, emit, feed.client_gone.is_set)
        except BaseException as err:
            feed.put("error", err)
            return
        finally:
            services.admission.release()  # the slot admitted in `compare`; storing needs no model
        try:
            started = list(methods[: len(records)])
            comparison_id, run_ids = repository.record_comparison(services.db, started, records)
        except BaseException as err:
            feed.put("error", err)
            return
        ok = all(r.result is not None for r in records) and len(records) == len(methods)
        status = "succeeded" if ok else "cancelled" if feed.client_gone.is_set() else "failed"
        summary = {"event": "summary", "comparison_id": comparison_id, "run_ids": run_ids, "status": status}
        feed.put("done", summary)

    return await stream_work(services, work, _ndjson, "application/x-ndjson", services.admission.release)


def _ndjson(item) -> tuple[str, bool]:
    kind, payload = item
    if kind == "line":
        return ndjson_line(payload), False
    if kind == "done":
        return ndjson_line(payload), True
    return error_line(payload), True
