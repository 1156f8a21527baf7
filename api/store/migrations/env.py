"""Alembic environment: run against the connection handed in by api.store.db.upgrade, or a URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from api.store.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("alembic: no connection given and no sqlalchemy.url set")
    with create_engine(url).begin() as conn:
        context.configure(connection=conn, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
