"""GET /health (liveness), GET /ready (readiness), GET /defaults and GET /version."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter
from fastapi.responses import JSONResponse

import sd2
from sd2.config import DECODE_DEFAULTS
from service.db import SCHEMA_VERSION
from service.deps import ServicesDep
from service.schemas import DefaultsOut, HealthOut, ReadyOut, VersionOut

router = APIRouter(tags=["health"])
API_VERSION = "1"


@router.get(
    "/health",
    response_model=HealthOut,
    summary="Models loaded, device, DB reachable",
    responses={503: {"model": HealthOut, "description": "the database is unreachable"}},
)
async def health(services: ServicesDep):
    engine = services.host.engine
    database = await services.in_thread(services.db.ping)
    body = {
        "status": "ok" if database else "degraded",
        "models_loaded": True,  # the lifespan loads them before the first request is served
        "verifier": engine.verifier_name,
        "methods": engine.methods(),
        "device": engine.device_label,
        "batch_invariant": engine.batch_invariant,
        "draft_step": engine.draft_step_kind,
        "packed_weights": engine.packed_weights,
        "draft_weights": engine.draft_weights,
        "database": database,
    }
    return JSONResponse(body, status_code=200 if database else 503)


@router.get(
    "/ready",
    response_model=ReadyOut,
    summary="Ready for traffic: models loaded, database writable, training worker alive",
    responses={503: {"model": ReadyOut, "description": "a check failed; it is false in the body"}},
)
async def ready(services: ServicesDep):
    checks = {
        "models_loaded": True,  # the lifespan loads them before the first request is served
        "database_writable": await services.in_thread(services.db.writable),
        "training_worker": services.jobs.alive,
    }
    ok = all(checks.values())
    return JSONResponse({"status": "ready" if ok else "not_ready", **checks}, status_code=200 if ok else 503)


@router.get(
    "/defaults",
    response_model=DefaultsOut,
    summary="The decode settings a request gets for each field it leaves out",
)
async def defaults(services: ServicesDep):
    return {"decode": asdict(DECODE_DEFAULTS), "max_new_tokens_limit": services.settings.max_new_tokens}


@router.get("/version", response_model=VersionOut)
async def version():
    return {"sd2": sd2.__version__, "schema_version": SCHEMA_VERSION, "api": API_VERSION}
