"""queues: named GPU quotas with borrowing, fair-share weight, one level of parents

Jobs named a free-text queue that nothing defined. A queue is now a row: its quota
(GPUs guaranteed; NULL: what the other queues' quotas leave of the cluster), borrowing
limit (NULL: none), weight, optional parent and the users who may submit to it (empty:
everyone). `default` is created here, so every existing job's queue exists.
`jobs.estimated_start_at`: when a waiting job would start, where the policy can tell.

Revision ID: queues_quotas
Revises: 0008
Create Date: 2026-11-25 19:30:00
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "queues_quotas"
down_revision = "coloc_runtime"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("estimated_start_at", sa.DateTime(timezone=True), nullable=True)
        )
    queues = op.create_table(
        "queues",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(length=64), nullable=False, unique=True),
        sa.Column("quota", sa.Integer(), nullable=True),
        sa.Column("borrowing_limit", sa.Integer(), nullable=True),
        sa.Column("weight", sa.Float(), nullable=False, server_default="1"),
        sa.Column(
            "parent_id",
            sa.Integer(),
            sa.ForeignKey("queues.id", ondelete="RESTRICT"),
            nullable=True,
        ),
        sa.Column("users", sa.JSON(), nullable=False, server_default="[]"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.bulk_insert(
        queues,
        [
            {
                "name": "default",
                "quota": None,
                "borrowing_limit": None,
                "weight": 1.0,
                "parent_id": None,
                "users": [],
                "created_at": datetime.now(UTC),
            }
        ],
    )


def downgrade() -> None:
    op.drop_table("queues")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("estimated_start_at")
