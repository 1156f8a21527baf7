"""every policy version a tenant uploaded (the console shows them and diffs two)

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "policy_versions",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("version", sa.Integer(), primary_key=True),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    # The current version of every tenant's policy is its first history row.
    op.execute("INSERT INTO policy_versions (tenant, version, document, created_at) "
               "SELECT tenant, version, document, updated_at FROM policies")


def downgrade() -> None:
    op.drop_table("policy_versions")
