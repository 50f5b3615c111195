"""A small synchronous client over the sd2 REST API (the only way the UI reaches the backend).

Every non-2xx answer raises `ApiError` carrying the API's own message, with the offending field
named ("k: Input should be greater than or equal to 1"), so the UI can show it as is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

# Decoding waits on the server's model lock; a long queue is normal, a dead server is not.
TIMEOUT = httpx.Timeout(connect=5.0, read=600.0, write=30.0, pool=30.0)


class ApiError(Exception):
    """A request the API refused or could not serve; `message` is what the UI shows."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.message, self.status_code = message, status_code


def error_message(body: Any, status_code: int | None = None) -> str:
    """The API's `detail` (FastAPI shape: a string or a list of {loc, msg}) as one readable line."""
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):
        return "; ".join(_one_error(item) for item in detail) or f"HTTP {status_code}"
    if isinstance(detail, str) and detail:
        return detail
    return f"HTTP {status_code}: {json.dumps(body)[:300]}"


def _one_error(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    loc = [str(part) for part in item.get("loc", []) if part not in ("body", "query", "path", "header")]
    msg = str(item.get("msg", "invalid")).removeprefix("Value error, ")
    field = ".".join(loc)
    return (
        msg if not field or msg.startswith(f"{field}:") or msg.startswith(f"{field} ") else f"{field}: {msg}"
    )


class ApiClient:
    """Methods mirror the endpoints; JSON in, JSON (dicts) out."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: httpx.Timeout = TIMEOUT):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    # --- plumbing -------------------------------------------------------------------------------
    def _request(self, method: str, path: str, api_key: str | None = None, **kwargs) -> httpx.Response:
        headers = self._key_header(api_key)
        try:
            response = self._http.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as err:
            raise ApiError(f"cannot reach the sd2 API at {self.base_url}: {err}") from err
        if response.status_code >= 400:
            raise ApiError(error_message(_json_or_text(response), response.status_code), response.status_code)
        return response

    def _key_header(self, api_key: str | None) -> dict[str, str]:
        key = api_key or self.api_key
        return {"X-API-Key": key} if key else {}

    def _stream_lines(self, method: str, path: str, **kwargs) -> Iterator[dict]:
        try:
            with self._http.stream(method, path, **kwargs) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ApiError(
                        error_message(_json_or_text(response), response.status_code), response.status_code
                    )
                for line in response.iter_lines():
                    if line.strip():
                        yield json.loads(line)
        except httpx.HTTPError as err:
            raise ApiError(f"lost the connection to the sd2 API at {self.base_url}: {err}") from err

    # --- decoding -------------------------------------------------------------------------------
    def generate(self, body: dict) -> dict:
        """POST /generate without streaming: the whole result (docs/trace.md#a-generation) plus run_id."""
        return self._request("POST", "/generate", json={**body, "stream": False}).json()

    def generate_stream(self, body: dict) -> Iterator[dict]:
        """POST /generate with stream=true: `{"event": "block", ...}` per block, then the summary.

        An `{"event": "error"}` line (the run failed after it started) raises ApiError.
        Closing the iterator early closes the connection, and the server cancels the run.
        """
        for event in self._stream_lines("POST", "/generate", json={**body, "stream": True}):
            if event.get("event") == "error":
                raise ApiError(f"the run {event.get('status', 'failed')}: {event.get('error')}")
            yield event

    def compare(self, body: dict) -> dict:
        return self._request("POST", "/compare", json={**body, "stream": False}).json()

    def compare_stream(self, body: dict) -> Iterator[dict]:
        """POST /compare with stream=true: per method a `method` line, its `block` lines and its
        `result`, then the `summary` (docs/interfaces.md). An `error` line raises ApiError; closing the
        iterator early closes the connection, and the server stops the comparison."""
        for event in self._stream_lines("POST", "/compare", json={**body, "stream": True}):
            if event.get("event") == "error":
                raise ApiError(f"the comparison {event.get('status', 'failed')}: {event.get('error')}")
            yield event

    # --- stored runs ----------------------------------------------------------------------------
    def runs(self, **filters: Any) -> dict:
        params = {k: v for k, v in filters.items() if v not in (None, "")}
        return self._request("GET", "/runs", params=params).json()

    def run(self, run_id: int) -> dict:
        return self._request("GET", f"/runs/{int(run_id)}").json()

    def export(self, run_id: int, fmt: str = "json") -> bytes:
        return self._request("GET", f"/runs/{int(run_id)}/export", params={"format": fmt}).content

    def delete(self, run_id: int, api_key: str | None = None) -> None:
        self._request("DELETE", f"/runs/{int(run_id)}", api_key=api_key)

    def stats(self) -> list[dict]:
        return self._request("GET", "/stats").json()

    # --- stored benchmark results (sd2 bench --store) -------------------------------------------
    def benchmarks(self, limit: int = 50) -> dict:
        return self._request("GET", "/benchmarks", params={"limit": limit}).json()

    def benchmark(self, benchmark_id: int) -> dict:
        return self._request("GET", f"/benchmarks/{int(benchmark_id)}").json()

    # --- server ---------------------------------------------------------------------------------
    def drafters(self) -> list[dict]:
        return self._request("GET", "/drafters").json()

    def health(self) -> dict:
        return self._request("GET", "/health").json()

    def version(self) -> dict:
        return self._request("GET", "/version").json()

    def defaults(self) -> dict:
        """The decode settings the API gives omitted fields, and this server's max_new_tokens cap."""
        return self._request("GET", "/defaults").json()

    # --- training -------------------------------------------------------------------------------
    def train(self, body: dict, api_key: str | None = None) -> dict:
        return self._request("POST", "/train", api_key=api_key, json=body).json()

    def train_status(self, job_id: int) -> dict:
        return self._request("GET", f"/train/{int(job_id)}").json()

    def train_stream(self, job_id: int) -> Iterator[dict]:
        """GET /train/{id}/stream: one dict per status/progress change with its new metric points."""
        yield from self._stream_lines("GET", f"/train/{int(job_id)}/stream")

    def cancel(self, job_id: int, api_key: str | None = None) -> dict:
        return self._request("POST", f"/train/{int(job_id)}/cancel", api_key=api_key).json()


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text.strip() or f"HTTP {response.status_code}"
