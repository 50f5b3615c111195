"""Training jobs across replicas sharing one store: each job is leased by the replica that queued it.

A replica starting beside live ones used to mark *every* queued or running job failed, theirs too.
Now it fails only jobs whose lease lapsed (their replica died) or that have none (written before
leases); a live replica renews its own, and a stopping one fails those it had still queued.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from service import repository
from service.app import create_app
from service.db import Database
from service.jobs import JobRunner
from tests.service.conftest import LOOPBACK, db_path

LEASE_S = 0.6  # renewed every 0.2 s
BODY = {"base_drafter": "tiny", "steps": 2}
GONE = "gone-host:1:deadbeef"  # a replica that died


class Gate:
    """A train_fn that runs until released (then returns the tiny drafter: the job succeeds) or stopped."""

    def __init__(self, checkpoint):
        self.checkpoint, self.started, self.release = checkpoint, threading.Event(), threading.Event()

    def __call__(self, spec, on_metric, should_stop):
        self.started.set()
        while not self.release.wait(0.05):
            if should_stop():
                return None
        return self.checkpoint


def _status(settings, job_id: int) -> tuple[str, str | None]:
    with sqlite3.connect(db_path(settings)) as conn:
        return conn.execute("SELECT status, error FROM training_jobs WHERE id = ?", (job_id,)).fetchone()


def _wait_status(settings, job_id: int, wanted: str, timeout: float = 10) -> tuple[str, str | None]:
    deadline = time.time() + timeout
    while (found := _status(settings, job_id))[0] != wanted and time.time() < deadline:
        time.sleep(0.05)
    return found


@pytest.fixture
def leased(settings):
    return replace(settings, job_lease_s=LEASE_S)


def test_a_replica_starting_beside_a_live_one_leaves_its_running_job_alone(leased, tiny_pair_dir):
    gate = Gate(tiny_pair_dir[1])
    with TestClient(create_app(leased, train_fn=gate), base_url=LOOPBACK) as a:
        job = a.post("/train", json={**BODY, "name": "on-a"}).json()["id"]
        assert gate.started.wait(30)
        with TestClient(create_app(leased), base_url=LOOPBACK) as b:
            time.sleep(4 * LEASE_S)  # several of B's sweeps and A's renewals
            assert b.get(f"/train/{job}").json()["status"] == "running"
        gate.release.set()
        assert _wait_status(leased, job, "succeeded")[0] == "succeeded"


def test_a_dead_replicas_jobs_fail_once_their_lease_lapses(leased):
    db = Database(leased.db_url)
    db.migrate()
    dead = repository.create_job(db, "orphan", "sd2", "tiny", {"steps": 2}, GONE, lease_s=2 * LEASE_S)
    with TestClient(create_app(leased), base_url=LOOPBACK) as client:
        assert client.get(f"/train/{dead}").json()["status"] == "queued"  # its lease still holds
        status, error = _wait_status(leased, dead, "failed")
        assert status == "failed" and "stopped before the job finished" in error
    db.dispose()


def test_a_job_without_a_lease_is_failed_at_start_up(leased):
    db = Database(leased.db_url)
    db.migrate()
    legacy = repository.create_job(db, "legacy", "sd2", "tiny", {"steps": 2}, GONE, lease_s=3600)
    with sqlite3.connect(db_path(leased)) as conn:  # as rows written before leases existed
        conn.execute("UPDATE training_jobs SET replica = NULL, lease_until = NULL, status = 'running'")
    with TestClient(create_app(leased), base_url=LOOPBACK) as client:
        assert client.get(f"/train/{legacy}").json()["status"] == "failed"  # before any sweep ran
    db.dispose()


def test_a_stopping_replica_fails_the_jobs_it_had_queued(leased, tiny_pair_dir):
    gate = Gate(tiny_pair_dir[1])
    with TestClient(create_app(leased, train_fn=gate), base_url=LOOPBACK) as client:
        running = client.post("/train", json={**BODY, "name": "running"}).json()["id"]
        queued = client.post("/train", json={**BODY, "name": "queued"}).json()["id"]
        assert gate.started.wait(30)
    assert _status(leased, running)[0] == "cancelled"  # stopped mid-way by the shutdown
    status, error = _status(leased, queued)
    assert status == "failed" and "stopped before the job finished" in error


def test_leases_must_be_renewed_before_they_lapse(leased):
    with pytest.raises(ValueError, match="renew_s"):
        JobRunner(None, None, None, leased.drafters_dir, lease_s=1.0, renew_s=1.0)
