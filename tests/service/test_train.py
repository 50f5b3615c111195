"""Training jobs: start, observe (JSON and stream), the new drafter in /drafters, cancel, failure."""

from __future__ import annotations

import json
import threading
import time

from fastapi.testclient import TestClient

from service.app import create_app
from tests.service.conftest import LOOPBACK, PROMPT, count

TEXTS = ["The cat sat on the mat and looked at the sky.", "Speculative decoding drafts, then verifies."]


def _wait(client, job_id: int, statuses=("succeeded", "failed", "cancelled"), timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = client.get(f"/train/{job_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {job['status']}")


def test_a_job_trains_registers_its_drafter_and_survives_a_restart(settings):
    body = {
        "name": "cat-drafter",
        "base_drafter": "tiny",
        "steps": 4,
        "seq_len": 16,
        "batch_size": 2,
        "data": TEXTS,
    }
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        submitted = client.post("/train", json=body)
        assert submitted.status_code == 202 and submitted.json()["status"] in (
            "queued",
            "running",
            "succeeded",
        )
        job_id = submitted.json()["id"]
        with client.stream("GET", f"/train/{job_id}/stream") as response:
            lines = [json.loads(line) for line in response.iter_lines() if line]
        assert lines[-1]["status"] == "succeeded" and lines[-1]["progress"] == 1.0
        streamed = [p for line in lines for p in line["points"]]
        job = client.get(f"/train/{job_id}").json()
        assert job["points"] == streamed  # the stream delivered each point once, in order
        losses = [p for p in job["points"] if p["name"] == "loss"]
        assert [p["step"] for p in losses] == [1, 2, 3, 4] and all(p["value"] > 0 for p in losses)
        assert count(settings, "training_metric_points", "job_id = ?", (job_id,)) == len(job["points"])

        drafters = {d["name"]: d for d in client.get("/drafters").json()}
        assert (
            drafters["cat-drafter"]["recipe"] == "pretrain"
            and drafters["cat-drafter"]["source"] == "training"
        )
        card = json.loads((settings.drafters_dir / "cat-drafter" / "sd2_card.json").read_text())
        assert card["steps"] == 4 and card["base"] == "tiny" and card["recipe"]["objective"] == "pretrain"
        assert card["recipe"]["precision"] == "auto"
        assert card["final_metrics"]["val_tau"] >= 1.0 and card["tokens_seen"] > 0
        used = client.post("/generate", json={"prompt": PROMPT, "method": "cat-drafter", "max_new_tokens": 5})
        assert used.status_code == 200 and used.json()["method"] == "cat-drafter"
        again = client.post("/train", json=body)  # the name is taken now
        assert again.status_code == 409 and again.json()["detail"][0]["loc"] == ["body", "name"]
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        assert "cat-drafter" in {d["name"] for d in client.get("/drafters").json()}
        assert client.get(f"/train/{job_id}").json()["status"] == "succeeded"


def test_cancel_a_running_job_and_a_queued_one(settings):
    gate = threading.Event()

    def slow_train(spec, on_metric, should_stop):
        """An injected train_fn that reports a step, then waits until it is told to stop."""
        on_metric(1, {"loss": 1.0})
        while not should_stop():
            gate.wait(0.02)
        return None

    body = {"base_drafter": "tiny", "steps": 10}
    with TestClient(create_app(settings, train_fn=slow_train), base_url=LOOPBACK) as client:
        running = client.post("/train", json={**body, "name": "first"}).json()["id"]
        queued = client.post("/train", json={**body, "name": "second"}).json()["id"]
        _wait(client, running, ("running",))
        assert client.get(f"/train/{queued}").json()["status"] == "queued"
        cancelled = client.post(f"/train/{queued}/cancel").json()
        assert cancelled["status"] == "cancelled" and cancelled["started_at"] is None
        client.post(f"/train/{running}/cancel")
        job = _wait(client, running)
        assert job["status"] == "cancelled" and job["points"] == [{"step": 1, "name": "loss", "value": 1.0}]
        assert job["progress"] == 0.1
        assert {d["name"] for d in client.get("/drafters").json()} == {"tiny"}
        # A cancelled job frees its name.
        assert client.post("/train", json={**body, "name": "second"}).status_code == 202


def test_a_failing_job_reports_its_error_and_bad_submissions_are_refused(settings):
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        # The default trainer fails at run time: windows longer than the base drafter's 512 positions.
        job_id = client.post("/train", json={"name": "too-long", "base_drafter": "tiny", "steps": 2,
                                              "seq_len": 4096, "batch_size": 1}).json()["id"]  # fmt: skip
        job = _wait(client, job_id)
        assert job["status"] == "failed" and job["finished_at"] is not None
        assert job["error"] == "ValueError: seq_len 4096 exceeds 'tiny''s context of 512"
        assert not (settings.drafters_dir / "too-long").exists()  # no half-written checkpoint
        assert {d["name"] for d in client.get("/drafters").json()} == {"tiny"}

        refused = {
            "base_drafter": {"name": "x", "base_drafter": "missing"},
            "method": {"name": "x", "base_drafter": "tiny", "method": "dpo"},
            "name": {"name": "../../etc", "base_drafter": "tiny"},
            "steps": {"name": "x", "base_drafter": "tiny", "steps": 0},
            "precision": {"name": "x", "base_drafter": "tiny", "precision": "fp16"},
            "loss": {"name": "x", "base_drafter": "tiny", "method": "distill", "loss": "js"},
            "pretrain": {"name": "x", "base_drafter": "tiny", "loss": "tvd"},  # pretrain has no verifier
        }
        for field, body in refused.items():
            response = client.post("/train", json=body)
            assert response.status_code == 422 and field in str(response.json()["detail"]), (
                field,
                response.json(),
            )
        assert client.post("/train", json={"name": "verifier", "base_drafter": "tiny"}).status_code == 409
        assert count(settings, "training_jobs") == 1


def test_distill_and_sd2_jobs_train_with_the_verifier_and_register_steered_drafters(settings):
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        settings_of = {"base_drafter": "tiny", "steps": 3, "seq_len": 32, "batch_size": 2}
        ids = [  # the sd2 job also runs its forwards under bf16 autocast, with the TV-distance loss
            client.post("/train", json={"name": f"job-{m}", "method": m, **settings_of, **extra}).json()["id"]
            for m, extra in (("distill", {}), ("sd2", {"precision": "bf16", "loss": "tvd"}))
        ]
        for job_id in ids:
            job = _wait(client, job_id)
            assert job["status"] == "succeeded", job
            names = {p["name"] for p in job["points"]}
            assert {"loss", "val_tau", "tau_proxy", "tau_proxy_greedy"} <= names
        drafters = {d["name"]: d for d in client.get("/drafters").json()}
        assert drafters["job-sd2"]["steering"] and not drafters["job-distill"]["steering"]
        cards = {
            m: json.loads((settings.drafters_dir / f"job-{m}" / "sd2_card.json").read_text())
            for m in ("distill", "sd2")
        }
        assert (
            cards["sd2"]["recipe"]["precision"] == "bf16"
            and cards["distill"]["recipe"]["precision"] == "auto"
        )
        assert cards["sd2"]["recipe"]["loss"] == "tvd" and cards["distill"]["recipe"]["loss"] == "kl"
        result = client.post(
            "/generate", json={"prompt": "Hi", "method": "job-sd2", "max_new_tokens": 8}
        ).json()
        assert result["steering"] and len(result["token_ids"]) == 8


def test_a_job_builds_its_trainer_with_build_trainer_and_leaves_the_global_rng_alone(settings, monkeypatch):
    """The server's jobs build their Trainer as `sd2 train` does, and a job (a new steering head
    included) leaves the serving process's threads and global RNG as they were."""
    import torch

    import sd2.train.fine_tune

    built = []

    def spy(config, *args, **kwargs):
        built.append(config.objective)
        return real(config, *args, **kwargs)

    real = sd2.train.fine_tune.build_trainer
    monkeypatch.setattr(sd2.train.fine_tune, "build_trainer", spy)
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        threads, rng = torch.get_num_threads(), torch.get_rng_state()
        body = {"name": "job-sd2", "method": "sd2", "base_drafter": "tiny", "steps": 2, "seq_len": 32}
        job = _wait(client, client.post("/train", json={**body, "batch_size": 2}).json()["id"])
        assert job["status"] == "succeeded", job
        assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng)
    assert built == ["sd2"]


