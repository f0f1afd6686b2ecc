"""gpus.max_jobs: the jobs a GPU slot runs at once, as its agent reported

The agent's JIGSAW_AGENT_MAX_JOBS_PER_GPU, which packing must not exceed (a placement
beyond it is refused by the agent). Rows from before this revision: 2, the pair JigSaw
placed at most until then.

Revision ID: gpu_max_jobs
Revises: iteration_workers
Create Date: 2026-11-26 15:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "gpu_max_jobs"
down_revision = "iteration_workers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_jobs", sa.Integer(), nullable=False, server_default="2"))


def downgrade() -> None:
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.drop_column("max_jobs")
