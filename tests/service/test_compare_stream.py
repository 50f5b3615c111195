"""POST /compare with stream: true — each method's blocks as it decodes, its result as it ends, then the
stored comparison; the same runs as the plain answer, and a client that leaves stops the rest."""

from __future__ import annotations

import json
import time

import httpx

from service.app import create_app
from tests.service.conftest import PROMPT, SlowEngine, count, live_server

METHODS = ["verifier", "tiny", "self"]
BODY = {"prompt": PROMPT, "methods": METHODS, "k": 4, "max_new_tokens": 24, "seed": 5}


def _events(client, body: dict) -> list[dict]:
    with client.stream("POST", "/compare", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in response.iter_lines() if line]


def test_each_method_streams_in_turn_and_ends_as_the_plain_comparison(client, settings):
    events = _events(client, BODY)
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "summary" and kinds.count("summary") == 1
    assert [e["method"] for e in events if e["event"] == "method"] == METHODS
    # In order: a method's start, its blocks, its result — and only then the next method's start.
    order = [(e["event"], e.get("index")) for e in events[:-1] if e["event"] != "block"]
    assert order == [(kind, i) for i in range(len(METHODS)) for kind in ("method", "result")]
    for event in events[:-1]:
        assert METHODS[event["index"]] == event["method"]
    results = [e for e in events if e["event"] == "result"]
    assert all(r["status"] == "succeeded" and "blocks" not in r for r in results)
    assert len({tuple(r["token_ids"]) for r in results}) == 1  # T = 0: the verifier's text for every method

    summary = events[-1]
    assert summary["status"] == "succeeded" and len(summary["run_ids"]) == len(METHODS)
    for index, run_id in enumerate(summary["run_ids"]):
        stored = client.get(f"/runs/{run_id}").json()
        streamed = [e["block"] for e in events if e["event"] == "block" and e["index"] == index]
        assert stored["blocks"] == streamed and stored["method"] == METHODS[index]
        assert stored["token_ids"] == results[index]["token_ids"]
        assert results[index]["metrics"]["n_tokens"] == sum(b["n_emitted"] for b in streamed)

    plain = client.post("/compare", json=BODY).json()
    assert [r["token_ids"] for r in plain["results"]] == [r["token_ids"] for r in results]
    assert [r["metrics"]["tau"] for r in plain["results"]] == [r["metrics"]["tau"] for r in results]
    assert count(settings, "comparisons") == 2 and count(settings, "runs") == 2 * len(METHODS)


def test_a_client_that_leaves_mid_comparison_stops_it_and_keeps_what_started(settings, tiny_pair_dir):
    verifier_dir, drafter_dir = tiny_pair_dir
    engine = SlowEngine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu")
    body = {**BODY, "max_new_tokens": 200, "stream": True}
    with (
        live_server(create_app(settings, engine=engine)) as url,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        with http.stream("POST", "/compare", json=body) as response:
            lines = response.iter_lines()
            assert json.loads(next(lines))["event"] == "method"
            assert json.loads(next(lines))["event"] == "block"
        # Gone during the first method's ~200 blocks: it stops at a block, the others never start.
        deadline = time.time() + 10
        while count(settings, "comparisons") == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert count(settings, "comparisons") == 1
        assert count(settings, "runs") == 1 and count(settings, "runs", "status = 'cancelled'") == 1
        assert count(settings, "blocks") == 0
        assert http.get("/ready").json()["status"] == "ready"
        again = http.post("/compare", json={**BODY, "max_new_tokens": 3})
        assert again.status_code == 200 and len(again.json()["results"]) == len(METHODS)


def test_a_refused_streamed_comparison_is_a_json_error_and_writes_nothing(client, settings):
    response = client.post("/compare", json={**BODY, "methods": ["verifier", "nope"], "stream": True})
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/json")
    assert count(settings, "runs") == 0 and count(settings, "comparisons") == 0
