"""usage: one row per (worker, request id), enforced by the database

Two gateway replicas can receive the same usage record at once (on the call to one, owed by a
heartbeat to the other); a check-then-insert in each let both rows in. Existing duplicates are
removed (the lowest id of each pair stays) before the unique index is created.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text(
        "DELETE FROM usage WHERE id NOT IN "
        "(SELECT keep FROM (SELECT MIN(id) AS keep FROM usage GROUP BY worker_id, request_id) AS firsts)"))
    op.create_index("ux_usage_worker_request", "usage", ["worker_id", "request_id"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_usage_worker_request", table_name="usage")
