"""GET /metrics over real HTTP: its counters agree with what the API itself returned (service.metrics)."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.app import create_app
from tests.service.conftest import LOOPBACK, PROMPT, SlowEngine, live_server

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (sample name, sorted labels) → value
TINY = {"prompt": PROMPT, "method": "tiny", "k": 3, "max_new_tokens": 30, "seed": 1, "temperature": 1.0}
SPEC_COUNTERS = (
    "sd2_spec_blocks_total",
    "sd2_spec_draft_tokens_total",
    "sd2_spec_accepted_tokens_total",
    "sd2_spec_accepted_tokens_per_position_total",
)


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 for a series never created (nothing counted yet)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over every series whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def judged_speculative(blocks: list[dict]) -> list[dict]:
    return [b for b in blocks if b["kind"] == "speculative" and b["counts_for_tau"]]


def test_speculative_counters_equal_the_runs_own_metrics(client):
    run = client.post("/generate", json=TINY).json()
    metrics, blocks = run["metrics"], run["blocks"]
    assert 0 < metrics["accepted"] < metrics["drafted"], metrics  # the counts below are not all-or-nothing
    samples = scrape(client)

    assert value(samples, "sd2_emitted_tokens_total", method="tiny") == metrics["n_tokens"] == 30
    assert value(samples, "sd2_spec_draft_tokens_total", method="tiny") == metrics["drafted"]
    assert value(samples, "sd2_spec_accepted_tokens_total", method="tiny") == metrics["accepted"]
    assert value(samples, "sd2_spec_blocks_total", method="tiny") == len(judged_speculative(blocks))
    per_position = [
        value(samples, "sd2_spec_accepted_tokens_per_position_total", method="tiny", position=str(p))
        for p in range(3)
    ]
    assert sum(per_position) == metrics["accepted"]
    assert per_position == sorted(per_position, reverse=True)  # position p ≤ position p − 1
    # Accepted at position p = blocks that accepted more than p drafts (the run's own histogram).
    assert per_position == [sum(metrics["histogram"][p + 1 :]) for p in range(3)]
    assert value(samples, "sd2_generations_total", method="tiny", status="succeeded") == 1
    finish = run["finish_reason"]
    assert value(samples, "sd2_generations_finished_total", method="tiny", finish_reason=finish) == 1
    # The first token is the prefill's; every later one is an inter-token observation.
    assert value(samples, "sd2_time_to_first_token_seconds_count", method="tiny") == 1
    later = metrics["n_tokens"] - blocks[0]["n_emitted"]
    assert value(samples, "sd2_inter_token_latency_seconds_count", method="tiny") == later
    assert value(samples, "sd2_queue_wait_seconds_count") == 1


def test_the_verifier_adds_tokens_but_no_speculative_counts(client):
    client.post("/generate", json=TINY).raise_for_status()
    before = scrape(client)
    run = client.post("/generate", json={**TINY, "method": "verifier"}).json()
    after = scrape(client)
    assert value(after, "sd2_emitted_tokens_total", method="verifier") == run["metrics"]["n_tokens"]
    assert value(after, "sd2_emitted_tokens_total", method="tiny") == 30  # unchanged
    for name in SPEC_COUNTERS:
        assert total(after, name, method="verifier") == 0, name
        assert total(after, name) == total(before, name), name
    assert value(after, "sd2_generations_total", method="verifier", status="succeeded") == 1


def test_requests_are_counted_by_route_template_method_and_status(client):
    run_id = client.post("/generate", json={**TINY, "max_new_tokens": 4}).json()["run_id"]
    assert client.get(f"/runs/{run_id}").status_code == 200
    assert client.get("/runs/999999").status_code == 404
    assert client.get("/no/such/path").status_code == 404
    assert client.post("/generate", json={**TINY, "temperature": -1}).status_code == 422
    assert client.get("/generate").status_code == 405  # the method check answers before routing
    assert client.request("BREW", "/runs").status_code == 405
    samples = scrape(client)

    requests = "sd2_http_requests_total"
    assert value(samples, requests, method="POST", route="/generate", status="200") == 1
    assert value(samples, requests, method="GET", route="/runs/{run_id}", status="200") == 1
    assert value(samples, requests, method="GET", route="/runs/{run_id}", status="404") == 1
    assert value(samples, requests, method="GET", route="unmatched", status="404") == 1
    assert value(samples, requests, method="POST", route="/generate", status="422") == 1
    assert value(samples, requests, method="GET", route="/generate", status="405") == 1
    assert value(samples, requests, method="other", route="/runs", status="405") == 1
    routes = {dict(labels).get("route") for name, labels in samples if name == requests}
    assert not any(str(run_id) in r or "no/such" in r or "999999" in r for r in routes), routes
    duration = "sd2_http_request_duration_seconds_count"
    assert value(samples, duration, method="GET", route="/runs/{run_id}") == 2
    assert value(samples, duration, method="POST", route="/generate") == 2


def test_the_queue_gauges_read_admission_and_a_429_is_counted(settings):
    with TestClient(create_app(replace(settings, generation_queue=1)), base_url=LOOPBACK) as client:
        samples = scrape(client)
        assert value(samples, "sd2_generation_queue_depth") == 0  # at rest
        assert value(samples, "sd2_generation_queue_limit") == 1
        admission = client.app.state.services.admission
        admission.acquire()  # the one slot, as a running generation holds it
        try:
            assert value(scrape(client), "sd2_generation_queue_depth") == 1
            assert client.post("/generate", json=TINY).status_code == 429
        finally:
            admission.release()
        samples = scrape(client)
    assert value(samples, "sd2_generation_queue_depth") == 0
    assert value(samples, "sd2_http_requests_total", method="POST", route="/generate", status="429") == 1
    assert total(samples, "sd2_generations_total") == 0  # refused: nothing decoded


def test_a_streamed_generation_is_timed_to_its_last_line(settings, tiny_pair_dir):
    """One TTFT and one duration observation; the request's duration runs to the end of the stream, past
    the generation's (a response timed at its headers would end after the first paced block)."""
    verifier_dir, drafter_dir = tiny_pair_dir
    engine = SlowEngine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu")
    with TestClient(create_app(settings, engine=engine), base_url=LOOPBACK) as client:
        with client.stream("POST", "/generate", json={**TINY, "stream": True}) as response:
            lines = [json.loads(line) for line in response.iter_lines() if line]
        assert lines[-1]["event"] == "summary" and lines[-1]["status"] == "succeeded"
        samples = scrape(client)
    assert value(samples, "sd2_time_to_first_token_seconds_count", method="tiny") == 1
    assert value(samples, "sd2_generation_duration_seconds_count", method="tiny") == 1
    generation_s = value(samples, "sd2_generation_duration_seconds_sum", method="tiny")
    assert generation_s >= 0.05 * len(lines)  # the pace: 50 ms per streamed item
    tokens = value(samples, "sd2_emitted_tokens_total", method="tiny")
    rate = value(samples, "sd2_generation_tokens_per_second_sum", method="tiny")
    assert value(samples, "sd2_generation_tokens_per_second_count", method="tiny") == 1
    assert rate == pytest.approx(tokens / generation_s)
    request_s = value(samples, "sd2_http_request_duration_seconds_sum", method="POST", route="/generate")
    assert request_s >= generation_s
    assert value(samples, "sd2_http_requests_total", method="POST", route="/generate", status="200") == 1


