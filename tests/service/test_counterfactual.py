"""The unsteered counterfactual through the service (`counterfactual: true`, docs/trace.md): on the real
embedded verifier with the shipped, steered `sd2` drafter, every route takes the field, a steered run's
blocks carry the record and its metrics the steering gain, the store gives them back whole (SQLite, and
PostgreSQL with SD2_TEST_POSTGRES_URL), the CSV export lists them, and /metrics counts the outcomes."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from sd2.engine import Engine
from service.app import create_app
from service.schemas import GenerationOut
from service.settings import Settings
from tests.service.conftest import LOOPBACK
from tests.service.test_metrics import scrape, total, value

pytestmark = pytest.mark.slow
PROMPT = "Why is the sky blue? Answer in one sentence."
SETTINGS = {"prompt": PROMPT, "k": 4, "max_new_tokens": 12, "temperature": 0}
STEERED = {**SETTINGS, "method": "sd2"}
OUTCOMES = ("won", "tied", "lost")


@pytest.fixture(scope="module")
def engine() -> Engine:
    """The embedded verifier with the shipped drafters (`sd2` has a steering head), loaded once."""
    return Engine.load(device="cpu")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_settings(request, settings: Settings) -> Settings:
    """The app's settings on a new SQLite file, or on a fresh PostgreSQL database (skipped without)."""
    settings = replace(settings, verifier=None, drafters=())
    if request.param == "sqlite":
        return settings
    return replace(settings, database_url=request.getfixturevalue("postgres_url"))


@pytest.fixture
def embedded(engine: Engine, settings: Settings) -> Iterator[TestClient]:
    app = create_app(replace(settings, verifier=None, drafters=()), engine=engine)
    with TestClient(app, base_url=LOOPBACK) as client:
        yield client


def _post(client: TestClient, path: str, body: dict) -> dict:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _speculative(blocks: list[dict]) -> list[dict]:
    return [b for b in blocks if b["kind"] == "speculative"]


def _check_records(run: dict) -> None:
    """Every speculative block of a steered T = 0 run that drafted (the length limit can leave none to
    draft) has a counterfactual as long as its own draft, judged exactly; the run's steering gain
    summarises exactly those records."""
    blocks = [b for b in run["blocks"] if b["counterfactual"] is not None]
    assert blocks == [b for b in _speculative(run["blocks"]) if b["k"] > 0] and blocks
    for block in blocks:
        record = block["counterfactual"]
        assert len(record["drafts"]) == block["k"] and record["outcome"] in OUTCOMES
        assert [d["status"] for d in record["drafts"]].count("accepted") == record["accepted"]
        assert record["expected_accepted"] == pytest.approx(sum(d["survival"] for d in record["drafts"]))
        assert all(d["target_rank"] >= 1 and d["target_top"] and d["draft_top"] for d in record["drafts"])
        assert block["timings"]["counterfactual_ms"] > 0
        judged = block["drafts"][0]  # the first draft is always judged, and explained
        assert judged["target_rank"] >= 1 and len(judged["target_top"]) == 5 and judged["draft_top"]
    gain = run["metrics"]["steering_gain"]
    assert gain["n_blocks"] == len(blocks) == gain["won"] + gain["tied"] + gain["lost"]
    for outcome in OUTCOMES:
        assert gain[outcome] == sum(b["counterfactual"]["outcome"] == outcome for b in blocks)
    assert run["metrics"]["counterfactual_ms"] == pytest.approx(
        sum(b["timings"]["counterfactual_ms"] for b in run["blocks"])
    )


def test_a_counterfactual_run_records_every_steered_block_changes_no_token_and_is_stored_whole(
    engine, store_settings
):
    with TestClient(create_app(store_settings, engine=engine), base_url=LOOPBACK) as client:
        run = _post(client, "/generate", {**STEERED, "counterfactual": True})
        plain = _post(client, "/generate", STEERED)
        stored = client.get(f"/runs/{run['run_id']}").json()
    GenerationOut.model_validate(run)  # every new field fits the documented model
    assert run["steering"] is True
    _check_records(run)
    # the negative control: without the flag, no record, no gain, and the very same tokens
    assert plain["token_ids"] == run["token_ids"] and plain["text"] == run["text"]
    assert {b["counterfactual"] for b in plain["blocks"]} == {None}
    assert plain["metrics"]["steering_gain"] is None
    # (sd2 times the skipped counterfactual too: a few microseconds per block, not exactly 0)
    assert plain["metrics"]["counterfactual_ms"] < run["metrics"]["counterfactual_ms"] / 10
    # what the store gives back is the response, nested records included
    assert stored["blocks"] == run["blocks"] and stored["metrics"] == run["metrics"]


