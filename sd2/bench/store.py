"""Sending a finished bench result to a running sd2 service (POST /benchmarks), so the UI's History
and Theory views show it. Standard library only: the bench itself never needs the service."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping


class StoreError(RuntimeError):
    """The service could not be reached or refused the result; the message says which and why."""


def store_payload(data: Mapping, label: str | None = None) -> dict:
    """The bench JSON without its per-generation rows (the service keeps the aggregated cells)."""
    payload = {key: value for key, value in data.items() if key != "generations"}
    if label:
        payload["label"] = label
    return payload


def store_result(
    data: Mapping, base_url: str, api_key: str | None = None, label: str | None = None, timeout_s: float = 30
) -> dict:
    """POST the result to `base_url`/benchmarks; return the stored summary (its `id` included)."""
    url = base_url.rstrip("/") + "/benchmarks"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["X-API-Key"] = api_key
    body = json.dumps(store_payload(data, label)).encode()
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.load(response)
    except urllib.error.HTTPError as err:
        raise StoreError(
            f"the service at {base_url} refused the result: HTTP {err.code} {_detail(err)}"
        ) from err
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise StoreError(f"cannot reach the sd2 service at {base_url}: {reason}") from err


def _detail(err: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(err.read()).get("detail")
    except (ValueError, AttributeError):
        return err.reason
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    return str(detail)
