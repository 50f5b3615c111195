"""Schema migrations by Alembic (service/migrations, docs/trace.md#schema-migrations).

A file written by sd2 at schema version 1 (by that version's own code: data/README.md) is upgraded and
served; the head of the revisions is the ORM; a database of the hand-kept `schema_version` scheme is
adopted; one from a newer sd2 is refused; a second migrate writes nothing; the downgrades keep the rows.
Each runs on SQLite and, with SD2_TEST_POSTGRES_URL set, on PostgreSQL. Replicas racing on a fresh
store: test_failures.py (SQLite) and test_postgres.py (PostgreSQL).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import JSON, Boolean, DateTime, Engine, String, column, event, inspect, table, text
from sqlalchemy.exc import DBAPIError

from service.app import create_app
from service.db import SCHEMA_VERSION, Database
from service.migrations import alembic_config
from service.orm import Base, BlockRow, Run, TokenEventRow
from tests.service.conftest import LOOPBACK, PROMPT, db_path, race_migrations

OLD_FILE = Path(__file__).parent / "data" / "sd2-schema-v1.db"  # 3 runs, 36 blocks, 104 token events
HEAD = f"{SCHEMA_VERSION:04d}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """An empty store: a new SQLite file, or a fresh PostgreSQL database (skipped without one)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sd2.db'}"
    return request.getfixturevalue("postgres_url")


def _differences(engine: Engine) -> list:
    """What autogenerate would write to bring the database to the ORM (empty: they agree)."""
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


def _versions(engine: Engine) -> dict[str, list]:
    """The rows of Alembic's version table and of the legacy one (None where the table is absent)."""
    with engine.connect() as conn:
        tables = inspect(conn).get_table_names()
        return {
            name: conn.execute(text(f"SELECT {col} FROM {name}")).scalars().all() if name in tables else None
            for name, col in (("alembic_version", "version_num"), ("schema_version", "version"))
        }


def _upgrade_to(db: Database, revision: str) -> None:
    with db.migration_transaction() as conn:
        command.upgrade(alembic_config(conn), revision)


