"""One generation may hold the model for the server's time budget, then ends with what it has.

A long legal prompt with many new tokens used to hold the model lock for as long as it took (≈ 16 s
for a 32 000-character prompt on the embedded pair). Now a run past `generation_time_budget_s` stops
at its next block boundary: a 200, finish_reason "time", the output so far stored as a succeeded run.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import LOOPBACK, count

LONG_PROMPT = (
    "Describe the river, the hills and the town in great detail. " * 4
)  # fits the tiny verifier with ASKED
ASKED = 200


@pytest.fixture
def budget_client(settings: Settings):
    # A budget far below one block of the tiny pair's decoding: every run ends after its prefill block.
    with TestClient(create_app(replace(settings, generation_time_budget_s=1e-6)), base_url=LOOPBACK) as c:
        yield c


@pytest.mark.parametrize("method", ["verifier", "tiny"])
def test_a_long_run_past_the_budget_ends_early_with_its_output_stored(budget_client, settings, method):
    body = {"prompt": LONG_PROMPT, "method": method, "max_new_tokens": ASKED}
    response = budget_client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["finish_reason"] == "time"
    assert 1 <= len(out["token_ids"]) < ASKED and len(out["blocks"]) == 1
    stored = budget_client.get(f"/runs/{out['run_id']}").json()
    assert stored["status"] == "succeeded" and stored["finish_reason"] == "time"
    assert stored["token_ids"] == out["token_ids"]
    assert count(settings, "runs", "finish_reason = 'time'") == 1


def test_a_streamed_run_past_the_budget_ends_with_a_summary_saying_so(budget_client):
    body = {"prompt": LONG_PROMPT, "max_new_tokens": ASKED, "stream": True}
    with budget_client.stream("POST", "/generate", json=body) as response:
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert [line["event"] for line in lines] == ["block", "summary"]
    assert lines[-1]["finish_reason"] == "time" and lines[-1]["status"] == "succeeded"


def test_the_same_request_runs_to_its_length_without_a_budget(settings):
    with TestClient(create_app(replace(settings, generation_time_budget_s=0)), base_url=LOOPBACK) as c:
        out = c.post("/generate", json={"prompt": LONG_PROMPT, "max_new_tokens": 40}).json()
    assert out["finish_reason"] in ("length", "stop") and len(out["blocks"]) > 1


def test_the_budget_comes_from_the_environment():
    assert Settings().time_budget_s == 60.0
    assert Settings.from_env({"SD2_GENERATION_TIME_BUDGET_S": "2.5"}).time_budget_s == 2.5
    assert Settings.from_env({"SD2_GENERATION_TIME_BUDGET_S": "0"}).time_budget_s is None
