"""Control-plane state through alembic-migrated SQLAlchemy: SQLite always, PostgreSQL where reachable."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.gateway.limits import RedisLimiterStore, RedisQueueCounter
from api.store.db import make_engine, session_factory, upgrade
from api.store.models import UsageRow
from api.store.repo import Store
from policy.limiter import TokenBucketLimiter
from protocol.model_ref import ModelRef
from tests.api.fleet import postgres_database, redis_client
from tests.api.signed_usage import signed_row


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url, cleanup = f"sqlite:///{tmp_path / 'cp.db'}", None
    else:
        cleanup = postgres_database()
        url = next(cleanup)
    engine = make_engine(url)
    upgrade(engine)
    upgrade(engine)  # idempotent: a second replica starting finds the schema current
    yield Store(session_factory(engine))
    engine.dispose()
    if cleanup is not None:
        next(cleanup, None)


def test_keys_are_hashed_scoped_expirable_and_revocable(store: Store) -> None:
    secret, rec = store.create_key("acme", "ci", models=("m1",))
    assert secret.startswith("sk-sealed-")
    found = store.lookup_key(secret)
    assert found is not None and found.tenant == "acme" and found.models == ("m1",)
    assert store.lookup_key(secret + "x") is None
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    old, _ = store.create_key("acme", "old", expires_at=past)
    assert store.lookup_key(old).expired(dt.datetime.now(dt.UTC))  # type: ignore[union-attr]
    assert store.revoke_key("acme", rec.key_id) and store.lookup_key(secret) is None


def test_a_keys_id_derives_from_the_key(store: Store) -> None:
    """Sealed mode binds the API key id into a request's associated data; the client computes it from
    the key it holds (protocol.sealed.api_key_id), so the control plane must name keys the same way."""
    from protocol.sealed import api_key_id

    secret, rec = store.create_key("acme", "ci")
    other, other_rec = store.create_key("acme", "ci-2")
    assert rec.key_id == api_key_id(secret) and other_rec.key_id == api_key_id(other) != rec.key_id


def test_agent_kill_switch_is_per_key_reversible_and_scoped_to_its_tenant(store: Store) -> None:
    secret, rec = store.create_key("acme", "agent")
    other_secret, _ = store.create_key("acme", "other")
    assert store.lookup_key(secret).tools_killed is False  # type: ignore[union-attr]
    assert not store.set_tools_killed("globex", rec.key_id, True)  # another tenant's key: nothing changes
    assert not store.set_tools_killed("acme", "key_missing", True)
    assert store.lookup_key(secret).tools_killed is False  # type: ignore[union-attr]
    assert store.set_tools_killed("acme", rec.key_id, True)
    assert store.lookup_key(secret).tools_killed is True  # type: ignore[union-attr]
    assert store.lookup_key(other_secret).tools_killed is False  # type: ignore[union-attr]
    assert store.set_tools_killed("acme", rec.key_id, False)
    assert store.lookup_key(secret).tools_killed is False  # type: ignore[union-attr]
    store.revoke_key("acme", rec.key_id)
    assert not store.set_tools_killed("acme", rec.key_id, True)  # a revoked key is gone


def test_rollout_is_gradual_and_rollback_is_one_call(store: Store) -> None:
    store.upsert_version(ModelRef("acme", "m", "v1"))
    store.upsert_version(ModelRef("acme", "m", "v2"))
    split = {v.version: v.traffic_percent for v in store.model_versions("acme")}
    assert split == {"v1": 100.0, "v2": 0.0}
    store.set_rollout(ModelRef("acme", "m", "v2"), 10)
    store.set_rollout(ModelRef("acme", "m", "v2"), 50)
    assert {v.version: v.traffic_percent for v in store.model_versions("acme")} == {"v1": 50.0, "v2": 50.0}
    store.rollback("acme", "m")
    assert {v.version: v.traffic_percent for v in store.model_versions("acme")} == {"v1": 90.0, "v2": 10.0}


def test_usage_per_tenant_and_key(store: Store) -> None:
    store.ensure_tenant("acme", token_budget=1000)
    for i, (key, (p, c)) in enumerate((("k1", (10, 5)), ("k1", (3, 2)), ("k2", (1, 1)))):
        store.record_usage(signed_row(store, request_id=f"r{i}", tenant="acme", key_id=key, worker_id="w",
                                      prompt_tokens=p, completion_tokens=c, worker_seconds=0.5))
    store.record_usage(UsageRow(request_id="r-unsigned", tenant="acme", key_id="k1", model="m", version="v1",
                                worker_id="w", prompt_tokens=10**6, completion_tokens=0, worker_seconds=0.5,
                                signature="00"))  # no signed record: flagged, never counted
    rows = {r["key_id"]: r for r in store.usage_summary("acme")}
    assert [f["request_id"] for f in store.usage_ledger("acme").flagged] == ["r-unsigned"]
    assert rows["k1"]["requests"] == 2 and rows["k1"]["prompt_tokens"] == 13 and rows["k2"]["completion_tokens"] == 1
    assert store.tokens_used("acme") == 22 + 10**6  # the budget's running sum is the stored rows' (docs/security.md)


def test_a_usage_record_is_stored_once_per_worker_and_request(store: Store) -> None:
    """#35: a record can arrive twice (on the call, and owed by heartbeat when the worker could not
    tell the call delivered it); it is metered once. Another worker's record of that id is its own."""
    def row(worker: str) -> UsageRow:
        return UsageRow(request_id="r", tenant="acme", key_id="k", model="m", version="v1", worker_id=worker,
                        prompt_tokens=5, completion_tokens=5, worker_seconds=0.5, signature="00")

    assert store.record_usage_batch([row("w"), row("w")]) == [True, False]
    assert store.record_usage_batch([row("w"), row("w2")]) == [False, True]
    assert store.tokens_used("acme") == 20


