"""Counting and timing every HTTP request (`sd2_http_requests_total`, `sd2_http_request_duration_seconds`)
as pure ASGI middleware, so a streamed response is timed to its last chunk, not to its headers.

Labels stay few whatever clients send: `route` is the route's template (`/runs/{run_id}`, never the raw
path), the API route a request answered before routing was for (a 405, a declared oversize body), or
"unmatched"; `method` is one of the HTTP methods the API knows, or "other".
"""

from __future__ import annotations

import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import ServiceMetrics

UNMATCHED = "unmatched"
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_label(scope: Scope, templates: list[tuple[re.Pattern, str]]) -> str:
    """The template of the route that took the request (Starlette's router puts it in the scope), else
    of the API route whose pattern the path matches (answered before routing), else UNMATCHED."""
    template = getattr(scope.get("route"), "path", "")  # a Mount at "/" has the empty path
    if template:
        return template
    return next((t for pattern, t in templates if pattern.match(scope["path"])), UNMATCHED)


class HttpMetrics:
    """Outermost middleware: every answer counts, the Host check's and the method check's included.
    `templates`: (path pattern, path template) of the API's routes."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics, templates: list[tuple[re.Pattern, str]]):
        self.app, self.metrics, self.templates = app, metrics, templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status, recorded = time.perf_counter(), 500, False  # 500: no answer began (it raised)

        def record() -> None:
            nonlocal recorded
            if recorded:
                return
            recorded = True
            method = scope["method"] if scope["method"] in KNOWN_METHODS else "other"
            route = route_label(scope, self.templates)
            self.metrics.http_requests.labels(method, route, str(status)).inc()
            self.metrics.http_duration.labels(method, route).observe(time.perf_counter() - started)

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                record()  # the body is done; background work after it is not the client's wait

        try:
            await self.app(scope, receive, timed_send)
        finally:
            record()  # a response that never finished (the client left, or it raised)
