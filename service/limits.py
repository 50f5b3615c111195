"""Request limits answered in the same JSON shape as every other 4xx: a body-size limit (413) and a
method check (405) for the API's paths.

A declared oversize Content-Length is refused before the body is read; a body without one (chunked)
is counted as it arrives, and the read that crosses the limit raises an HTTPException, which FastAPI
passes on unchanged to its JSON exception handler. (FastAPI's own `max_body_size` answers in plain text.)
"""

from __future__ import annotations

import json
import re

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


async def send_json_error(send: Send, status: int, detail: list[dict], headers: tuple = ()) -> None:
    """Answer from ASGI middleware, before routing: `{"detail": [...]}` with `status` (+ `headers`)."""
    body = json.dumps({"detail": detail}).encode()
    reply = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": reply})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def _detail(self, size: str) -> list[dict]:
        return [
            {
                "loc": ["body"],
                "msg": f"the request body ({size} bytes) exceeds {self.max_bytes}",
                "type": "too_large",
            }
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and not (declared.isdigit() and int(declared) <= self.max_bytes):
            await send_json_error(send, 413, self._detail(declared.decode(errors="replace")))
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if received > self.max_bytes:
                raise HTTPException(413, detail=self._detail(f"over {self.max_bytes}"))
            return message

        await self.app(scope, counting_receive, send)


class MethodCheck:
    """405 (with `Allow`) for a known API path asked with a method it does not take. Without it, once the
    UI is mounted at `/`, `GET /generate` would fall through to the UI's 404."""

    def __init__(self, app: ASGIApp, routes: list[tuple[re.Pattern, frozenset[str]]]):
        self.app, self.routes = app, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        allowed = {m for pattern, methods in self.routes if pattern.match(scope["path"]) for m in methods}
        if "GET" in allowed:
            allowed.add("HEAD")
        if not allowed or scope["method"] in allowed:
            await self.app(scope, receive, send)
            return
        allow = ", ".join(sorted(allowed))
        message = f"{scope['method']} is not allowed on {scope['path']}; use {allow}"
        detail = [{"loc": ["method"], "msg": message, "type": "method_not_allowed"}]
        await send_json_error(send, 405, detail, ((b"allow", allow.encode()),))