def test_two_apps_in_one_process_keep_their_own_counts(client, settings, tmp_path):
    with TestClient(create_app(replace(settings, home=tmp_path / "other")), base_url=LOOPBACK) as other:
        client.post("/generate", json=TINY).raise_for_status()
        scrape(other)
        theirs, mine = scrape(other), scrape(client)
    assert value(mine, "sd2_emitted_tokens_total", method="tiny") == 30
    assert total(theirs, "sd2_emitted_tokens_total") == 0
    assert total(theirs, "sd2_http_requests_total", route="/generate") == 0
    scrapes = {"method": "GET", "route": "/metrics", "status": "200"}
    assert value(theirs, "sd2_http_requests_total", **scrapes) == 1  # its first scrape
    assert value(mine, "sd2_http_requests_total", **scrapes) == 0  # not the other app's


@pytest.mark.parametrize("path", ["/metrics", "/health"])
def test_metrics_answer_without_a_key_while_the_model_lock_is_held(settings, path):
    """Open like /health when SD2_API_KEY is set, and served off the model lock: a scrape answers while
    a generation (here: the test) holds the lock."""
    app = create_app(replace(settings, api_key="s3cret"))
    with live_server(app) as url:
        lock = app.state.services.host.lock
        with lock:
            response = httpx.get(f"{url}{path}", timeout=10)
        assert response.status_code == 200
    if path == "/metrics":
        assert "sd2_generation_queue_depth 0.0" in response.text


def test_openapi_documents_metrics_as_text_under_health(client):
    operation = client.get("/openapi.json").json()["paths"]["/metrics"]["get"]
    assert operation["tags"] == ["health"]
    (media_type,) = operation["responses"]["200"]["content"]
    assert media_type.startswith("text/plain")
