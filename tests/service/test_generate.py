"""POST /generate and /compare over HTTP, checked against what lands in the SQLite file."""

from __future__ import annotations

import json
import sqlite3

from service.schemas import BlockOut, GenerationOut
from tests.service.conftest import PROMPT, count, db_path

# the tiny random pair then rejects some drafts in 40 tokens (3 with sd2.sampling's inversion draws)
SAMPLED = {"temperature": 1.0, "seed": 4}


def test_generate_returns_design_json_and_stores_exactly_it(client, settings):
    body = {"prompt": PROMPT, "method": "tiny", "k": 4, "max_new_tokens": 40, **SAMPLED}
    response = client.post("/generate", json=body)
    assert response.status_code == 200
    data = response.json()
    assert set(data) == set(GenerationOut.model_fields)  # the fields of docs/trace.md + run_id
    GenerationOut.model_validate(data)
    assert data["method"] == "tiny" and data["config"]["k"] == 4
    assert data["token_ids"] == [t["token_id"] for b in data["blocks"] for t in _emitted(b)]
    assert data["metrics"]["n_tokens"] == len(data["token_ids"]) == 40

    stored = client.get(f"/runs/{data['run_id']}").json()
    assert stored["status"] == "succeeded"
    assert stored["blocks"] == data["blocks"]  # every token, status, probability and timing
    assert stored["metrics"] == data["metrics"] and stored["token_ids"] == data["token_ids"]
    assert stored["text"] == data["text"] and stored["prompt"] == PROMPT
    assert stored["precision"] == data["precision"] == client.get("/health").json()["device"]  # "cpu/bf16"

    # The raw file agrees, independently of the service's read path.
    n_events = sum(len(b["drafts"]) + (b["extra"] is not None) for b in data["blocks"])
    assert count(settings, "blocks", "run_id = ?", (data["run_id"],)) == len(data["blocks"])
    assert count(settings, "token_events", "run_id = ?", (data["run_id"],)) == n_events
    with sqlite3.connect(db_path(settings)) as conn:
        statuses = conn.execute(
            "SELECT status, COUNT(*) FROM token_events WHERE run_id = ? GROUP BY status", (data["run_id"],)
        ).fetchall()
        tau = conn.execute("SELECT tau FROM runs WHERE id = ?", (data["run_id"],)).fetchone()[0]
    expected = {}
    for block in data["blocks"]:
        for token in [*block["drafts"], *([block["extra"]] if block["extra"] else [])]:
            expected[token["status"]] = expected.get(token["status"], 0) + 1
    assert dict(statuses) == expected
    assert "rejected" in expected  # the sampled tiny pair really exercised rejection
    assert tau == data["metrics"]["tau"]


def _emitted(block: dict) -> list[dict]:
    return [t for t in block["drafts"] if t["status"] == "accepted"] + (
        [block["extra"]] if block["extra"] else []
    )


def test_stream_yields_one_line_per_block_then_a_summary_matching_their_sum(client, settings):
    body = {"prompt": PROMPT, "method": "tiny", "k": 3, "max_new_tokens": 30, "stream": True, **SAMPLED}
    with client.stream("POST", "/generate", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.iter_lines() if line]
    *block_lines, summary = lines
    assert [line["event"] for line in block_lines] == ["block"] * len(block_lines)
    assert summary["event"] == "summary" and summary["status"] == "succeeded" and "blocks" not in summary
    blocks = [BlockOut.model_validate(line["block"]).model_dump() for line in block_lines]
    assert [b["index"] for b in blocks] == list(range(len(blocks)))

    metrics = summary["metrics"]
    judged = [b for b in blocks if b["kind"] == "speculative" and b["complete"]]
    assert metrics["n_tokens"] == sum(b["n_emitted"] for b in blocks) == len(summary["token_ids"])
    assert metrics["n_blocks"] == sum(b["kind"] != "prefill" for b in blocks)
    assert metrics["accepted"] == sum(b["n_accepted"] for b in judged)
    assert metrics["drafted"] == sum(b["k"] for b in judged)
    assert summary["token_ids"] == [t["token_id"] for b in blocks for t in _emitted(b)]

    stored = client.get(f"/runs/{summary['run_id']}").json()
    assert stored["blocks"] == [line["block"] for line in block_lines]
    assert count(settings, "runs") == 1


def test_chat_messages_and_greedy_self_drafting(client):
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    data = client.post("/generate", json={**body, "method": "self", "k": 4, "max_new_tokens": 21}).json()
    # The verifier drafting for itself at T = 0 accepts every draft: τ = k + 1 on complete blocks.
    assert data["metrics"]["tau"] == 5.0 and data["metrics"]["acceptance_rate"] == 1.0
    run = client.get(f"/runs/{data['run_id']}").json()
    assert run["messages"] == body["messages"] and run["prompt"] is None and run["drafter"] is None


def test_compare_same_greedy_text_different_methods_one_comparison(client, settings):
    body = {"prompt": PROMPT, "methods": ["verifier", "tiny", "self"], "k": 4, "max_new_tokens": 24}
    response = client.post("/compare", json=body)
    assert response.status_code == 200
    data = response.json()
    results = data["results"]
    assert [r["method"] for r in results] == body["methods"]
    assert len({tuple(r["token_ids"]) for r in results}) == 1  # lossless: T = 0 gives the verifier's text
    assert results[0]["metrics"]["tau"] == 1.0 and results[2]["metrics"]["tau"] == 5.0
    with sqlite3.connect(db_path(settings)) as conn:
        rows = conn.execute("SELECT id, comparison_id FROM runs ORDER BY id").fetchall()
    assert rows == [(r["run_id"], data["comparison_id"]) for r in results]
    assert count(settings, "comparisons") == 1


def test_auto_k_and_a_draft_threshold_are_run_recorded_and_stored(client, settings):
    body = {"prompt": PROMPT, "method": "tiny", "k": "auto", "draft_threshold": 0.3, "max_new_tokens": 30}
    data = client.post("/generate", json=body).json()
    assert data["config"]["k"] == "auto" and data["config"]["draft_threshold"] == 0.3
    speculative = [b for b in data["blocks"] if b["kind"] == "speculative"]
    assert speculative and all(b["draft_stop"] in ("k", "confidence", "length") for b in speculative)
    assert all(b["draft_stop"] is None for b in data["blocks"] if b["kind"] == "prefill")
    assert client.get(f"/runs/{data['run_id']}").json()["blocks"] == data["blocks"]
    with sqlite3.connect(db_path(settings)) as conn:
        stored = conn.execute(
            'SELECT draft_stop FROM blocks WHERE run_id = ? ORDER BY "index"', (data["run_id"],)
        ).fetchall()
    assert [row[0] for row in stored] == [b["draft_stop"] for b in data["blocks"]]
