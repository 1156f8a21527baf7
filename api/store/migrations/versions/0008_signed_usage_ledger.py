"""usage: the signed record and its key in each row; usage_keys: the attestation binding each key

Rows stored before this revision have neither and count for nothing when the ledger is read.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage", schema=None) as batch_op:
        batch_op.add_column(sa.Column("payload", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("public_key", sa.String(64), nullable=True))
    op.create_table(
        "usage_keys",
        sa.Column("public_key", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False, index=True),
        sa.Column("worker_id", sa.String(64), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("usage_keys")
    with op.batch_alter_table("usage", schema=None) as batch_op:
        batch_op.drop_column("public_key")
        batch_op.drop_column("payload")
