"""conversations.sealed_state: a conversation made in sealed mode is one worker-sealed blob (all its
items and metadata; enclave_worker/sealed_conversation.py), kept here in place of item rows. NULL
for a plaintext-mode conversation.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("conversations") as batch:
        batch.add_column(sa.Column("sealed_state", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("conversations") as batch:
        batch.drop_column("sealed_state")
