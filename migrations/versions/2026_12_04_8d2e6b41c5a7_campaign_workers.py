"""Campaigns keep where their runner stands: each worker's load while the campaign runs.

Revision ID: 8d2e6b41c5a7
Revises: 3f1c2a9b7d10
Create Date: 2026-12-04 22:10:00

``campaigns.workers`` (JSON, NULL when no run is going on): the runner's name, when it was
sampled, and per worker its name, kind, jobs running, jobs queued and jobs done.
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = '8d2e6b41c5a7'
down_revision: str | Sequence[str] | None = '3f1c2a9b7d10'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('campaigns', schema=None) as batch_op:
        batch_op.add_column(sa.Column('workers', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('campaigns', schema=None) as batch_op:
        batch_op.drop_column('workers')
