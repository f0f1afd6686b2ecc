"""code_archives: jobs' uploaded code; jobs.code_digest: the archive a job runs

A code archive is a gzipped tar (`jigsaw.codearchive`) stored by its SHA-256 digest;
`jobs.code_digest` (NULL: none) is the job spec's `code`, indexed so the retention
sweep finds the archives no job needs any more.

Revision ID: 0009_code_upload
Revises: 0008
Create Date: 2026-11-25 19:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_code_upload"
down_revision = "job_suspended_by"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "code_archives",
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("uploaded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_code_archives")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("code_digest", sa.String(length=71), nullable=True))
        batch_op.create_index("ix_jobs_code_digest", ["code_digest"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_code_digest")
        batch_op.drop_column("code_digest")
    op.drop_table("code_archives")
