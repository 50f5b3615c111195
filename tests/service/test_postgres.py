"""The same service on PostgreSQL (docs/scale-out.md, the compose `postgres` profile): opt-in.

Set SD2_TEST_POSTGRES_URL to a server where the user may create databases, e.g.
`postgresql+psycopg://sd2@127.0.0.1:5432/sd2`; each test creates a fresh database next to the named
one and drops it afterwards. Skipped without the variable or without psycopg (`.[postgres]`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from service.app import create_app
from tests.service.conftest import LOOPBACK, POSTGRES_ADMIN_URL, PROMPT, live_server, race_migrations

ADMIN_URL = POSTGRES_ADMIN_URL
pytestmark = pytest.mark.skipif(not ADMIN_URL, reason="set SD2_TEST_POSTGRES_URL to test on PostgreSQL")


@pytest.fixture
def pg_settings(settings, postgres_url):
    return replace(settings, database_url=postgres_url)


def test_every_resource_works_on_postgres_and_survives_a_restart(pg_settings):
    with TestClient(create_app(pg_settings), base_url=LOOPBACK) as client:
        health = client.get("/health").json()
        assert health["database"] is True
        run = client.post("/generate", json={"prompt": PROMPT, "method": "tiny", "max_new_tokens": 8}).json()
        lines = client.post(
            "/generate", json={"prompt": PROMPT, "method": "tiny", "max_new_tokens": 8, "stream": True}
        ).text.splitlines()
        assert lines[-1].startswith('{"event": "summary"')
        compared = client.post("/compare", json={"prompt": PROMPT, "methods": ["verifier", "tiny"]}).json()
        assert len({r["text"] for r in compared["results"]}) == 1  # greedy: same text for every method
        stored = client.get(f"/runs/{run['run_id']}").json()
        assert stored["token_ids"] == run["token_ids"] and stored["blocks"] == run["blocks"]
        assert client.get(f"/runs/{run['run_id']}/export", params={"format": "csv"}).status_code == 200
        assert {r["method"] for r in client.get("/stats").json()} == {"verifier", "tiny"}
        assert client.delete(f"/runs/{run['run_id']}").status_code == 204
        total = client.get("/runs").json()["total"]
        assert total == 3  # 1 streamed + 2 compared
    with TestClient(create_app(pg_settings), base_url=LOOPBACK) as client:  # restart on the same database
        assert client.get("/runs").json()["total"] == total


def test_concurrent_generates_on_postgres_store_complete_traces(pg_settings):
    with live_server(create_app(pg_settings)) as url:

        def one(i: int) -> dict:
            body = {"prompt": PROMPT, "method": "tiny", "max_new_tokens": 12, "temperature": 1.0, "seed": i}
            response = httpx.post(f"{url}/generate", json=body, timeout=120)
            assert response.status_code == 200, response.text
            return response.json()

        with ThreadPoolExecutor(10) as pool:
            results = list(pool.map(one, range(10)))
        for result in results:
            stored = httpx.get(f"{url}/runs/{result['run_id']}", timeout=30).json()
            assert stored["blocks"] == result["blocks"] and stored["token_ids"] == result["token_ids"]
        assert httpx.get(f"{url}/runs", timeout=30).json()["total"] == 10


def test_two_replicas_started_together_serve_twenty_clients_with_nothing_lost(pg_settings):
    """Two servers start at the same moment on one fresh PostgreSQL; 20 clients split between them get
    20 distinct stored runs, each readable from either replica."""
    import contextlib

    from sd2.engine import Engine

    # The models load one after the other (transformers' loading sets process-wide defaults, which two
    # replicas in one process would race on); the servers then start, and migrate, at the same moment.
    engines = [Engine.load(pg_settings.verifier, dict(pg_settings.drafters), device="cpu") for _ in range(2)]
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(2) as starter:
        serve = lambda e: stack.enter_context(live_server(create_app(pg_settings, engine=e)))  # noqa: E731
        urls = list(starter.map(serve, engines))

        def one(i: int) -> tuple[int, dict]:
            body = {"prompt": f"{PROMPT} ({i})", "method": "tiny", "max_new_tokens": 6, "seed": i}
            response = httpx.post(f"{urls[i % 2]}/generate", json=body, timeout=120)
            assert response.status_code == 200, response.text
            return i, response.json()

        with ThreadPoolExecutor(20) as pool:
            results = list(pool.map(one, range(20)))
        assert len({r["run_id"] for _, r in results}) == 20
        for i, result in results:
            stored = httpx.get(f"{urls[(i + 1) % 2]}/runs/{result['run_id']}", timeout=30).json()  # the other
            assert stored["prompt"] == f"{PROMPT} ({i})" and stored["token_ids"] == result["token_ids"]
        assert [httpx.get(f"{u}/runs", timeout=30).json()["total"] for u in urls] == [20, 20]


def test_replicas_started_together_on_a_fresh_database_all_come_up(postgres_url):
    """Four replicas' migrations race on an empty PostgreSQL; all finish, the schema made once."""
    from service.db import SCHEMA_VERSION

    for attempt in range(4):
        url = postgres_url if attempt == 0 else _fresh_database(postgres_url, attempt)
        assert race_migrations(url) == [SCHEMA_VERSION] * 4, attempt


def _fresh_database(url: str, attempt: int) -> str:
    """Another empty database beside `url`'s (dropped with the admin connection's cleanup below)."""
    name = f"{make_url(url).database}_{attempt}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    _CREATED.append(name)
    return make_url(url).set(database=name).render_as_string(hide_password=False)


_CREATED: list[str] = []


@pytest.fixture(autouse=True)
def _drop_extra_databases():
    yield
    if not _CREATED:
        return
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for name in _CREATED:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()
    _CREATED.clear()
