"""Many requests decoding together (service/scheduler.py): every route's requests, plain and streamed,
each get exactly their solo output, stored once and complete, while sharing batched forwards."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import pytest

from sd2.config import DecodeConfig
from sd2.engine import Engine, GenerateRequest
from service.app import create_app
from tests.service.conftest import count, live_server
from tests.service.test_metrics import scrape, total

N = 12


def _body(i: int) -> dict:
    return {
        "prompt": f"Request {i}: say something about the sea.",
        "k": 2 + i % 3,
        "max_new_tokens": 10 + i % 7,
        "temperature": (0.0, 1.0)[i % 2],
        "seed": i,
    }


def _call(url: str, i: int) -> list[tuple[str, list[int]]]:
    """Request i through one route, by i % 4: [(method, token ids)] of what it decoded."""
    body, route = _body(i), i % 4
    with httpx.Client(base_url=url, timeout=300) as http:
        if route == 0:
            reply = http.post("/generate", json={**body, "method": "tiny"})
            return [("tiny", reply.raise_for_status().json()["token_ids"])]
        if route == 1:
            reply = http.post("/generate", json={**body, "method": "self", "stream": True})
            *_, summary = (json.loads(line) for line in reply.raise_for_status().text.splitlines())
            return [("self", summary["token_ids"])]
        if route == 2:
            reply = http.post("/compare", json={**body, "methods": ["verifier", "tiny"]}).raise_for_status()
            return [(run["method"], run["token_ids"]) for run in reply.json()["results"]]
        messages = [{"role": "user", "content": body.pop("prompt")}]
        body["max_tokens"] = body.pop("max_new_tokens")
        model = http.get("/v1/models").raise_for_status().json()["data"][0]["id"]
        chat = {"model": model, "messages": messages, "method": "tiny", **body}
        reply = http.post("/v1/chat/completions", json=chat).raise_for_status()
        run = http.get(f"/runs/{reply.json()['sd2']['run_id']}").raise_for_status().json()
        return [("tiny", run["token_ids"])]


@pytest.mark.parametrize("max_batch", [8, 1])
def test_concurrent_requests_on_every_route_get_their_solo_output(settings, tiny_pair_dir, max_batch):
    verifier_dir, drafter_dir = tiny_pair_dir
    solo_engine = Engine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu")
    roomy = replace(settings, generation_queue=2 * N, max_batch=max_batch)
    app = create_app(roomy)
    with live_server(app) as url, ThreadPoolExecutor(N) as pool:
        decoded = list(pool.map(lambda i: _call(url, i), range(N)))
        samples = scrape(httpx.Client(base_url=url))
    for i, runs in enumerate(decoded):
        body = _body(i)
        for method, token_ids in runs:
            messages = ({"role": "user", "content": body["prompt"]},)
            decode = DecodeConfig(**{k: v for k, v in body.items() if k != "prompt"})
            alone = solo_engine.generate(GenerateRequest(messages=messages, method=method, decode=decode))
            assert token_ids == alone.token_ids, (i, method)
    runs = sum(len(r) for r in decoded)
    assert count(settings, "runs", "status = 'succeeded'") == runs  # each stored once
    forwards = total(samples, "sd2_batch_rows_count")
    alone = total(samples, "sd2_batch_rows_bucket", le="1.0")
    if max_batch == 1:
        assert forwards > 0 and alone == forwards  # the serial path: never two in a forward
    else:
        assert alone < forwards  # some forwards held several requests
