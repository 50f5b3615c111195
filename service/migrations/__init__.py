"""The trace store's schema migrations: an Alembic environment shipped inside the package.

`Database.migrate()` (service/db.py) runs them programmatically, on its own locked connection, with no
alembic.ini; `alembic.ini` here is only for a developer's alembic CLI (docs/trace.md#schema-migrations).
Revision ids are "0001", "0002", ...: the head's number is the schema version `GET /version` reports.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

MIGRATIONS_DIR = Path(__file__).parent


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for this package's scripts; `connection` (one already in the migration's
    transaction) reaches env.py through `config.attributes`."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@cache
def scripts() -> ScriptDirectory:
    """The revision scripts under versions/, read once."""
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision; Alembic raises if the chain has forked into several heads."""
    head = scripts().get_current_head()
    assert head is not None, f"no revisions under {MIGRATIONS_DIR / 'versions'}"
    return head


def known_revisions() -> frozenset[str]:
    return frozenset(script.revision for script in scripts().walk_revisions())
