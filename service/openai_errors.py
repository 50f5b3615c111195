"""Errors of the /v1 routes in OpenAI's shape, which OpenAI clients parse: `{"error": {"message", "type",
"param", "code"}}`, beside the house's `detail` list (service.errors), so `param` and `detail[].loc`
name the same field. The status, the headers (Retry-After) and the rest of the body stay the house's.

The app's own exception handlers decide every answer; `OpenAIRoute` only reshapes what they return for
its routes, so the rest of the API answers as before.
"""

from __future__ import annotations

import inspect
import json

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

REQUEST_PARTS = ("body", "query", "path", "header")  # a `loc` starting with one of these names a field


class OpenAIRoute(APIRoute):
    """An APIRoute whose error answers carry OpenAI's `error` object (for `APIRouter(route_class=...)`)."""

    def get_route_handler(self):
        handle = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handle(request)
            except Exception as err:
                house = _handler(request, err)
                if house is None:
                    raise
                response = house(request, err)
                return with_error_object(await response if inspect.isawaitable(response) else response)

        return route


def _handler(request: Request, err: Exception):
    """The app's exception handler for `err`, looked up by its class and then its bases, as Starlette does."""
    handlers = request.app.exception_handlers
    return next((handlers[cls] for cls in type(err).__mro__ if cls in handlers), None)


def with_error_object(response: Response) -> Response:
    """The house's JSON error answer with OpenAI's `error` object added."""
    try:
        body = json.loads(response.body)
    except (AttributeError, ValueError):
        return response  # not a JSON answer: nothing to add to
    if not isinstance(body, dict) or "error" in body:
        return response
    headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
    detail = body.get("detail")
    if not isinstance(detail, list) or not detail:  # FastAPI's own string, e.g. for a body not in UTF-8
        detail = [{"loc": [], "msg": str(detail), "type": "http_error"}]
    error = error_from_detail(detail, response.status_code)
    return JSONResponse(
        {"error": error, **body, "detail": detail}, status_code=response.status_code, headers=headers
    )


def error_object(message: str, status: int, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object; `type` follows from the status as OpenAI's own servers set it."""
    kind = (
        "rate_limit_error" if status == 429 else "server_error" if status >= 500 else "invalid_request_error"
    )
    return {"message": message, "type": kind, "param": param, "code": code}


def error_from_detail(detail: list[dict], status: int) -> dict:
    """OpenAI's error object for a house `detail`: the first item's field as `param`, its `type` as
    `code`, and every item's message (prefixed by its field when there are several)."""
    items = [(param_of(item.get("loc", [])), str(item.get("msg", ""))) for item in detail]
    if len(items) == 1:
        message = items[0][1]
    else:
        message = "; ".join(f"{param}: {msg}" if param else msg for param, msg in items)
    return error_object(message, status, param=items[0][0], code=detail[0].get("type"))


def param_of(loc: list) -> str | None:
    """A `loc` as OpenAI's `param`: ["body", "messages", 0, "content"] → "messages[0].content"; None
    when it names no request field (e.g. ["server", "generation_queue"])."""
    if len(loc) < 2 or loc[0] not in REQUEST_PARTS:
        return None
    param = str(loc[1])
    for part in loc[2:]:
        param += f"[{part}]" if isinstance(part, int) else f".{part}"
    return param
