"""response_states, conversations, conversation_items: stored Responses API state and the
Conversations API's items, ciphertext sealed by workers (api/store/states.py, conversations.py)

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "response_states",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False, index=True),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        sa.Column("previous_id", sa.String(64), nullable=True),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("blob_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False, index=True),
    )

    op.create_table(
        "conversations",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False, index=True),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("version", sa.String(128), nullable=True),
        sa.Column("metadata_blob", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False, index=True),
    )
    op.create_table(
        "conversation_items",
        sa.Column("conversation_id", sa.String(64), sa.ForeignKey("conversations.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("conversation_items")
    op.drop_table("conversations")
    op.drop_table("response_states")
