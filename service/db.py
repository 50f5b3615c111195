"""Database engine and sessions: SQLite in WAL mode with `BEGIN IMMEDIATE` writes, or any SQLAlchemy URL.

Why WAL + BEGIN IMMEDIATE (docs/embedded.md#gotchas): with pysqlite's default transaction handling concurrent
writers lost updates, and a deferred `BEGIN` failed with "database is locked" when two readers tried
to upgrade to writers at once. WAL lets readers run beside a writer; `BEGIN IMMEDIATE` takes the
write lock up front, so writers queue on the busy timeout instead of failing.

The schema comes from the Alembic revisions in `service/migrations`, which `Database.migrate()` runs
at start-up under a lock (docs/trace.md#schema-migrations).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from service import migrations

SCHEMA_VERSION = int(migrations.head_revision())  # one source: the newest revision, "0004" → 4
_WRITE = "sd2_write"  # execution option that marks a write session's connection
MIGRATION_LOCK_KEY = 0x5D2_5D2  # PostgreSQL advisory lock held while one replica migrates
BUSY_TIMEOUT_MS = 30_000  # a writer waits this long for the lock; runs are written in milliseconds
VERSION_TABLE = "alembic_version"  # Alembic's: one row, the revision the database is at
LEGACY_VERSION_TABLE = "schema_version"  # sd2's own before Alembic: one row, the version number 1..4


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
        """Bring the schema to SCHEMA_VERSION (Alembic `upgrade head`); refuse a database written by a
        newer sd2. One replica at a time (`migration_transaction`), so replicas starting together on a
        fresh database migrate it once, the others waiting; a second call changes nothing."""
        with self.migration_transaction() as conn:
            config = migrations.alembic_config(conn)
            _adopt_legacy_version(conn, config)
            _refuse_unknown_revision(conn)
            command.upgrade(config, "head")
        return SCHEMA_VERSION

    @contextmanager
    def migration_transaction(self) -> Iterator[Connection]:
        """One write transaction holding the migration lock: SQLite's BEGIN IMMEDIATE takes the write
        lock, PostgreSQL an advisory transaction lock. Committed when the block exits normally."""
        with self.engine.execution_options(**{_WRITE: True}).begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            yield conn

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
                        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = version_num"))
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


def _adopt_legacy_version(conn: Connection, config: Config) -> None:
    """A database from before Alembic keeps its version N in `schema_version`: stamp it at revision N
    (the schema it has), so the upgrade runs only what came after, and drop the old table."""
    if not inspect(conn).has_table(LEGACY_VERSION_TABLE):
        return
    version = int(conn.execute(text(f"SELECT MAX(version) FROM {LEGACY_VERSION_TABLE}")).scalar() or 0)
    if version > 0:  # 0: the old code's first migration never committed, the database is empty
        revision = f"{version:04d}"
        if revision not in migrations.known_revisions():
            raise RuntimeError(f"DB schema version {version} is newer than this sd2's ({SCHEMA_VERSION})")
        if MigrationContext.configure(conn).get_current_revision() is None:
            command.stamp(config, revision)
    conn.execute(text(f"DROP TABLE {LEGACY_VERSION_TABLE}"))


def _refuse_unknown_revision(conn: Connection) -> None:
    """A revision this code has no script for was written by a newer sd2: upgrading it is impossible and
    running on it would misread its tables."""
    for revision in MigrationContext.configure(conn).get_current_heads():
        if revision not in migrations.known_revisions():
            raise RuntimeError(
                f"DB schema revision {revision!r} is newer than this sd2's ({migrations.head_revision()!r})"
            )


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
