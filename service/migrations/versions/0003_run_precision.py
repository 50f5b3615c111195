"""Schema version 3: each run records the device and precision it ran in (e.g. "cpu/bf16"; NULL before).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("precision", sa.String(48), nullable=True))


def downgrade() -> None:
    # A plain DROP COLUMN (SQLite 3.35+), never a batch rebuild: with foreign keys on, dropping the old
    # copy of a parent table cascades into its children.
    op.drop_column("runs", "precision")
