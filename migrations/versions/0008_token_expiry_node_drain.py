"""api_tokens: expiry and last use; nodes: an operator's drain and removal

`api_tokens.expires_at` (NULL: never) and `last_used_at` (written at most once per
minute per token). `nodes.drained_at` is the admin's drain (no new placements), kept
apart from the Kubernetes inventory's `schedulable` so neither undoes the other;
`nodes.removed_at` hides a decommissioned node while its allocation history stays.

Revision ID: 0008
Revises: 0005
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("drained_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("removed_at")
        batch_op.drop_column("drained_at")
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_column("last_used_at")
        batch_op.drop_column("expires_at")
