"""files, vector_stores, vector_store_files, vector_store_file_batches: the Files and Vector Stores
APIs (api/store/retrieval.py). A file's content and a store's corpus and index are ciphertext that
workers sealed (enclave_worker/retrieval/service.py); the clear columns are routing, sizes, status.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False, index=True),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(256), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "vector_stores",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False, index=True),
        sa.Column("name", sa.String(256), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        sa.Column("snapshot", sa.LargeBinary(), nullable=False),
        sa.Column("snapshot_version", sa.BigInteger(), nullable=False),
        sa.Column("usage_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "vector_store_files",
        sa.Column("store_id", sa.String(64), sa.ForeignKey("vector_stores.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("file_id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False, index=True),
        sa.Column("batch_id", sa.String(64), nullable=True, index=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error_code", sa.String(32), nullable=True),
        sa.Column("error_message", sa.String(256), nullable=True),
        sa.Column("usage_bytes", sa.BigInteger(), nullable=False),
        sa.Column("attributes", sa.JSON(), nullable=False),
        sa.Column("chunking", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("vector_store_files")
    op.drop_table("vector_stores")
    op.drop_table("files")
