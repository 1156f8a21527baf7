"""Engine and sessions; the schema is brought up to date with alembic at start-up."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'control-plane.db'}"


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _wal(conn, _record):  # type: ignore[no-untyped-def]
            # WAL: readers do not block the writer (the gateway reads keys while it records usage).
            conn.execute("PRAGMA journal_mode=WAL")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def upgrade(engine: Engine) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # Gateway replicas may start together: one migrates, the others wait for it.
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7355608)")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
