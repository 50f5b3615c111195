"""Schema version 2: stored `sd2 bench` results (POST /benchmarks).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "benchmarks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("measured_at", sa.String(40), nullable=False),
        sa.Column("label", sa.String(200), nullable=True),
        sa.Column("command", sa.Text(), nullable=False),
        sa.Column("bench_schema_version", sa.Integer(), nullable=False),
        sa.Column("machine", sa.JSON(), nullable=False),
        sa.Column("models", sa.JSON(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("prompt_sets", sa.JSON(), nullable=False),
        sa.Column("forward_times", sa.JSON(), nullable=False),
        sa.Column("cells", sa.JSON(), nullable=False),
        sa.Column("best_k", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_benchmarks_created_at", "benchmarks", ["created_at"])


def downgrade() -> None:
    op.drop_table("benchmarks")
