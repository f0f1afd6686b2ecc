"""jobs.suspended_by: who suspended a SUSPENDED job (user, policy or drain)

A policy's or a drain's suspension was recorded as a message string ("suspended by
policy", "suspended: its node was drained") and recovered by comparing messages. The
typed column says it; rows suspended before this revision get it from their message.

Revision ID: job_suspended_by
Revises: 0008
Create Date: 2026-11-25 20:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "job_suspended_by"
down_revision = "0008"
branch_labels = None
depends_on = None

# The messages the scheduler wrote before this revision, as they were then.
_BY_MESSAGE = {
    "suspended by policy": "policy",
    "suspended: its node was drained": "drain",
}


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("suspended_by", sa.String(length=16), nullable=True))
    jobs = sa.table(
        "jobs",
        sa.column("state", sa.String),
        sa.column("message", sa.Text),
        sa.column("suspended_by", sa.String),
    )
    suspended = jobs.c.state == "SUSPENDED"
    for message, who in _BY_MESSAGE.items():
        op.execute(
            jobs.update().where(suspended, jobs.c.message == message).values(suspended_by=who)
        )
    op.execute(
        jobs.update().where(suspended, jobs.c.suspended_by.is_(None)).values(suspended_by="user")
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("suspended_by")
