"""code_owners: who uploaded each code archive; only they may name it in a spec

Any user who knew a digest could run that archive. An archive now belongs to each user
who uploaded it (content-addressed: one row of code, several owners). Existing archives
go to the owners of the jobs that name them; one no job names stays ownerless until
uploaded again (or expired).

Revision ID: code_owners
Revises: queues_quotas
Create Date: 2026-11-25 23:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "code_owners"
down_revision = "queues_quotas"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "code_owners",
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["digest"],
            ["code_archives.digest"],
            name=op.f("fk_code_owners_digest_code_archives"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_code_owners_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("digest", "user_id", name=op.f("pk_code_owners")),
    )
    op.execute(
        "INSERT INTO code_owners (digest, user_id) "
        "SELECT DISTINCT jobs.code_digest, jobs.owner_id FROM jobs "
        "JOIN code_archives ON code_archives.digest = jobs.code_digest"
    )


def downgrade() -> None:
    op.drop_table("code_owners")
