"""allocations: the configuration version of a job's current hold

A policy may change a running job's SPB configuration at a lease boundary; each change
bumps the version the agents see (LaunchCommand starts a run at version 0).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 08:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("config_version", sa.Integer(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_column("config_version")
