"""GET /metrics: the service's Prometheus instruments (service.metrics), in the text exposition format."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    summary="Prometheus metrics: requests, latencies, queue depth, speculative counters per method",
    description=(
        "Prometheus' text format (`sd2_` names; docs/interfaces.md lists them). Open like /health even "
        "when SD2_API_KEY is set. Served on the event loop without the database or the model lock, so "
        "it answers however many generations run or wait."
    ),
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
async def metrics(services: ServicesDep) -> Response:
    return Response(services.host.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
