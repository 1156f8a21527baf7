"""The gateway's key cache: long on a single gateway (its management API forgets keys on every change),
none with a shared database (another replica may revoke), and expiry checked at every use."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from api.gateway import catalog as catalog_module
from api.gateway.catalog import CACHE_S, SINGLE_GATEWAY_KEY_CACHE_S, Catalog
from api.gateway.registry import WorkerRegistry
from api.gateway.settings import GatewaySettings
from api.store.db import make_engine, session_factory, upgrade
from api.store.repo import Store, hash_secret


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def _catalog(tmp_path: Path, shared_db: bool) -> tuple[Catalog, Store]:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = make_engine(url)
    upgrade(engine)
    store = Store(session_factory(engine))
    settings = GatewaySettings(data_dir=tmp_path, dev=True, database_url=url if shared_db else None)
    return Catalog(settings, store, WorkerRegistry()), store


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(catalog_module, "time", fake)
    return fake


def test_a_single_gateway_serves_a_known_key_from_memory_until_a_change_forgets_it(tmp_path: Path,
                                                                                    clock: Clock) -> None:
    catalog, store = _catalog(tmp_path, shared_db=False)
    secret, record = store.create_key("acme", "k")
    assert catalog.cached_key(secret) is None  # never looked up: the caller looks it up
    catalog.authenticate(secret)
    clock.now += 60  # a pause far longer than a second
    assert catalog.cached_key(secret) == catalog.authenticate(secret)
    assert catalog.recent_key(secret) is not None  # just authenticated again
    clock.now += CACHE_S + 0.1
    assert catalog.recent_key(secret) is None  # early refusals still use the one-second view
    assert catalog.cached_key(secret) is not None
    clock.now += SINGLE_GATEWAY_KEY_CACHE_S
    assert catalog.cached_key(secret) is None  # the bound holds
    catalog.authenticate(secret)
    store.revoke_key("acme", record.key_id)
    catalog.forget()  # what the management API does on every change (api/management/app.py)
    assert catalog.cached_key(secret) is None


def test_with_a_shared_database_no_key_is_served_from_memory(tmp_path: Path, clock: Clock) -> None:
    catalog, store = _catalog(tmp_path, shared_db=True)
    secret, _ = store.create_key("acme", "k")
    catalog.authenticate(secret)
    assert catalog.cached_key(secret) is None


def test_an_expired_key_is_not_served_from_memory(tmp_path: Path, clock: Clock) -> None:
    catalog, store = _catalog(tmp_path, shared_db=False)
    secret, record = store.create_key("acme", "k")
    catalog.authenticate(secret)
    assert catalog.cached_key(secret) is not None
    # The same cached record, as if its expiry had passed since it was looked up.
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    catalog._cache[("key", hash_secret(secret))] = (clock.now, dataclasses.replace(record, expires_at=past))
    assert catalog.cached_key(secret) is None and catalog.recent_key(secret) is None


@pytest.mark.parametrize("shared_db", [False, True])
def test_the_tenant_hint_outlives_the_early_refusal_view_in_any_mode_and_a_change_forgets_it(
        tmp_path: Path, clock: Clock, shared_db: bool) -> None:
    """Only a scheduling hint (priority_loop.py): kept as long as a single gateway's key cache, also
    with a shared database, where no key is ever served from memory."""
    catalog, store = _catalog(tmp_path, shared_db=shared_db)
    secret, _ = store.create_key("acme", "k")
    assert catalog.tenant_hint(secret) is None
    catalog.authenticate(secret)
    clock.now += 60
    assert catalog.recent_key(secret) is None
    assert catalog.tenant_hint(secret) == "acme"
    assert (catalog.cached_key(secret) is None) == shared_db
    clock.now += SINGLE_GATEWAY_KEY_CACHE_S
    assert catalog.tenant_hint(secret) is None
    catalog.authenticate(secret)
    catalog.forget()
    assert catalog.tenant_hint(secret) is None


def test_the_caller_policy_is_checked_and_compiled_again_only_when_its_row_changes(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog, store = _catalog(tmp_path, shared_db=False)
    made: list[object] = []
    real = catalog_module.caller_policy

    def counted(tenant: str, row: object) -> object:
        made.append(row)
        return real(tenant, row)

    monkeypatch.setattr(catalog_module, "caller_policy", counted)
    assert catalog.caller_policy("acme") is None and len(made) == 1  # no row: no policy
    store.put_policy("acme", {"payload": {"callers": {"allow": []}}, "key_id": "k1"}, admin_key_pem="not a key")
    clock.now += CACHE_S + 0.1
    first = catalog.caller_policy("acme")
    assert len(made) == 2 and type(first).__name__ == "_Unverified"  # a bad admin key: refused, not skipped
    for _ in range(3):  # the row re-read every CACHE_S, unchanged: not made again
        clock.now += CACHE_S + 0.1
        assert catalog.caller_policy("acme") is first
    catalog.forget()
    assert catalog.caller_policy("acme") is first and len(made) == 2
    store.put_policy("acme", {"payload": {"callers": None}, "key_id": "k1"})  # the document changed
    clock.now += CACHE_S + 0.1
    assert catalog.caller_policy("acme") is None and len(made) == 3
