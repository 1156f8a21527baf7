"""model version lifecycle (retired), replica bounds, the control loop's observed status; the
tenant policy's admin key

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("retired", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("max_replicas", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("status", sa.String(32), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("status_reason", sa.String(256), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("ttft_slo_ms", sa.Integer(), nullable=True))
    with op.batch_alter_table("policies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("admin_key_pem", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("policies", schema=None) as batch_op:
        batch_op.drop_column("admin_key_pem")
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        for name in ("ttft_slo_ms", "status_reason", "status", "max_replicas", "retired"):
            batch_op.drop_column(name)
