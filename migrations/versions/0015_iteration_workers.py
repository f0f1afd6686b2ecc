"""iteration_metrics.workers: the job's worker count during each iteration

An elastic job runs at several sizes; its throughput model (Pollux's, fitted by the
snapshot to the step times measured at each size) needs to know which size each
iteration ran at. NULL: not reported (rows from before this revision).

Revision ID: iteration_workers
Revises: code_owners
Create Date: 2026-11-25 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "iteration_workers"
down_revision = "code_owners"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("iteration_metrics", schema=None) as batch_op:
        batch_op.add_column(sa.Column("workers", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("iteration_metrics", schema=None) as batch_op:
        batch_op.drop_column("workers")