def test_the_stream_the_export_and_the_metrics_carry_the_counterfactual(embedded):
    lines = embedded.post("/generate", json={**STEERED, "counterfactual": True, "stream": True})
    *block_lines, summary = [json.loads(line) for line in lines.text.splitlines()]
    run = {"blocks": [line["block"] for line in block_lines], "metrics": summary["metrics"]}
    _check_records(run)
    stored = embedded.get(f"/runs/{summary['run_id']}").json()
    assert stored["blocks"] == run["blocks"]

    exported = embedded.get(f"/runs/{summary['run_id']}/export", params={"format": "json"}).json()
    assert exported["blocks"] == run["blocks"] and exported["metrics"]["steering_gain"]
    rows = list(
        csv.DictReader(io.StringIO(embedded.get(f"/runs/{summary['run_id']}/export?format=csv").text))
    )
    assert list(rows[0])[:8] == [
        *("block_index", "block_kind", "position", "token_id", "text", "status", "draft_prob", "target_prob")
    ]
    for block in run["blocks"]:
        mine = [r for r in rows if r["block_index"] == str(block["index"])]
        tokens = [*block["drafts"], *([block["extra"]] if block["extra"] else [])]
        drafts = block["counterfactual"]["drafts"] if block["counterfactual"] else []
        assert [r["source"] for r in mine] == ["trace"] * len(tokens) + ["counterfactual"] * len(drafts)
        assert [r["token_id"] for r in mine] == [str(t["token_id"]) for t in [*tokens, *drafts]]
        assert [r["target_rank"] for r in mine] == [str(t["target_rank"] or "") for t in [*tokens, *drafts]]
        assert [float(r["survival"]) for r in mine[len(tokens) :]] == [d["survival"] for d in drafts]
        assert {r["survival"] for r in mine[: len(tokens)]} == {""}

    _post(embedded, "/generate", STEERED)  # a run without the flag counts nothing
    samples = scrape(embedded)
    for outcome in OUTCOMES:
        counted = value(samples, "sd2_steering_blocks_total", method="sd2", outcome=outcome)
        assert counted == run["metrics"]["steering_gain"][outcome], outcome
    assert total(samples, "sd2_steering_blocks_total") == run["metrics"]["steering_gain"]["n_blocks"]


def test_compare_and_the_openai_routes_take_the_field_and_only_steered_runs_get_a_record(embedded):
    compared = _post(
        embedded, "/compare", {**SETTINGS, "methods": ["verifier", "sd2"], "counterfactual": True}
    )
    verifier, steered = compared["results"]
    assert verifier["text"] == steered["text"]  # T = 0: lossless
    assert {b["counterfactual"] for b in verifier["blocks"]} == {None}
    assert verifier["metrics"]["steering_gain"] is None
    _check_records(steered)

    unsteered = _post(embedded, "/generate", {**STEERED, "steering": False, "counterfactual": True})
    assert unsteered["steering"] is False and {b["counterfactual"] for b in unsteered["blocks"]} == {None}

    model = embedded.get("/v1/models").json()["data"][0]["id"]
    extension = {"method": "sd2", "k": 4, "counterfactual": True}
    chat = [{"role": "user", "content": PROMPT}]
    completion = {"model": model, "prompt": "The sky is blue because", "max_tokens": 12, **extension}
    answers = [
        _post(
            embedded,
            "/v1/chat/completions",
            {"model": model, "messages": chat, "max_tokens": 12, **extension},
        ),
        _post(embedded, "/v1/completions", completion),
    ]
    for answer in answers:
        _check_records(embedded.get(f"/runs/{answer['sd2']['run_id']}").json())
    reference = _post(embedded, "/generate", {**STEERED, "prompt": None, "messages": chat})
    assert answers[0]["choices"][0]["message"]["content"] == reference["text"]  # the same tokens