def test_two_replicas_storing_the_same_record_at_once_meter_it_once(store: Store) -> None:
    """The database's unique index decides, not a check-then-insert in each replica: eight threads,
    each its own store (its own connection pool, as two gateway processes), race on one batch."""
    import threading

    other = Store(session_factory(make_engine(str(store.sessions.kw["bind"].url))))
    barrier = threading.Barrier(8)
    results: list[list[bool]] = []

    def race(target: Store) -> None:
        rows = [UsageRow(request_id=f"r{i}", tenant="acme", key_id="k", model="m", version="v1", worker_id="w",
                         prompt_tokens=1, completion_tokens=1, worker_seconds=0.1, signature="00") for i in range(20)]
        barrier.wait()
        results.append(target.record_usage_batch(rows))

    threads = [threading.Thread(target=race, args=(store if i % 2 else other,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8
    assert [sum(column) for column in zip(*results, strict=True)] == [1] * 20  # each record stored once
    assert store.tokens_used("acme") == 40


def test_redis_limiter_store_is_shared_between_limiters() -> None:
    client = redis_client()
    prefix = f"sealed-test:{id(client)}:"
    a = TokenBucketLimiter(RedisLimiterStore(client, prefix=prefix))
    b = TokenBucketLimiter(RedisLimiterStore(client, prefix=prefix))
    spec = TokenBucketLimiter.per_minute(3)
    taken = [lim.try_acquire("rpm:k", spec) for lim in (a, b, a, b, a)]
    assert taken == [True, True, True, False, False]
    counter = RedisQueueCounter(client, prefix=prefix + "q:")
    assert counter.enter("t", 1) and not counter.enter("t", 1)
    counter.leave("t")
    assert counter.enter("t", 1)
    client.delete(*client.keys(prefix + "*"))


def test_tenant_and_key_token_budgets_are_enforced_at_admission(store: Store, tmp_path: Path) -> None:
    from api.app import build_gateway
    from api.gateway.errors import GatewayError
    from api.gateway.settings import GatewaySettings

    store.ensure_tenant("acme", token_budget=1000)
    _, capped = store.create_key("acme", "capped", token_budget=20)
    _, free = store.create_key("acme", "free")
    service = build_gateway(GatewaySettings(data_dir=tmp_path, dev=True), store)
    service.admissions.ticket(capped, reserved_tokens=10)  # under both budgets
    store.record_usage(UsageRow(request_id="r", tenant="acme", key_id=capped.key_id, model="m", version="v1",
                                worker_id="w", prompt_tokens=15, completion_tokens=5, worker_seconds=0.1,
                                signature="00"))
    service.catalog.forget()
    with pytest.raises(GatewayError) as err:
        service.admissions.ticket(capped, reserved_tokens=10)
    assert err.value.status == 429 and err.value.code == "insufficient_quota" and "key" in err.value.message
    service.admissions.ticket(free, reserved_tokens=10)  # the tenant budget still has room for its other keys
    store.record_usage(UsageRow(request_id="r2", tenant="acme", key_id=free.key_id, model="m", version="v1",
                                worker_id="w", prompt_tokens=990, completion_tokens=0, worker_seconds=0.1,
                                signature="00"))
    service.catalog.forget()
    with pytest.raises(GatewayError, match="token budget"):
        service.admissions.ticket(free, reserved_tokens=10)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_unique_usage_migration_keeps_the_first_of_existing_duplicates(dialect: str, tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from api.store.db import MIGRATIONS

    cleanup = None
    if dialect == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
    else:
        cleanup = postgres_database()
        url = next(cleanup)
    engine = make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0006")
    with engine.begin() as conn:
        for i, worker in enumerate(["w", "w", "w2", "w"]):
            conn.execute(text("INSERT INTO usage (request_id, tenant, key_id, model, version, worker_id, "
                              "prompt_tokens, completion_tokens, worker_seconds, signature, created_at) VALUES "
                              "('r', 'acme', 'k', 'm', 'v1', :w, :p, 0, 0.0, '00', CURRENT_TIMESTAMP)"),
                         {"w": worker, "p": 10 + i})
    upgrade(engine)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT worker_id, prompt_tokens FROM usage ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [("w", 10), ("w2", 12)]
    engine.dispose()
    if cleanup is not None:
        next(cleanup, None)