def test_a_drafter_trained_on_one_replica_serves_on_another(settings):
    """Two replicas share the database and SD2_HOME; a drafter replica A trains is unknown to B's
    Engine until a request names it, then B loads it from the shared folder and decodes with it."""
    body = {"name": "shared", "base_drafter": "tiny", "steps": 2, "seq_len": 16, "batch_size": 2}
    with (
        TestClient(create_app(settings), base_url=LOOPBACK) as a,
        TestClient(create_app(settings), base_url=LOOPBACK) as b,
    ):
        assert _wait(a, a.post("/train", json=body).json()["id"])["status"] == "succeeded"
        assert "shared" not in b.get("/health").json()["methods"]  # B started before it existed
        run = b.post("/generate", json={"prompt": "Hi", "method": "shared", "max_new_tokens": 6})
        assert run.status_code == 200 and run.json()["method"] == "shared"
        assert "shared" in b.get("/health").json()["methods"]
        assert b.post("/generate", json={"prompt": "Hi", "method": "nope"}).status_code == 422
        follow_up = {**body, "name": "shared-2", "base_drafter": "shared"}  # B can fine-tune it too
        assert b.post("/train", json=follow_up).status_code == 202


def test_every_replica_lists_the_drafters_any_replica_trained(settings):
    """GET /drafters (what the UI offers) on B lists a drafter A trained, and it decodes there."""
    body = {"name": "trained-on-a", "base_drafter": "tiny", "steps": 2, "seq_len": 16, "batch_size": 2}
    with (
        TestClient(create_app(settings), base_url=LOOPBACK) as a,
        TestClient(create_app(settings), base_url=LOOPBACK) as b,
    ):
        assert [d["name"] for d in b.get("/drafters").json()] == ["tiny"]
        assert _wait(a, a.post("/train", json=body).json()["id"])["status"] == "succeeded"
        listed = {d["name"]: d for d in b.get("/drafters").json()}
        assert set(listed) == {"tiny", "trained-on-a"} and listed["trained-on-a"]["source"] == "training"
        assert "trained-on-a" in b.get("/health").json()["methods"]
        run = b.post("/generate", json={"prompt": "Hi", "method": "trained-on-a", "max_new_tokens": 4})
        assert run.status_code == 200
