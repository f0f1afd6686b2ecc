"""iteration_metrics: the job's mean SPB depth at each reported iteration

The dashboard charts how deep a job backpropagated over time (configurations change at
lease boundaries, roles may rotate); NULL for jobs that run plain DDP.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 13:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("iteration_metrics", schema=None) as batch_op:
        batch_op.add_column(sa.Column("spb_depth", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("iteration_metrics", schema=None) as batch_op:
        batch_op.drop_column("spb_depth")
