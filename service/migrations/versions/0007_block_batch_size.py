"""Schema version 7: each block records how many requests shared its verifier forward (batched
decoding, service/scheduler.py; NULL before: read back as 1, it ran alone).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("blocks", sa.Column("batch_size", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("blocks", "batch_size")  # a plain DROP COLUMN: no batch rebuild of a parent table
