"""GET /drafters: the drafters this server can decode with, with their registry facts. Drafters a
training job registered on any replica sharing the store are loaded first, so every replica lists
(and the UI offers) the same ones."""

from __future__ import annotations

from fastapi import APIRouter

from service import queries
from service.deps import ServicesDep
from service.jobs import drafter_info
from service.registry import load_trained_drafters
from service.schemas import DrafterOut

router = APIRouter(tags=["drafters"])


@router.get("/drafters", response_model=list[DrafterOut], summary="Loaded drafters (usable as `method`)")
async def list_drafters(services: ServicesDep):
    def read():
        load_trained_drafters(services.db, services.host, services.settings.drafters_dir)  # none new: a read
        with services.db.read() as session:
            rows = queries.drafter_rows(session)
        loaded = services.host.engine.loaded_drafters()
        return [_describe(d, rows.get(d.name)) for d in loaded]

    return await services.in_thread(read)


def _describe(drafter, row) -> dict:
    info = drafter_info(drafter, source=row.source if row is not None else "config")
    return {
        "name": info.name,
        "architecture": info.architecture,
        "recipe": info.recipe,
        "steering": info.steering,
        "n_params": info.n_params,
        "source": info.source,
    }
