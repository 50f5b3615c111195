"""Stored bench results: `sd2 bench --store URL` over real HTTP into the SQLite file, read back by
the endpoints the UI uses; bad results refused with nothing written. The v1 → v2 migration that made
the benchmarks table: tests/service/test_migrations.py."""

from __future__ import annotations

import json
import socket
from dataclasses import replace

import pytest

from sd2.bench.store import StoreError, store_result
from sd2.cli import main
from service.app import create_app
from tests.service.conftest import count, live_server


def _bench(tiny_pair_dir, out, *extra: str) -> int:
    verifier_dir, drafter_dir = tiny_pair_dir
    args = ["bench", "--verifier", str(verifier_dir), "--drafter", f"d={drafter_dir}", "--quick"]
    args += ["--methods", "verifier", "d", "--prompt-sets", "demo", "--k", "2", "--max-prompts", "1"]
    return main([*args, "--max-new-tokens", "6", "--out", str(out), *extra])


@pytest.fixture(scope="module")
def bench_json(tiny_pair_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    assert _bench(tiny_pair_dir, out) == 0
    return json.loads((out / "bench.json").read_text())


def test_bench_store_round_trips_over_http(settings, tiny_pair_dir, tmp_path, capsys):
    app = create_app(replace(settings, max_body_bytes=1_000_000))
    with live_server(app) as url:
        out = tmp_path / "out"
        assert _bench(tiny_pair_dir, out, "--store", url, "--label", "tiny pair") == 0
        assert "stored as benchmark #1" in capsys.readouterr().out
        written = json.loads((out / "bench.json").read_text())
        import httpx

        page = httpx.get(f"{url}/benchmarks").json()
        (item,) = page["items"]
        assert page["total"] == 1 and item["label"] == "tiny pair" and item["methods"] == ["verifier", "d"]
        assert item["prompt_sets"] == ["demo"] and item["n_cells"] == len(written["cells"]) == 2
        detail = httpx.get(f"{url}/benchmarks/{item['id']}").json()
        assert detail["cells"] == written["cells"] and detail["best_k"] == written["best_k"]
        assert detail["measured_at"] == written["created_at"] and detail["command"] == written["command"]
        assert count(settings, "benchmarks") == 1  # read from the SQLite file itself
        assert httpx.delete(f"{url}/benchmarks/{item['id']}").status_code == 204
        assert httpx.get(f"{url}/benchmarks/{item['id']}").status_code == 404
        assert count(settings, "benchmarks") == 0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"schema": "other.bench"}, "schema"),
        ({"schema_version": 99}, "schema_version"),
        ({"cells": []}, "cells"),
        ({"cells": [{"method": "d"}]}, "cells"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_bad_result_is_refused_naming_the_field_and_nothing_is_written(
    client, settings, bench_json, change, field
):
    response = client.post("/benchmarks", json={**bench_json, **change})
    assert response.status_code == 422
    assert any(field in err["loc"] for err in response.json()["detail"]), response.json()
    assert count(settings, "benchmarks") == 0


def test_storing_needs_the_api_key_when_one_is_set(keyed_client, settings, bench_json):
    payload = {k: v for k, v in bench_json.items() if k != "generations"}
    for headers in ({}, {"X-API-Key": "wrong"}):
        assert keyed_client.post("/benchmarks", json=payload, headers=headers).status_code == 401
    assert count(settings, "benchmarks") == 0
    stored = keyed_client.post("/benchmarks", json=payload, headers={"X-API-Key": "s3cret"})
    assert stored.status_code == 201 and keyed_client.get("/benchmarks").json()["total"] == 1
    assert keyed_client.delete(f"/benchmarks/{stored.json()['id']}").status_code == 401


def test_store_errors_say_what_went_wrong(settings, bench_json):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(StoreError, match="cannot reach the sd2 service"):
        store_result(bench_json, f"http://127.0.0.1:{port}", timeout_s=5)
    keyed = create_app(replace(settings, api_key="s3cret", max_body_bytes=1_000_000))
    with (
        live_server(keyed) as url,
        pytest.raises(StoreError, match=r"refused the result: HTTP 401 header\.X-API-Key"),
    ):
        store_result(bench_json, url, api_key="wrong")
