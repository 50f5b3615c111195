"""`sd2 ui --api URL`: the UI alone, talking to a running sd2 service (docker-compose's frontend)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

DEFAULT_API = "http://127.0.0.1:8000"


def offline_env() -> None:
    """No analytics pings, no hub look-ups: the UI works fully offline (docs/embedded.md#gotchas)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--api",
        default=os.environ.get("SD2_API_URL", DEFAULT_API),
        help="base URL of the sd2 REST service (default: $SD2_API_URL or %(default)s)",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address of the UI (default: %(default)s)")
    p.add_argument("--port", type=int, default=7860, help="UI port (default: %(default)s)")


def run_ui(api: str, host: str, port: int) -> int:
    """Serve the UI (blocking). An API key for mutating calls may come from $SD2_API_KEY."""
    offline_env()
    from app.client import ApiClient  # gradio is imported only when the UI really starts
    from app.theme import launch_kwargs
    from app.ui import build_ui

    client = ApiClient(api, api_key=os.environ.get("SD2_API_KEY") or None)
    build_ui(client).queue().launch(server_name=host, server_port=port, share=False, **launch_kwargs())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app", description="The sd2 browser UI.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_ui(args.api, args.host, args.port)
