"""server-side revocable sessions: console sessions and management-token revocations

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("jti", sa.String(64), primary_key=True),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=True),
        sa.Column("token_jti", sa.String(64), nullable=False),
        sa.Column("issued_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_console_sessions_subject", "console_sessions", ["subject"])
    op.create_index("ix_console_sessions_tenant", "console_sessions", ["tenant"])
    op.create_table(
        "token_revocations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("value", sa.String(256), nullable=False),
        sa.Column("issued_until", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_token_revocations_kind", "token_revocations", ["kind"])
    op.create_index("ix_token_revocations_value", "token_revocations", ["value"])


def downgrade() -> None:
    op.drop_table("token_revocations")
    op.drop_table("console_sessions")
