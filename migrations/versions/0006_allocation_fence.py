"""allocations: the attempt (fence) of the run a hold belongs to, and its agent

A job's placements are numbered (`jobs.attempts`); each allocation keeps its number and
a digest of the agent process it was launched to, so that a run of an older placement,
or a claim from another agent process, is never taken for the current one.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("agent_instance", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_column("agent_instance")
        batch_op.drop_column("attempt")
