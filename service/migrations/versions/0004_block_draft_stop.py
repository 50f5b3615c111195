"""Schema version 4: each block records why its draft ended ("k", "confidence" or "length"; NULL before).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("blocks", sa.Column("draft_stop", sa.String(16), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+), never a batch rebuild: with foreign keys on, dropping the old
    # copy of a parent table cascades into its children.
    op.drop_column("blocks", "draft_stop")
