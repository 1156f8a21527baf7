"""PostgreSQL and Redis for the fleet-mode tests: skipped with a reason where unreachable, but a
failure when SEALED_REQUIRE_FLEET_SERVICES=1 (CI starts both services and must not skip)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

PG_ADMIN_URL = os.environ.get("SEALED_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("SEALED_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def unavailable(what: str, exc: Exception) -> None:
    reason = f"{what} unreachable: {type(exc).__name__}: {exc}"
    if os.environ.get("SEALED_REQUIRE_FLEET_SERVICES") == "1":
        pytest.fail(f"{reason} (SEALED_REQUIRE_FLEET_SERVICES=1)")
    pytest.skip(reason)


def redis_client():  # type: ignore[no-untyped-def]
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        client.ping()
        return client
    except Exception as exc:
        unavailable("Redis", exc)


def postgres_database() -> Iterator[str]:
    """A fresh database for one test module, dropped afterwards; yields its SQLAlchemy URL."""
    try:
        from sqlalchemy import create_engine, text

        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
        name = f"sealed_test_{secrets.token_hex(4)}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        unavailable("PostgreSQL", exc)
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
