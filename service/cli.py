"""`sd2 serve`: the service under uvicorn (the `serve` subcommand of sd2.cli delegates here)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from service.settings import Settings, is_safe_name


def serve_settings(
    host: str | None, port: int | None, drafters: Mapping[str, str], env: Mapping[str, str] | None = None
) -> Settings:
    """Environment settings with the command line's host, port and extra drafters on top."""
    settings = Settings.from_env(os.environ if env is None else env)
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


def serve(host: str | None, port: int | None, drafters: Mapping[str, str], ui: bool = True) -> int:
    """Run the API (and, unless `ui` is False, the browser UI at `/`) on one port."""
    import uvicorn

    from service.app import create_app

    settings = serve_settings(host, port, drafters)
    app = create_app(settings, mount_ui=ui)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info")
    return 0
