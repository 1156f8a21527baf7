"""Control-plane state: SQLAlchemy models and alembic migrations (SQLite default, PostgreSQL for fleets)."""
