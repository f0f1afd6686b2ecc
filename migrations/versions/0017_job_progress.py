"""jobs.progress and iteration_metrics.progress: steps of the base batch done

An adaptive-batch job's `max_iterations` counts steps of its base batch, a step at a
larger batch counting AdaScale's gain (the runtime reports the sum with each record), so
its progress is no longer its iteration count. Rows from before this revision: jobs'
progress is their iterations done; iteration rows' is NULL (the iteration itself).

Revision ID: job_progress
Revises: gpu_max_jobs
Create Date: 2026-11-27 01:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "job_progress"
down_revision = "gpu_max_jobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("progress", sa.Float(), nullable=False, server_default="0"))
    op.execute("UPDATE jobs SET progress = iterations_done")
    with op.batch_alter_table("iteration_metrics", schema=None) as batch_op:
        batch_op.add_column(sa.Column("progress", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("iteration_metrics", schema=None) as batch_op:
        batch_op.drop_column("progress")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("progress")