def test_a_file_written_by_sd2_at_schema_version_1_is_upgraded_and_served(settings):
    path = db_path(settings)
    path.parent.mkdir(parents=True)
    shutil.copy(OLD_FILE, path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
        old_runs = conn.execute("SELECT id, text, token_ids FROM runs ORDER BY id").fetchall()
        old_blocks = conn.execute("SELECT run_id, COUNT(*) FROM blocks GROUP BY run_id").fetchall()
        old_events = conn.execute("SELECT COUNT(*) FROM token_events").fetchone()[0]
    assert len(old_runs) == 3 and old_events > 0

    with TestClient(create_app(settings), base_url=LOOPBACK) as client:
        assert client.get("/runs").json()["total"] == 3
        for run_id, run_text, token_ids in old_runs:
            run = client.get(f"/runs/{run_id}").json()
            assert (run["text"], run["token_ids"]) == (run_text, json.loads(token_ids))
            assert run["precision"] is None  # v3's column: unknown for an old run
            assert {block["draft_stop"] for block in run["blocks"]} == {None}  # v4's column, likewise
            # v6's columns: no counterfactual, none of its time, no explainer (NULL read as the defaults)
            assert {(b["counterfactual"], b["timings"]["counterfactual_ms"]) for b in run["blocks"]} == {
                (None, 0.0)
            }
            events = [e for b in run["blocks"] for e in [*b["drafts"], *([b["extra"]] if b["extra"] else [])]]
            assert events and {
                (e["target_rank"], len(e["target_top"]), len(e["draft_top"]), len(e["residual_top"]))
                for e in events
            } == {(None, 0, 0, 0)}
            exported = client.get(f"/runs/{run_id}/export", params={"format": "csv"}).text
            rows = list(csv.DictReader(io.StringIO(exported)))
            assert [r["token_id"] for r in rows] == [str(e["token_id"]) for e in events]
            assert {(r["source"], r["target_rank"], r["survival"]) for r in rows} == {("trace", "", "")}
        assert client.get("/benchmarks").json()["total"] == 0  # v2's table
        new = client.post("/generate", json={"prompt": PROMPT, "method": "tiny", "max_new_tokens": 8}).json()
        assert client.get(f"/runs/{new['run_id']}").json()["precision"] is not None

    with sqlite3.connect(path) as conn:  # the old runs' traces are all there
        blocks = conn.execute("SELECT run_id, COUNT(*) FROM blocks WHERE run_id <= 3 GROUP BY run_id")
        assert blocks.fetchall() == old_blocks
        assert conn.execute("SELECT COUNT(*) FROM token_events WHERE run_id <= 3").fetchone()[0] == old_events
    db = Database(f"sqlite:///{path}")
    assert _versions(db.engine) == {"alembic_version": [HEAD], "schema_version": None}
    assert _differences(db.engine) == []
    db.dispose()


def test_the_migrated_schema_is_the_orm(store_url):
    db = Database(store_url)
    db.migrate()
    assert _differences(db.engine) == []
    db.dispose()


def test_the_comparison_with_the_orm_sees_a_missing_revision(store_url):
    """The negative control of the test above: two revisions short, the ORM's counterfactual,
    explainer and batch size columns are missing."""
    db = Database(store_url)
    _upgrade_to(db, "0005")
    assert sorted((d[0], d[2], d[3].name) for d in _differences(db.engine)) == [
        ("add_column", "blocks", "batch_size"),
        ("add_column", "blocks", "counterfactual"),
        ("add_column", "blocks", "counterfactual_ms"),
        ("add_column", "token_events", "draft_top"),
        ("add_column", "token_events", "residual_top"),
        ("add_column", "token_events", "target_rank"),
        ("add_column", "token_events", "target_top"),
    ]
    db.dispose()


def test_a_second_migrate_writes_nothing(store_url):
    db = Database(store_url)
    statements: list[str] = []

    def record(_conn, _cursor, statement, *_args) -> None:
        statements.append(statement.split(None, 1)[0].upper())

    event.listen(db.engine, "before_cursor_execute", record)
    writes = {"CREATE", "ALTER", "DROP", "INSERT", "UPDATE", "DELETE"}
    assert db.migrate() == SCHEMA_VERSION
    assert writes & set(statements)  # the first one did create the schema
    statements.clear()
    assert db.migrate() == SCHEMA_VERSION
    assert not writes & set(statements), statements
    assert _versions(db.engine) == {"alembic_version": [HEAD], "schema_version": None}
    db.dispose()


def test_a_database_from_a_newer_sd2_is_refused(store_url):
    db = Database(store_url)
    db.migrate()
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0999'"))
    with pytest.raises(RuntimeError, match=rf"revision '0999' is newer than this sd2's \('{HEAD}'\)"):
        db.migrate()
    assert _versions(db.engine)["alembic_version"] == ["0999"]
    db.dispose()


def test_a_legacy_version_newer_than_the_last_revision_is_refused(store_url):
    db = Database(store_url)
    with db.engine.begin() as conn:
        conn.execute(text("CREATE TABLE schema_version (version INTEGER NOT NULL)"))
        conn.execute(text("INSERT INTO schema_version (version) VALUES (9)"))
    newer = rf"schema version 9 is newer than this sd2's \({SCHEMA_VERSION}\)"
    with pytest.raises(RuntimeError, match=newer):
        db.migrate()
    assert _versions(db.engine) == {"alembic_version": None, "schema_version": [9]}  # rolled back
    db.dispose()


_RUNS = table(
    "runs",
    column("created_at", DateTime(timezone=True)),
    column("status", String),
    column("method", String),
    column("steering", Boolean),
    column("config", JSON),
)


def _legacy_database(url: str, version: int) -> None:
    """What sd2 before Alembic left at `version`: that schema, one run, and `schema_version` = version."""
    db = Database(url)
    with db.migration_transaction() as conn:
        command.upgrade(alembic_config(conn), f"{version:04d}")
        conn.execute(text("DROP TABLE alembic_version"))
        conn.execute(text("CREATE TABLE schema_version (version INTEGER NOT NULL)"))
        conn.execute(text("INSERT INTO schema_version (version) VALUES (:v)"), {"v": version})
        row = {"created_at": datetime(2026, 1, 1, tzinfo=UTC), "status": "succeeded", "method": "verifier"}
        conn.execute(_RUNS.insert().values(**row, steering=False, config={"k": 8}))
    db.dispose()


@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_a_legacy_database_is_stamped_at_its_version_then_upgraded(store_url, version):
    _legacy_database(store_url, version)
    db = Database(store_url)
    assert db.migrate() == SCHEMA_VERSION
    assert _versions(db.engine) == {"alembic_version": [HEAD], "schema_version": None}
    assert _differences(db.engine) == []  # precision and draft_stop added once, where missing
    with db.read() as session:
        run = session.get(Run, 1)
        assert (run.method, run.config, run.precision) == ("verifier", {"k": 8}, None)
    db.dispose()


def test_a_failing_upgrade_leaves_the_database_as_it_was(store_url):
    """Stamp, upgrade and the legacy table's drop are one transaction: here 0003 fails, since this
    (inconsistent) version-2 database already has `runs.precision`, and nothing of it stays."""
    _legacy_database(store_url, 2)
    db = Database(store_url)
    with db.engine.begin() as conn:
        conn.execute(text("ALTER TABLE runs ADD COLUMN precision VARCHAR(48)"))
    with pytest.raises(DBAPIError, match="precision"):
        db.migrate()
    assert _versions(db.engine) == {"alembic_version": None, "schema_version": [2]}
    with db.engine.connect() as conn:
        assert "draft_stop" not in {c["name"] for c in inspect(conn).get_columns("blocks")}
    db.dispose()


def test_replicas_started_together_on_a_legacy_database_adopt_it_once(store_url):
    _legacy_database(store_url, 2)
    assert race_migrations(store_url) == [SCHEMA_VERSION] * 4
    db = Database(store_url)
    assert _versions(db.engine) == {"alembic_version": [HEAD], "schema_version": None}
    db.dispose()


def test_the_downgrades_drop_their_columns_and_keep_the_rows(store_url):
    """Dropping a column of a parent table must not rebuild it: with foreign keys on, a rebuild on
    SQLite deletes the old copy, and its children (blocks, token events) with it."""
    db = Database(store_url)
    db.migrate()
    _store_a_run_with_one_block(db)
    _downgrade_to(db, "0002")
    with db.engine.connect() as conn:
        assert "precision" not in {c["name"] for c in inspect(conn).get_columns("runs")}
        blocks = {c["name"] for c in inspect(conn).get_columns("blocks")}
        assert not {"draft_stop", "counterfactual", "batch_size"} & blocks
        assert "target_top" not in {c["name"] for c in inspect(conn).get_columns("token_events")}
        counts = [
            conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar()
            for t in ("runs", "blocks", "token_events")
        ]
        assert counts == [1, 1, 1]
    db.migrate()
    assert _differences(db.engine) == []
    _downgrade_to(db, "base")
    with db.engine.connect() as conn:
        assert inspect(conn).get_table_names() == ["alembic_version"]
    db.dispose()


def _store_a_run_with_one_block(db: Database) -> None:
    with db.write() as session:
        run = Run(status="succeeded", method="tiny", steering=False, config={}, precision="cpu/fp32")
        session.add(run)
        session.flush()
        timings = {"draft_ms": 1.0, "verify_ms": 1.0, "steer_ms": 0.0, "total_ms": 2.0}
        block = BlockRow(
            run_id=run.id,
            index=0,
            kind="speculative",
            k=1,
            n_accepted=1,
            complete=True,
            overlaps=[],
            layer_bias_norms=[],
            draft_stop="k",
            **timings,
        )
        session.add(block)
        session.flush()
        token = TokenEventRow(
            block_id=block.id,
            run_id=run.id,
            position=0,
            is_extra=False,
            token_id=7,
            text="a",
            status="accepted",
        )
        session.add(token)


def _downgrade_to(db: Database, revision: str) -> None:
    with db.migration_transaction() as conn:
        command.downgrade(alembic_config(conn), revision)
