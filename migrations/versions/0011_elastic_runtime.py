"""iteration_metrics: each step's global batch, learning rate and gradient noise

Elastic and adaptive-batch jobs report the batch and rate each step ran with and the
gradient noise the runtime measured (|G|^2 and tr(Sigma) at the job's base batch), which
goodput's statistical efficiency is computed from; NULL where not measured.

Revision ID: 0009_elastic_runtime
Revises: 0008
Create Date: 2026-11-25 19:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_elastic_runtime"
down_revision = "0009_code_upload"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("batch_size", sa.Integer()),
    ("learning_rate", sa.Float()),
    ("grad_sqr", sa.Float()),
    ("grad_var", sa.Float()),
)


def upgrade() -> None:
    with op.batch_alter_table("iteration_metrics", schema=None) as batch_op:
        for name, kind in _COLUMNS:
            batch_op.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("iteration_metrics", schema=None) as batch_op:
        for name, _ in reversed(_COLUMNS):
            batch_op.drop_column(name)
