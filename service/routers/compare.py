"""POST /compare: one prompt through several methods with the same settings and seed."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service import repository
from service.deps import ServicesDep
from service.generation import admit, decode, prepare
from service.schemas import CompareIn, CompareOut

router = APIRouter(tags=["generate"])


@router.post(
    "/compare",
    response_model=CompareOut,
    summary="Decode one prompt with several methods",
    description=(
        "Every method decodes the same prompt with the same settings and seed. Decoding is lossless, so at "
        "temperature 0 every method returns the *same text* (the verifier's greedy output) and differs only "
        "in acceptance (τ, acceptance rate) and speed; at T > 0 the texts follow the same distribution but "
        "differ token by token because drafters consume randomness differently. All runs and the comparison "
        "are stored in one transaction."
    ),
    responses={
        422: {"description": "a field is invalid"},
        429: {"description": "every generation slot is taken; retry after `Retry-After` seconds"},
        500: {"description": "a method's run failed"},
    },
)
async def compare(body: CompareIn, services: ServicesDep):
    requests = [prepare(body, method, services.settings) for method in body.methods]
    for method in body.methods:
        await services.find_method(method)
    with services.admission.slot():  # one slot for the whole comparison; Busy: 429, nothing stored
        prepared = [await services.in_decode_pool(admit, services.host, r) for r in requests]  # all first
        records = [await services.in_decode_pool(decode, services.host, p, body.prompt_set) for p in prepared]
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
