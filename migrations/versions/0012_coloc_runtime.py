"""Co-location on the agents: memory caps, solo vs co-located iterations, GPU sharing

`allocations.memory_bytes`: the memory cap each rank was launched with on its GPU (NULL
until launched). `iteration_metrics.co_runners`: other jobs sharing rank 0's GPU during
the iteration (0: alone; NULL: not reported). `gpus.sharing`: how co-located jobs share
the GPU, `time-sliced` or `mps`, as its agent reported.

Revision ID: coloc_runtime
Revises: 0008
Create Date: 2026-11-25 19:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "coloc_runtime"
down_revision = "0009_elastic_runtime"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("memory_bytes", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("iteration_metrics", schema=None) as batch_op:
        batch_op.add_column(sa.Column("co_runners", sa.Integer(), nullable=True))
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("sharing", sa.String(length=16), nullable=False, server_default="time-sliced")
        )


def downgrade() -> None:
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.drop_column("sharing")
    with op.batch_alter_table("iteration_metrics", schema=None) as batch_op:
        batch_op.drop_column("co_runners")
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_column("memory_bytes")
