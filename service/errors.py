"""Error responses. Every 4xx names the field it is about, in FastAPI's own validation shape:
`{"detail": [{"loc": ["body", "<field>"], "msg": "...", "type": "..."}]}`."""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from sd2.errors import InvalidValue
from service.admission import Busy


class FieldError(Exception):
    """A request value the service refuses, raised before anything is written."""

    def __init__(self, field: str, message: str, status_code: int = 422, where: str = "body"):
        super().__init__(message)
        self.field, self.message, self.status_code, self.where = field, message, status_code, where

    def detail(self) -> list[dict]:
        return [{"loc": [self.where, self.field], "msg": self.message, "type": "value_error"}]


def from_invalid(err: InvalidValue) -> FieldError:
    """sd2's refusal of a request value, at the field it names (`InvalidValue.field`)."""
    return FieldError(err.field, str(err))


def store_failure(err: SQLAlchemyError) -> str:
    """What a client may read of a database failure: the driver's own first line ("database is locked",
    "database or disk is full"), never the SQL statement, its parameters or a library URL."""
    cause = getattr(err, "orig", None) or err
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return f"the database is unavailable: {first}"


def public_error(err: BaseException) -> str:
    """An exception as an error line for clients (a streamed run's last line, a failed run's error)."""
    if isinstance(err, SQLAlchemyError):
        return store_failure(err)
    return f"{type(err).__name__}: {err}"


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(SQLAlchemyError)
    async def _store_failed(_request: Request, err: SQLAlchemyError) -> JSONResponse:
        detail = [{"loc": ["server", "database"], "msg": store_failure(err), "type": "store_unavailable"}]
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(Busy)
    async def _busy(_request: Request, err: Busy) -> JSONResponse:
        return JSONResponse(
            {"detail": err.detail()}, status_code=429, headers={"Retry-After": str(err.retry_after_s)}
        )

    @app.exception_handler(FieldError)
    async def _field_error(_request: Request, err: FieldError) -> JSONResponse:
        return JSONResponse({"detail": err.detail()}, status_code=err.status_code)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"detail": listed_detail(err.status_code, err.detail)},
            status_code=err.status_code,
            headers=getattr(err, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": json_safe(err.errors())}, status_code=422)


def listed_detail(status_code: int, detail: Any) -> list[dict]:
    """An HTTP error's detail in the house shape. Ours are lists already; Starlette's and FastAPI's own
    are strings ("Not Found", "There was an error parsing the body" for a body not in UTF-8), put at
    the path (404) or the body (400) they are about."""
    if isinstance(detail, list):
        return detail
    where = {400: ["body"], 404: ["path"], 405: ["method"]}.get(status_code, [])
    return [{"loc": where, "msg": str(detail), "type": "http_error"}]


def json_safe(value: Any) -> Any:
    """A validation error's detail made encodable: it echoes the input, which may hold what JSON cannot
    carry — NaN / Infinity (Python's parser accepts them, 1e999 overflows to inf) or a lone surrogate
    ("\\ud800" is valid JSON, not Unicode text). Those become their repr; everything else is kept."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, int | bool) or value is None:
        return value
    return json_safe(str(value))  # e.g. an exception object in ctx


# Responses any operation may give, documented on each (service.app.document_common_responses).
COMMON_RESPONSES = {
    400: "the Host header is not served here (DNS-rebinding guard; SD2_ALLOWED_HOSTS)",
    503: "the database cannot be read or written now; retry after `Retry-After` seconds",
}
BODY_RESPONSES = {413: "the request body is over SD2_MAX_BODY_BYTES"}
PATH_RESPONSES = {404: "no such id (its parameter is in `detail[].loc`)"}


def document_common_responses(router: APIRouter, model: type) -> None:
    """Add the responses every operation can give to each one's OpenAPI entry (before the router is
    included): 400 and 503 always, 413 where a body is read, 404 where the path names an id; `model`
    is the error body's schema."""
    for route in router.routes:
        if not isinstance(route, APIRoute):
            continue
        extra = dict(COMMON_RESPONSES)
        if route.body_field is not None:
            extra.update(BODY_RESPONSES)
        if "{" in route.path:
            extra.update(PATH_RESPONSES)
        for status, description in extra.items():
            route.responses.setdefault(status, {"model": model, "description": description})


def not_found(parameter: str, message: str) -> HTTPException:
    """A 404 in the API's usual `detail[].loc` shape, naming the path parameter that matched nothing."""
    return HTTPException(404, detail=[{"loc": ["path", parameter], "msg": message, "type": "not_found"}])
