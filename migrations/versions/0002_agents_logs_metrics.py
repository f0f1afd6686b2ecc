"""worker agents: job logs, last evaluation metrics and crash count of jobs

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 01:00:00
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
        "job_logs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_logs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_logs")),
    )
    with op.batch_alter_table("job_logs", schema=None) as batch_op:
        batch_op.create_index("ix_job_logs_job_id_id", ["job_id", "id"], unique=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("failures", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("metrics", sa.JSON(), server_default="{}", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("metrics")
        batch_op.drop_column("failures")
    with op.batch_alter_table("job_logs", schema=None) as batch_op:
        batch_op.drop_index("ix_job_logs_job_id_id")
    op.drop_table("job_logs")
