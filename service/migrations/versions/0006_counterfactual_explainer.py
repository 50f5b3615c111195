"""Schema version 6: each block may carry its unsteered counterfactual (JSON) and the time it took, and
each token event the rejection explainer's rank and top-5 lists (NULL before: read back as no
counterfactual, 0.0 ms, no rank and empty lists).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("blocks", sa.Column("counterfactual", sa.JSON(), nullable=True))
    op.add_column("blocks", sa.Column("counterfactual_ms", sa.Float(), nullable=True))
    op.add_column("token_events", sa.Column("target_rank", sa.Integer(), nullable=True))
    op.add_column("token_events", sa.Column("target_top", sa.JSON(), nullable=True))
    op.add_column("token_events", sa.Column("draft_top", sa.JSON(), nullable=True))
    op.add_column("token_events", sa.Column("residual_top", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs (SQLite 3.35+), never a batch rebuild: with foreign keys on, dropping the old
    # copy of a parent table (blocks) cascades into its children (token_events).
    op.drop_column("token_events", "residual_top")
    op.drop_column("token_events", "draft_top")
    op.drop_column("token_events", "target_top")
    op.drop_column("token_events", "target_rank")
    op.drop_column("blocks", "counterfactual_ms")
    op.drop_column("blocks", "counterfactual")
