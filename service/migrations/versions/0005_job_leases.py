"""Schema version 5: each training job records the replica that runs it and until when its lease holds,
so a replica starting beside live ones fails only jobs whose replica is gone (NULL before: such jobs are
treated as abandoned).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("training_jobs", sa.Column("replica", sa.String(80), nullable=True))
    op.add_column("training_jobs", sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite 3.35+), never a batch rebuild: with foreign keys on, dropping the old
    # copy of a parent table cascades into its children (training_metric_points).
    op.drop_column("training_jobs", "lease_until")
    op.drop_column("training_jobs", "replica")
