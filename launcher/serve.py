"""`sd2 serve`: the service's app, the browser UI mounted beside its routes, under uvicorn."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI

from service.app import create_app
from service.settings import Settings, serve_settings


def build_app(settings: Settings, ui: bool = True, **inject: Any) -> FastAPI:
    """The service's app for `settings` (`inject`: create_app's `engine` / `train_fn`), with the UI at `/`
    unless `ui` is False. The API routes are registered first, so the UI never shadows them; the UI
    (`app/`, needs the `app` extra) talks to this same server over HTTP."""
    api = create_app(settings, **inject)
    if not ui:
        return api
    from app.mount import mount_ui  # gradio is imported only when the UI is wanted

    return mount_ui(api, settings.host, settings.port)


def serve(
    host: str | None,
    port: int | None,
    drafters: Mapping[str, str],
    ui: bool = True,
    **models: str | bool | None,
) -> int:
    """Run the API (and, unless `ui` is False, the browser UI at `/`) on one port. `models`: verifier,
    device, dtype, draft_step, packed_weights (see `service.settings.serve_settings`)."""
    import uvicorn

    from sd2.devices import default_placement
    from sd2.draft_step import resolve_draft_step

    settings = serve_settings(host, port, drafters, **models)
    # refuse an unusable device or a bad --draft-step before binding a port
    placement = default_placement(settings.device, settings.dtype)
    resolve_draft_step(settings.draft_step, placement.device)
    uvicorn.run(build_app(settings, ui=ui), host=settings.host, port=settings.port, log_level="info")
    return 0
