"""`sd2 serve`: the service under uvicorn (the `serve` subcommand of sd2.cli delegates here)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from service.settings import Settings, is_safe_name


def serve_settings(
    host: str | None,
    port: int | None,
    drafters: Mapping[str, str],
    env: Mapping[str, str] | None = None,
    **models: str | None,
) -> Settings:
    """Environment settings with the command line's host, port, extra drafters and the models'
    `verifier`, `device` and `dtype` (each None: keep the environment's) on top."""
    settings = Settings.from_env(os.environ if env is None else env)
    unknown = set(models) - {"verifier", "device", "dtype"}
    if unknown:
        raise TypeError(f"unknown model settings: {sorted(unknown)}")
    settings = replace(settings, **{key: value for key, value in models.items() if value is not None})
    bad = [name for name in drafters if not is_safe_name(name)]
    if bad:
        raise ValueError(f"--drafter names must be plain names (letters, digits, _ . -), got {bad}")
    merged = {**dict(settings.drafters), **drafters}
    return replace(
        settings,
        host=host or settings.host,
        port=settings.port if port is None else port,
        drafters=tuple(merged.items()),
    )


def serve(
    host: str | None, port: int | None, drafters: Mapping[str, str], ui: bool = True, **models: str | None
) -> int:
    """Run the API (and, unless `ui` is False, the browser UI at `/`) on one port. `models`: verifier,
    device, dtype (see `serve_settings`)."""
    import uvicorn

    from sd2.devices import default_placement
    from service.app import create_app

    settings = serve_settings(host, port, drafters, **models)
    default_placement(settings.device, settings.dtype)  # refuse an unusable device before binding a port
    app = create_app(settings, mount_ui=ui)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info")
    return 0
