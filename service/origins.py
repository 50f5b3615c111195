"""Cross-origin policy: which other web origins' pages may call this server from a browser.

None by default. The API needs no cross-origin access (the UI is served from the same origin, and
tools call it outside a browser), and the mounted Gradio UI would otherwise apply its own policy,
which lets any page on a localhost origin call the UI's endpoints — which run generations and read
every stored prompt — with credentials. Gradio steps aside when the app configures Starlette's
CORSMiddleware, so this installs one for the whole server, UI included: SD2_CORS_ORIGINS lists the
origins allowed (no credentials: the API key is a header, sent explicitly).
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

ALLOWED_METHODS = ("GET", "POST", "DELETE")
ALLOWED_HEADERS = ("content-type", "x-api-key")


def install_cross_origin_policy(app: FastAPI, origins: tuple[str, ...]) -> None:
    """Answer cross-origin requests from `origins` only (exact origins such as
    "https://tool.example:8443"; empty: none), for the API and anything mounted on `app`."""
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(origins),
        allow_methods=list(ALLOWED_METHODS),
        allow_headers=list(ALLOWED_HEADERS),
        allow_credentials=False,
        expose_headers=["retry-after"],
    )
