"""Alembic environment: run the migrations on the connection `Database.migrate()` hands over.

`Database.migrate()` opens the transaction (holding the migration lock) and passes its connection as
`config.attributes["connection"]`; Alembic sees a transaction already open and neither begins nor
commits one. From the alembic CLI (a developer autogenerating a revision) there is none: the database
comes from `-x url=...` or SD2_DATABASE_URL, opened through `Database` for the same SQLite pragmas and
lock. `target_metadata` is the ORM, which autogenerate compares the database against.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from service.orm import Base


def run_migrations(connection: Connection) -> None:
    # No render_as_batch: autogenerate writes plain ADD/DROP COLUMN, which SQLite (3.35+) runs in place.
    # A batch rebuild of a parent table (runs, blocks, training_jobs) would drop its old copy, and with
    # foreign keys on, the rows of its children with it.
    # transactional_ddl: on SQLite too, every revision runs inside migrate()'s one transaction, so a
    # failing upgrade leaves the database as it was (Alembic assumes otherwise for SQLite).
    context.configure(connection=connection, target_metadata=Base.metadata, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


def run_from_cli() -> None:
    from service.db import Database

    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get("SD2_DATABASE_URL")
    if not url:
        raise SystemExit("name the database: alembic -x url=sqlite:///path/to/dev.db ... or SD2_DATABASE_URL")
    db = Database(url)
    try:
        with db.migration_transaction() as connection:
            run_migrations(connection)
    finally:
        db.dispose()


if context.config.attributes.get("connection") is not None:
    run_migrations(context.config.attributes["connection"])
else:
    run_from_cli()
