"""Fixtures: a real SQLite file in tmp_path, the tiny model pair, and the app behind a TestClient."""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from sd2.engine import Engine
from service.app import create_app
from service.settings import Settings
from service.threaded import serve_in_thread

PROMPT = "Tell me a short story about a cat."
LOOPBACK = "http://127.0.0.1"  # TestClient's base URL: the service serves loopback Host names only


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The tiny pair gains nothing from intra-op threads, and on a shared 2-core machine their
    spin-waiting makes each forward many times slower; restored for other test packages."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def settings(tmp_path: Path, tiny_pair_dir) -> Settings:
    verifier_dir, drafter_dir = tiny_pair_dir
    # The tiny verifier has a 512-token context: keep prompt + max_new_tokens + k + 1 inside it.
    return Settings(
        home=tmp_path / "home",
        verifier=str(verifier_dir),
        drafters=(("tiny", str(drafter_dir)),),
        device="cpu",
        max_new_tokens=256,
        max_body_bytes=20_000,
        max_prompt_chars=5_000,
        warm_up=False,  # half a second per app on the tiny pair; tests/service/test_warm_up.py covers it
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), base_url=LOOPBACK) as c:
        yield c


@pytest.fixture
def keyed_client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(replace(settings, api_key="s3cret")), base_url=LOOPBACK) as c:
        yield c


def db_path(settings: Settings) -> Path:
    return settings.home / "sd2.db"


def count(settings: Settings, table: str, where: str = "1=1", params: tuple = ()) -> int:
    """Row count read straight from the SQLite file, bypassing the service's own code."""
    with sqlite3.connect(db_path(settings)) as conn:
        return conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}", params).fetchone()[0]


def table_counts(settings: Settings) -> dict[str, int]:
    tables = ("runs", "blocks", "token_events", "comparisons", "training_jobs", "training_metric_points")
    return {t: count(settings, t) for t in tables}


class SlowEngine(Engine):
    """The real engine, paced at 50 ms per block so a client can leave mid-run (each block's text is
    filled in once, by `stream` or by the service's scheduler)."""

    def fill_text(self, block):
        time.sleep(0.05)
        super().fill_text(block)


live_server = serve_in_thread  # uvicorn on a free loopback port in a thread (real sockets, real disconnects)


def race_migrations(url: str, replicas: int = 4) -> list:
    """What `replicas` servers starting at the same moment do first: migrate the store at `url`, each
    with its own Database, released together by a barrier. Returns each one's result (the schema
    version, or the repr of its error), and checks the version table holds one row."""
    import threading

    from sqlalchemy import create_engine, text

    from service.db import Database

    barrier, results = threading.Barrier(replicas), []

    def start() -> None:
        db = Database(url)
        barrier.wait()
        try:
            results.append(db.migrate())
        except Exception as err:  # what a replica's failed start-up would be
            results.append(repr(err))
        finally:
            db.dispose()

    threads = [threading.Thread(target=start) for _ in range(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    check = create_engine(url)
    with check.connect() as conn:
        rows = conn.execute(text("SELECT COUNT(*) FROM alembic_version")).scalar()
    check.dispose()
    assert rows == 1, f"{rows} rows in alembic_version"
    return results


POSTGRES_ADMIN_URL = os.environ.get("SD2_TEST_POSTGRES_URL")  # tests/service/test_postgres.py says how


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database beside SD2_TEST_POSTGRES_URL's, dropped afterwards."""
    if not POSTGRES_ADMIN_URL:
        pytest.skip("set SD2_TEST_POSTGRES_URL to test on PostgreSQL")
    pytest.importorskip("psycopg")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"sd2_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
