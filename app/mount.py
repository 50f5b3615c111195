"""Mount the UI at `/` of the service's FastAPI app, so one port serves both (`sd2 serve`).

The API's routes are registered before the mount, and Starlette matches routes in order, so
/generate, /runs, /docs … keep answering; everything else falls through to the UI.
"""

from __future__ import annotations

import json

from fastapi import FastAPI

from app.cli import offline_env


def loopback_url(host: str, port: int) -> str:
    """How the UI's server-side client reaches its own service: wildcard binds via loopback."""
    if host in ("0.0.0.0", "", "127.0.0.1", "localhost"):
        return f"http://127.0.0.1:{port}"
    if host in ("::", "::1"):
        return f"http://[::1]:{port}"
    return f"http://{host}:{port}"


class NoUploads:
    """Refuse Gradio's file-upload endpoint: the UI has no upload control, and Gradio would otherwise
    let anyone write files into the temp folder without the API key, unbounded and never cleaned."""

    def __init__(self, app, prefix: str):
        self.app, self.paths = app, {f"{prefix}gradio_api/upload", f"{prefix}upload"}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") in self.paths:
            detail = [{"loc": ["path"], "msg": "this server takes no file uploads", "type": "not_found"}]
            body = json.dumps({"detail": detail}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 404, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def mount_ui(api: FastAPI, host: str, port: int, path: str = "/") -> FastAPI:
    """Add the Gradio UI to `api` at `path`; its client calls the same server over HTTP. Gradio's
    upload endpoint is refused (`NoUploads`)."""
    offline_env()
    import gradio as gr

    from app.client import ApiClient
    from app.theme import launch_kwargs
    from app.ui import build_ui

    blocks = build_ui(ApiClient(loopback_url(host, port)), docs_url="/docs").queue()
    mounted = gr.mount_gradio_app(api, blocks, path=path, **launch_kwargs())
    mounted.add_middleware(NoUploads, prefix=path if path.endswith("/") else f"{path}/")
    return mounted
