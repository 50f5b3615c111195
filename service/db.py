"""Database engine and sessions: SQLite in WAL mode with `BEGIN IMMEDIATE` writes, or any SQLAlchemy URL.

Why WAL + BEGIN IMMEDIATE (docs/embedded.md#gotchas): with pysqlite's default transaction handling concurrent
writers lost updates, and a deferred `BEGIN` failed with "database is locked" when two readers tried
to upgrade to writers at once. WAL lets readers run beside a writer; `BEGIN IMMEDIATE` takes the
write lock up front, so writers queue on the busy timeout instead of failing.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from service.orm import Base, BenchmarkRow

SCHEMA_VERSION = 4
_WRITE = "sd2_write"  # execution option that marks a write session's connection
MIGRATION_LOCK_KEY = 0x5D2_5D2  # PostgreSQL advisory lock held while one replica migrates
BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for the lock; runs are written in milliseconds


V1_TABLES = (
    "comparisons",
    "runs",
    "blocks",
    "token_events",
    "drafters",
    "training_jobs",
    "training_metric_points",
)


def _create_v1(conn: Connection) -> None:
    """Version 1: runs, blocks, token events, comparisons, training jobs, metric points, drafters."""
    Base.metadata.create_all(conn, tables=[Base.metadata.tables[name] for name in V1_TABLES])


def _add_benchmarks_v2(conn: Connection) -> None:
    """Version 2: stored `sd2 bench` results (POST /benchmarks)."""
    BenchmarkRow.__table__.create(conn)


def _add_run_precision_v3(conn: Connection) -> None:
    """Version 3: each run records the device and precision it ran in (e.g. "cpu/bf16").

    A fresh database already has the column: version 1 is created from today's ORM tables.
    """
    if "precision" not in {column["name"] for column in inspect(conn).get_columns("runs")}:
        conn.execute(text("ALTER TABLE runs ADD COLUMN precision VARCHAR(48)"))


def _add_block_draft_stop_v4(conn: Connection) -> None:
    """Version 4: each block records why its draft ended ("k", "confidence" or "length"; NULL before)."""
    if "draft_stop" not in {column["name"] for column in inspect(conn).get_columns("blocks")}:
        conn.execute(text("ALTER TABLE blocks ADD COLUMN draft_stop VARCHAR(16)"))


# Ordered migrations: MIGRATIONS[i] brings a database from version i to i + 1. A later schema change
# appends a function with explicit DDL here (never edits an earlier one) and bumps SCHEMA_VERSION.
MIGRATIONS: list[Callable[[Connection], None]] = [
    _create_v1,
    _add_benchmarks_v2,
    _add_run_precision_v3,
    _add_block_draft_stop_v4,
]


class Database:
    """One SQLAlchemy engine with a read-session and a write-session factory."""

    def __init__(self, url: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS):
        """`busy_timeout_ms`: how long a SQLite writer waits for the write lock before failing."""
        parsed = make_url(url)
        self.busy_timeout_ms = busy_timeout_ms
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        if self.is_sqlite and parsed.database not in (None, "", ":memory:"):
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = create_engine(url)
        if self.is_sqlite:
            _install_sqlite_hooks(self.engine, busy_timeout_ms)
        self._reads = sessionmaker(self.engine, expire_on_commit=False)
        self._writes = sessionmaker(self.engine.execution_options(**{_WRITE: True}), expire_on_commit=False)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._reads() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction: committed when the block exits normally, rolled back on any exception."""
        with self._writes() as session, session.begin():
            yield session

    def migrate(self) -> int:
        """Bring the schema to SCHEMA_VERSION; refuse a database written by a newer sd2. One replica at a
        time: SQLite's BEGIN IMMEDIATE takes the write lock, PostgreSQL an advisory transaction lock, so
        replicas starting together on a fresh database migrate it once, the others waiting."""
        with self.engine.execution_options(**{_WRITE: True}).begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            version = _current_version(conn)
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"DB schema version {version} is newer than this sd2's ({SCHEMA_VERSION})")
            for step in MIGRATIONS[version:SCHEMA_VERSION]:
                step(conn)
            conn.execute(text("DELETE FROM schema_version"))
            conn.execute(text("INSERT INTO schema_version (version) VALUES (:v)"), {"v": SCHEMA_VERSION})
        return SCHEMA_VERSION

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except Exception:  # health reports the failure instead of raising it
            return False

    def writable(self, timeout_ms: int = 1000) -> bool:
        """Whether a write transaction can start and update a row within `timeout_ms` (GET /ready); the
        probe is rolled back, so it changes nothing."""
        try:
            with self.engine.execution_options(**{_WRITE: True}).connect() as conn:
                raw = conn.connection.dbapi_connection  # no transaction yet: the timeout applies to BEGIN
                if self.is_sqlite:
                    raw.execute(f"PRAGMA busy_timeout={int(timeout_ms)}")
                try:
                    transaction = conn.begin()
                    try:
                        if conn.dialect.name == "postgresql":
                            conn.execute(text(f"SET LOCAL lock_timeout = {int(timeout_ms)}"))
                        conn.execute(text("UPDATE schema_version SET version = version"))
                    finally:
                        transaction.rollback()
                finally:
                    if self.is_sqlite:
                        raw.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
            return True
        except Exception:  # readiness reports the failure instead of raising it
            return False

    def dispose(self) -> None:
        self.engine.dispose()


def _current_version(conn: Connection) -> int:
    if not inspect(conn).has_table("schema_version"):
        conn.execute(text("CREATE TABLE schema_version (version INTEGER NOT NULL)"))
        return 0
    return int(conn.execute(text("SELECT MAX(version) FROM schema_version")).scalar() or 0)


def _retry_while_locked(statement: Callable[[], object], timeout_ms: int) -> None:
    """Run a statement SQLite may refuse with "database is locked" without consulting its busy
    handler: switching a new file to WAL while other connections open it at the same moment (replicas
    starting together) does. Retried for up to `timeout_ms`."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            statement()
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _install_sqlite_hooks(engine: Engine, busy_timeout_ms: int) -> None:
    """WAL, foreign keys, a busy timeout, and our own BEGIN (the pysqlite recipe in SQLAlchemy's docs)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # stop pysqlite from issuing its own (deferred) BEGIN
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        _retry_while_locked(lambda: cursor.execute("PRAGMA journal_mode=WAL"), busy_timeout_ms)
        cursor.execute("PRAGMA foreign_keys=ON")  # off by default in SQLite; cascades need it
        cursor.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable on app crash, fast commits
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
