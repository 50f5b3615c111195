"""Runs that break mid-decoding, clients that vanish mid-stream, restarts: the store stays consistent."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import replace

import httpx
import pytest
from fastapi.testclient import TestClient

from sd2.engine import Engine
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import (
    LOOPBACK,
    PROMPT,
    SlowEngine,
    count,
    db_path,
    live_server,
    race_migrations,
)


def _raise_after(n_calls: int):
    """A forward pre-hook that lets `n_calls` forwards through, then raises like a device fault would."""
    calls = {"n": 0}

    def hook(_module, _args):
        calls["n"] += 1
        if calls["n"] > n_calls:
            raise RuntimeError("injected drafter fault")

    return hook


@pytest.fixture
def faulty_engine(tiny_pair_dir) -> Engine:
    """The real tiny pair plus a drafter 'broken' whose 4th forward raises (mid-run, after some blocks)."""
    verifier_dir, drafter_dir = tiny_pair_dir
    engine = Engine.load(
        str(verifier_dir), {"tiny": str(drafter_dir), "broken": str(drafter_dir)}, device="cpu"
    )
    engine.drafters["broken"].model.model.layers[0].register_forward_pre_hook(_raise_after(3))
    return engine


def test_a_run_that_raises_mid_decoding_is_stored_as_failed_without_events(settings, faulty_engine):
    with TestClient(create_app(settings, engine=faulty_engine), base_url=LOOPBACK) as client:
        response = client.post(
            "/generate", json={"prompt": PROMPT, "method": "broken", "k": 2, "max_new_tokens": 30}
        )
        assert response.status_code == 500
        failed = response.json()
        assert "injected drafter fault" in failed["detail"] and failed["status"] == "failed"
        run = client.get(f"/runs/{failed['run_id']}").json()
        assert run["status"] == "failed" and "injected drafter fault" in run["error"]
        assert run["blocks"] == [] and run["token_ids"] is None and run["method"] == "broken"
        assert count(settings, "blocks") == 0 and count(settings, "token_events") == 0
        # The server keeps serving, and the same pair still decodes with a healthy drafter.
        ok = client.post("/generate", json={"prompt": PROMPT, "method": "tiny", "k": 2, "max_new_tokens": 10})
        assert ok.status_code == 200
        assert client.get("/runs", params={"status": "failed"}).json()["total"] == 1


def test_a_streamed_run_that_raises_ends_with_an_error_line_and_a_failed_row(settings, faulty_engine):
    with TestClient(create_app(settings, engine=faulty_engine), base_url=LOOPBACK) as client:
        body = {"prompt": PROMPT, "method": "broken", "k": 2, "max_new_tokens": 30, "stream": True}
        with client.stream("POST", "/generate", json=body) as response:
            lines = [json.loads(line) for line in response.iter_lines() if line]
    *blocks, last = lines
    assert len(blocks) >= 2 and {b["event"] for b in blocks} == {"block"}  # it failed mid-run
    assert last["event"] == "error" and last["status"] == "failed" and "injected" in last["error"]
    assert count(settings, "runs", "status = 'failed' AND id = ?", (last["run_id"],)) == 1
    assert count(settings, "token_events") == 0  # the blocks already streamed were not half-written


def test_restart_with_an_existing_db_keeps_all_runs(settings):
    run_ids = []
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        for method in ("verifier", "tiny"):
            run_ids.append(
                client.post(
                    "/generate", json={"prompt": PROMPT, "method": method, "max_new_tokens": 6}
                ).json()
            )
        first = [client.get(f"/runs/{r['run_id']}").json() for r in run_ids]
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        assert client.get("/runs").json()["total"] == 2
        assert [client.get(f"/runs/{r['run_id']}").json() for r in run_ids] == first
        third = client.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 4}).json()
        assert third["run_id"] > max(r["run_id"] for r in run_ids)


def test_a_client_that_disconnects_mid_stream_leaves_a_cancelled_run_and_a_healthy_server(
    settings, tiny_pair_dir
):
    verifier_dir, drafter_dir = tiny_pair_dir
    engine = SlowEngine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu")
    body = {"prompt": PROMPT, "method": "verifier", "max_new_tokens": 200, "stream": True}
    with (
        live_server(create_app(settings, engine=engine)) as url,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        with http.stream("POST", "/generate", json=body) as response:
            first = json.loads(next(response.iter_lines()))
            assert first["event"] == "block"
        # The client is gone after 1 of ~200 blocks; the worker stops at a block boundary.
        deadline = time.time() + 10
        while count(settings, "runs") == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert count(settings, "runs", "status = 'cancelled'") == 1
        assert count(settings, "token_events") == 0 and count(settings, "blocks") == 0
        assert http.get("/health").json()["status"] == "ok"
        ok = http.post("/generate", json={"prompt": PROMPT, "max_new_tokens": 3})
        assert ok.status_code == 200 and count(settings, "runs", "status = 'succeeded'") == 1


def test_settings_from_env_defaults_and_parsing(tmp_path):
    s = Settings.from_env({"SD2_HOME": str(tmp_path), "SD2_DRAFTERS": "a=/x/a, b=/y/b", "SD2_PORT": "9000"})
    assert s.host == "127.0.0.1" and s.port == 9000 and s.api_key is None
    assert s.db_url == f"sqlite:///{tmp_path / 'sd2.db'}" and s.drafters == (("a", "/x/a"), ("b", "/y/b"))
    assert Settings.from_env({"SD2_DATABASE_URL": "postgresql://u@h/db"}).db_url == "postgresql://u@h/db"
    for bad in ("../x=/p", "noequals", "a="):
        with pytest.raises(ValueError, match="SD2_DRAFTERS"):
            Settings.from_env({"SD2_DRAFTERS": bad})
    assert s.packed_weights is True  # unset: on
    assert Settings.from_env({"SD2_PACKED_WEIGHTS": "off"}).packed_weights is False
    assert s.draft_weights is None  # unset: auto
    assert Settings.from_env({"SD2_DRAFT_WEIGHTS": "full"}).draft_weights == "full"
    with pytest.raises(ValueError, match="SD2_PACKED_WEIGHTS"):
        Settings.from_env({"SD2_PACKED_WEIGHTS": "maybe"})


def _rename_table(settings: Settings, old: str, new: str) -> None:
    """A real store failure from outside the service: the table its next statement needs is gone."""
    with sqlite3.connect(db_path(settings)) as conn:
        conn.execute(f"ALTER TABLE {old} RENAME TO {new}")


def _await_log(caplog, text: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while text not in caplog.text:
        assert time.time() < deadline, f"never logged {text!r}"
        time.sleep(0.05)


def test_a_store_failure_around_jobs_leaves_the_training_worker_alive(settings, caplog):
    """The store fails as one job ends and as the next starts; the worker lives on, /ready says so,
    the two jobs are marked failed once the store is back, and a later job runs."""
    started, release = threading.Event(), threading.Event()

    def gated(spec, on_metric, should_stop):
        started.set()
        release.wait(30)
        return None  # "stopped early": the runner records the job as cancelled

    body = {"base_drafter": "tiny", "steps": 2}
    with TestClient(create_app(settings, train_fn=gated), base_url=LOOPBACK) as client:
        first = client.post("/train", json={**body, "name": "first"}).json()["id"]
        second = client.post("/train", json={**body, "name": "second"}).json()["id"]
        assert started.wait(30)
        _rename_table(settings, "training_jobs", "training_jobs_away")
        release.set()
        _await_log(caplog, f"training job {first}: the store failed")
        _await_log(caplog, f"training job {second}: the store failed")
        assert client.get("/ready").json()["training_worker"] is True
        _rename_table(settings, "training_jobs_away", "training_jobs")
        third = client.post("/train", json={**body, "name": "third"}).json()["id"]
        assert _wait_job(client, third)["status"] == "cancelled"  # the worker took it
        for job_id in (first, second):
            job = client.get(f"/train/{job_id}").json()
            assert job["status"] == "failed" and job["error"] == "the store failed: OperationalError", job


def test_ready_reports_an_unwritable_store_with_503(settings):
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        ready = client.get("/ready")
        assert ready.status_code == 200 and ready.json() == {
            "status": "ready", "models_loaded": True, "database_writable": True, "training_worker": True,
        }  # fmt: skip
        with sqlite3.connect(db_path(settings), timeout=1) as holder:
            holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock past the probe's timeout
            held = client.get("/ready")
            holder.rollback()
        assert held.status_code == 503 and held.json()["database_writable"] is False
        assert held.json()["status"] == "not_ready"
        assert client.get("/ready").status_code == 200  # and ready again once the lock is gone


def _wait_job(client, job_id: int, timeout: float = 30) -> dict:
    deadline = time.time() + timeout
    while (job := client.get(f"/train/{job_id}").json())["status"] in ("queued", "running"):
        assert time.time() < deadline, job
        time.sleep(0.05)
    return job


def test_start_up_sweeps_what_a_dead_checkpoint_save_left(settings):
    """A process killed during a job's final save leaves hidden folders; the next start cleans them
    (only ones untouched for 15 minutes: another replica's save under way is left alone)."""
    import os

    folder = settings.drafters_dir
    made = {}
    for name in (".a.staging-x1", ".b.staging-y2", ".c.retired", ".d.retired", "d"):
        made[name] = folder / name
        made[name].mkdir(parents=True)
        (made[name] / "config.json").write_text(name)
    old = time.time() - 3600
    for name in (".a.staging-x1", ".c.retired", ".d.retired"):
        os.utime(made[name], (old, old))
    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        assert client.get("/ready").status_code == 200
    assert not made[".a.staging-x1"].exists()  # an abandoned staging folder
    assert made[".b.staging-y2"].exists()  # a fresh one: maybe a save still running elsewhere
    assert (folder / "c" / "config.json").read_text() == ".c.retired"  # the swap died half-way: put back
    assert not made[".d.retired"].exists() and (folder / "d" / "config.json").read_text() == "d"


def test_a_store_that_cannot_be_written_gives_json_503_without_sql(settings):
    """Another writer holds the lock past the busy timeout. /generate answers a JSON 503 naming the
    database (no SQL text, no library URL), a stream ends with the same short error line, /ready says
    not ready, and nothing is half-written."""
    quick = replace(settings, db_busy_timeout_ms=200)
    body = {"prompt": PROMPT, "method": "tiny", "max_new_tokens": 4}
    with live_server(create_app(quick)) as url:
        before = count(settings, "runs")
        with sqlite3.connect(db_path(settings), timeout=1) as holder:
            holder.execute("BEGIN IMMEDIATE")
            plain = httpx.post(f"{url}/generate", json=body, timeout=60)
            streamed = httpx.post(f"{url}/generate", json={**body, "stream": True}, timeout=60)
            ready = httpx.get(f"{url}/ready", timeout=10)
            holder.rollback()
        after = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert plain.status_code == 503 and plain.headers["content-type"] == "application/json"
    (detail,) = plain.json()["detail"]
    assert detail["loc"] == ["server", "database"]
    assert detail["msg"] == "the database is unavailable: database is locked"
    last = json.loads(streamed.text.splitlines()[-1])
    assert last == {"event": "error", "status": "failed", "error": detail["msg"]}
    for text in (plain.text, streamed.text):
        assert "INSERT" not in text and "sqlalche.me" not in text
    assert ready.status_code == 503 and ready.json()["database_writable"] is False
    assert after.status_code == 200
    assert count(settings, "runs") == before + 1  # only the run after the lock: nothing half-written


def test_a_plain_request_whose_client_hangs_up_cancels_its_run(settings, tiny_pair_dir):
    """A non-streaming client gives up while its run waits for the model; the run stops at its first
    block and is stored as cancelled, instead of decoding to the end for nobody."""
    verifier_dir, drafter_dir = tiny_pair_dir
    engine = Engine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu")
    app = create_app(settings, engine=engine)
    body = {"prompt": PROMPT, "method": "tiny", "max_new_tokens": 200}
    with live_server(app) as url:
        lock = app.state.services.host.lock
        with lock:  # the model is busy: the request waits, then its client times out and leaves
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{url}/generate", json=body, timeout=1.0)
            time.sleep(0.6)  # the server notices the hang-up while the run still waits
        deadline = time.time() + 30
        while count(settings, "runs") == 0:
            assert time.time() < deadline, "the abandoned run was never stored"
            time.sleep(0.05)
        run = httpx.get(f"{url}/runs", timeout=10).json()["items"][0]
    assert run["status"] == "cancelled"
    assert count(settings, "token_events") == 0  # cancelled before anything was kept


def test_replicas_started_together_on_a_fresh_sqlite_file_all_come_up(tmp_path):
    """Four replicas' migrations race on a new SQLite file (PostgreSQL: tests/service/test_postgres.py)."""
    from service.db import SCHEMA_VERSION

    assert race_migrations(f"sqlite:///{tmp_path / 'fresh.db'}") == [SCHEMA_VERSION] * 4
