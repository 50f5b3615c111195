"""GET /runs (filters, pagination), export, DELETE with the API key, /stats."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest

from tests.service.conftest import PROMPT, count


@pytest.fixture
def three_runs(client) -> list[dict]:
    bodies = [
        {"prompt": PROMPT, "method": "verifier", "max_new_tokens": 5, "prompt_set": "chat"},
        {"prompt": PROMPT, "method": "tiny", "k": 2, "max_new_tokens": 7, "prompt_set": "chat"},
        {"prompt": "def add(a, b):", "method": "tiny", "k": 4, "max_new_tokens": 9, "prompt_set": "code"},
    ]
    return [client.post("/generate", json=b).json() for b in bodies]


def test_list_filter_and_paginate(client, three_runs):
    page = client.get("/runs").json()
    assert page["total"] == 3 and [r["id"] for r in page["items"]] == [
        r["run_id"] for r in reversed(three_runs)
    ]
    assert client.get("/runs", params={"method": "tiny"}).json()["total"] == 2
    assert client.get("/runs", params={"drafter": "tiny"}).json()["total"] == 2
    assert client.get("/runs", params={"method": "verifier"}).json()["items"][0]["drafter"] is None
    first, second = (client.get("/runs", params={"limit": 2, "offset": o}).json() for o in (0, 2))
    assert len(first["items"]) == 2 and len(second["items"]) == 1 and second["total"] == 3
    now = datetime.now(UTC)
    assert client.get("/runs", params={"since": (now - timedelta(hours=1)).isoformat()}).json()["total"] == 3
    assert client.get("/runs", params={"since": (now + timedelta(hours=1)).isoformat()}).json()["total"] == 0
    assert client.get("/runs", params={"until": (now - timedelta(hours=1)).isoformat()}).json()["total"] == 0


def test_export_json_and_csv(client, three_runs):
    run_id = three_runs[1]["run_id"]
    exported = client.get(f"/runs/{run_id}/export", params={"format": "json"})
    assert exported.headers["content-disposition"] == f'attachment; filename="run-{run_id}.json"'
    assert exported.json()["blocks"] == three_runs[1]["blocks"]
    response = client.get(f"/runs/{run_id}/export", params={"format": "csv"})
    assert response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    tokens = [
        t for b in three_runs[1]["blocks"] for t in [*b["drafts"], *([b["extra"]] if b["extra"] else [])]
    ]
    assert [int(r["token_id"]) for r in rows] == [t["token_id"] for t in tokens]
    assert [r["status"] for r in rows] == [t["status"] for t in tokens]
    assert client.get(f"/runs/{run_id}/export", params={"format": "../../etc/passwd"}).status_code == 422
    assert client.get(f"/runs/{run_id}/export", params={"format": "xml"}).status_code == 422


def test_stats_aggregate_per_method_and_prompt_set(client, three_runs):
    rows = {(r["method"], r["prompt_set"]): r for r in client.get("/stats").json()}
    assert set(rows) == {("verifier", "chat"), ("tiny", "chat"), ("tiny", "code")}
    assert rows[("verifier", "chat")]["tau"] == 1.0 and rows[("verifier", "chat")]["n_tokens"] == 5
    code = rows[("tiny", "code")]
    assert code["n_runs"] == 1 and code["tau"] == pytest.approx(three_runs[2]["metrics"]["tau"])
    assert code["acceptance_rate"] == pytest.approx(three_runs[2]["metrics"]["acceptance_rate"])


def test_delete_removes_the_run_and_its_trace(client, settings, three_runs):
    run_id = three_runs[1]["run_id"]
    assert client.delete(f"/runs/{run_id}").status_code == 204
    assert client.get(f"/runs/{run_id}").status_code == 404
    assert client.delete(f"/runs/{run_id}").status_code == 404
    assert count(settings, "token_events", "run_id = ?", (run_id,)) == 0
    assert count(settings, "blocks", "run_id = ?", (run_id,)) == 0
    assert count(settings, "runs") == 2


def test_mutating_endpoints_require_the_api_key_when_set(keyed_client, settings):
    run = keyed_client.post(
        "/generate", json={"prompt": PROMPT, "max_new_tokens": 3}
    ).json()  # reads/decodes: open
    for headers in ({}, {"X-API-Key": "wrong"}):
        response = keyed_client.delete(f"/runs/{run['run_id']}", headers=headers)
        assert response.status_code == 401 and response.json()["detail"][0]["loc"] == ["header", "X-API-Key"]
        train = {"name": "x1", "base_drafter": "tiny", "steps": 1}
        assert keyed_client.post("/train", json=train, headers=headers).status_code == 401
        assert keyed_client.post("/train/1/cancel", headers=headers).status_code == 401
    assert count(settings, "runs") == 1 and count(settings, "training_jobs") == 0
    assert keyed_client.delete(f"/runs/{run['run_id']}", headers={"X-API-Key": "s3cret"}).status_code == 204
