"""Stored `sd2 bench` results: POST one (what `sd2 bench --store URL` does), list, read, delete.
The UI's Theory view plots their cells on the E[τ] and speed-up curves; History lists them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from service import queries, repository
from service.deps import ApiKeyDep, ServicesDep
from service.errors import not_found
from service.schemas import BenchmarkDetail, BenchmarkIn, BenchmarkPage, BenchmarkSummary

router = APIRouter(tags=["benchmarks"])
BenchmarkId = Annotated[
    int, Path(ge=1, le=2**62, description="an id from POST /benchmarks or GET /benchmarks")
]


@router.post(
    "/benchmarks",
    status_code=201,
    response_model=BenchmarkSummary,
    dependencies=[ApiKeyDep],
    summary="Store an sd2 bench result (bench.json; its per-generation rows are dropped)",
)
async def store_benchmark(body: BenchmarkIn, services: ServicesDep):
    result = body.model_dump(by_alias=True, exclude={"generations"})

    def write():
        benchmark_id = repository.record_benchmark(services.db, result)
        with services.db.read() as session:
            return queries.get_benchmark(session, benchmark_id)

    return await services.in_thread(write)


@router.get(
    "/benchmarks", response_model=BenchmarkPage, summary="List stored benchmark results, newest first"
)
async def list_benchmarks(
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31)] = 0,
):
    items, total = await services.query(queries.list_benchmarks, limit, offset)
    return {"items": items, "total": total, "limit": limit, "offset": offset}


@router.get(
    "/benchmarks/{benchmark_id}", response_model=BenchmarkDetail, summary="A stored result with its cells"
)
async def get_benchmark(benchmark_id: BenchmarkId, services: ServicesDep):
    found = await services.query(queries.get_benchmark, benchmark_id)
    if found is None:
        raise not_found("benchmark_id", f"no benchmark {benchmark_id}")
    return found


@router.delete(
    "/benchmarks/{benchmark_id}", status_code=204, dependencies=[ApiKeyDep], summary="Delete a stored result"
)
async def delete_benchmark(benchmark_id: BenchmarkId, services: ServicesDep) -> Response:
    if not await services.in_thread(repository.delete_benchmark, services.db, benchmark_id):
        raise not_found("benchmark_id", f"no benchmark {benchmark_id}")
    return Response(status_code=204)
