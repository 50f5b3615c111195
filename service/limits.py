"""A request-body size limit that answers 413 in the same JSON shape as every other 4xx.

A declared oversize Content-Length is refused before the body is read; a body without one (chunked)
is counted as it arrives, and the read that crosses the limit raises an HTTPException, which FastAPI
passes on unchanged to its JSON exception handler. (FastAPI's own `max_body_size` answers in plain text.)
"""

from __future__ import annotations

import json

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


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
            body = json.dumps({"detail": self._detail(declared.decode(errors="replace"))}).encode()
            reply = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 413, "headers": reply})
            await send({"type": "http.response.body", "body": body})
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
