"""Many clients at once: all served (queued on the model lock), no run loses or mixes events."""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx

from service.app import create_app
from tests.service.conftest import count, db_path, live_server

N_CLIENTS = 20


def test_twenty_concurrent_generate_requests_all_succeed_with_complete_consistent_traces(settings):
    prompts = [f"Request number {i}: tell me about cats." for i in range(N_CLIENTS)]

    def call(url: str, i: int) -> dict:
        body = {
            "prompt": prompts[i],
            "method": ("tiny", "verifier", "self")[i % 3],
            "k": 3,
            "max_new_tokens": 12 + i % 5,
            "temperature": 1.0,
            "seed": i,
            "stream": i % 2 == 0,
        }
        with httpx.Client(base_url=url, timeout=120) as http:
            response = http.post("/generate", json=body)
            assert response.status_code == 200, response.text
            if body["stream"]:
                *_, summary = (
                    httpx.Response(200, content=line).json() for line in response.text.splitlines()
                )
                return {"i": i, **summary}
            return {"i": i, **response.json()}

    roomy = replace(settings, generation_queue=N_CLIENTS)  # all admitted: they queue on the model lock
    with live_server(create_app(roomy)) as url, ThreadPoolExecutor(N_CLIENTS) as pool:
        results = list(pool.map(lambda i: call(url, i), range(N_CLIENTS)))
        stored = {r["run_id"]: httpx.get(f"{url}/runs/{r['run_id']}", timeout=30).json() for r in results}

    assert len({r["run_id"] for r in results}) == N_CLIENTS
    assert count(settings, "runs", "status = 'succeeded'") == N_CLIENTS
    with sqlite3.connect(db_path(settings)) as conn:
        per_run = dict(conn.execute("SELECT run_id, COUNT(*) FROM token_events GROUP BY run_id").fetchall())
    for result in results:
        run = stored[result["run_id"]]
        assert run["prompt"] == prompts[result["i"]]  # no request got another's run
        assert (
            run["token_ids"] == result["token_ids"]
            and run["config"]["max_new_tokens"] == 12 + result["i"] % 5
        )
        if result["finish_reason"] == "length":  # else a sampled stop token ended it early
            assert len(result["token_ids"]) == run["config"]["max_new_tokens"]
        emitted = [t["token_id"] for b in run["blocks"] for t in b["drafts"] if t["status"] == "accepted"]
        extras = [b["extra"]["token_id"] for b in run["blocks"] if b["extra"]]
        assert sorted(emitted + extras) == sorted(run["token_ids"])
        n_events = sum(len(b["drafts"]) + (b["extra"] is not None) for b in run["blocks"])
        assert per_run[result["run_id"]] == n_events
        assert [b["index"] for b in run["blocks"]] == list(range(len(run["blocks"])))


def test_past_the_generation_queue_requests_get_429_and_reads_keep_answering(settings, tiny_pair_dir):
    """With the model lock held and the queue full, one more generation is refused at once with
    429 + Retry-After (nothing stored), while /runs, /health and /ready answer on their own threads;
    once the lock is free the admitted ones all finish."""
    from sd2.engine import Engine

    verifier_dir, drafter_dir = tiny_pair_dir
    engine = Engine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu")
    app = create_app(replace(settings, generation_queue=2), engine=engine)
    body = {"prompt": "Hi", "method": "tiny", "max_new_tokens": 4}
    with live_server(app) as url, ThreadPoolExecutor(2) as pool:
        lock = app.state.services.host.lock
        lock.acquire()  # a long run holds the model: every admitted generation waits
        try:
            waiting = [pool.submit(httpx.post, f"{url}/generate", json=body, timeout=60) for _ in range(2)]
            deadline = time.time() + 30
            while app.state.services.admission.admitted < 2:
                assert time.time() < deadline, "the two generations were never admitted"
                time.sleep(0.02)
            refused = httpx.post(f"{url}/generate", json=body, timeout=10)
            streamed = httpx.post(f"{url}/generate", json={**body, "stream": True}, timeout=10)
            one = {"prompt": "Hi", "methods": ["tiny"], "max_new_tokens": 4}
            compared = httpx.post(f"{url}/compare", json=one, timeout=10)
            reads = [httpx.get(f"{url}{path}", timeout=10) for path in ("/runs", "/health", "/ready")]
        finally:
            lock.release()
        served = [f.result() for f in waiting]
    for response in (refused, streamed, compared):
        assert response.status_code == 429 and response.headers["Retry-After"] == "1"
        assert response.json()["detail"][0]["loc"] == ["server", "generation_queue"]
    assert [r.status_code for r in reads] == [200, 200, 200]
    assert [r.status_code for r in served] == [200, 200]
    assert count(settings, "runs") == 2  # the refused ones wrote nothing
    assert app.state.services.admission.admitted == 0  # every slot came back
