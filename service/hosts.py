"""Host-header check against DNS rebinding: a server on loopback answers only requests addressed to a
loopback name, so a web page whose domain was re-pointed at 127.0.0.1 cannot read stored prompts,
train or delete through the victim's browser. Any other Host gets a 400 in the API's JSON shape.

A server bound elsewhere (e.g. 0.0.0.0 in a container, reached as `backend:8000`) accepts any Host
unless SD2_ALLOWED_HOSTS names them.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from service.limits import send_json_error

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def host_name(header: str) -> str:
    """The name of a Host header without its port: "[::1]:8000" → "::1", "Localhost:80" → "localhost"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def allowed_hosts(bind_host: str, configured: tuple[str, ...]) -> frozenset[str] | None:
    """The Host names to serve: the configured ones; else the loopback names when bound to loopback;
    else None (any)."""
    if configured:
        return frozenset(host_name(h) for h in configured)
    return LOOPBACK_NAMES if host_name(bind_host) in LOOPBACK_NAMES else None


class HostCheck:
    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.allowed is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        if host_name(header) in self.allowed:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        message = f"host {header!r} is not served here; set SD2_ALLOWED_HOSTS to allow it"
        await send_json_error(send, 400, [{"loc": ["header", "Host"], "msg": message, "type": "host"}])
