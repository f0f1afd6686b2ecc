"""jobs.pending_reason: why a waiting job cannot be placed

A job asking for more GPUs than the cluster can gang together waited with nothing to
say why. The scheduler loop now stores the reason each round (NULL while a job could
be placed, or is not waiting).

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-25 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pending_reason", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("pending_reason")
