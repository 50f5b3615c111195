"""Mount the UI at `/` of the service's FastAPI app, so one port serves both (`sd2 serve`).

The API's routes are registered before the mount, and Starlette matches routes in order, so
/generate, /runs, /docs … keep answering; everything else falls through to the UI.
"""

from __future__ import annotations

from fastapi import FastAPI

from app.cli import offline_env


def loopback_url(host: str, port: int) -> str:
    """How the UI's server-side client reaches its own service: wildcard binds via loopback."""
    if host in ("0.0.0.0", "", "127.0.0.1", "localhost"):
        return f"http://127.0.0.1:{port}"
    if host in ("::", "::1"):
        return f"http://[::1]:{port}"
    return f"http://{host}:{port}"


def mount_ui(api: FastAPI, host: str, port: int, path: str = "/") -> FastAPI:
    """Add the Gradio UI to `api` at `path`; its client calls the same server over HTTP."""
    offline_env()
    import gradio as gr

    from app.client import ApiClient
    from app.theme import launch_kwargs
    from app.ui import build_ui

    blocks = build_ui(ApiClient(loopback_url(host, port)), docs_url="/docs").queue()
    return gr.mount_gradio_app(api, blocks, path=path, **launch_kwargs())
