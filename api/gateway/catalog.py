"""Keys and catalog: API key -> tenant, the tenant's model versions and rollout split, which models
a key may reach now; a short cache in front of the control-plane store."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

from api.gateway.callers import caller_policy
from api.gateway.errors import GatewayError
from api.gateway.registry import WorkerRegistry
from api.gateway.settings import GatewaySettings
from api.store.bootstrap import import_bootstrap
from api.store.models import Tenant
from api.store.repo import KeyRecord, Store, hash_secret

CACHE_S = 1.0
# A single gateway keeps a key it authenticated this long: every change to a key (revocation, kill
# switch, scopes) goes through its own management API, which forgets every cached key at once.
SINGLE_GATEWAY_KEY_CACHE_S = 300.0
T = TypeVar("T")


def not_found(model: str) -> GatewayError:
    # Same answer whether the model exists for another tenant or not at all.
    return GatewayError(404, f"The model `{model}` does not exist or you do not have access to it.",
                        code="model_not_found", param="model")


class Catalog:
    def __init__(self, settings: GatewaySettings, store: Store, registry: WorkerRegistry) -> None:
        self.settings, self.store, self.registry = settings, store, registry
        self._cache: dict[tuple, tuple[float, Any]] = {}
        # tenant -> (the policy row it was made from, that row's content digest, the caller policy)
        self._callers: dict[str, tuple[Any, str, Any]] = {}

    def forget(self) -> None:
        """Drop cached catalog and tenant rows (after a management change; other replicas: within CACHE_S)."""
        self._cache.clear()

    def cached(self, key: tuple, compute: Callable[[], T]) -> T:
        hit = self._cache.get(key)
        if hit and time.monotonic() - hit[0] < CACHE_S:
            stored: T = hit[1]  # what `compute` made for this key
            return stored
        value = compute()
        self._cache[key] = (time.monotonic(), value)
        return value

    def bootstrap_keys(self) -> None:
        """Import what `sealed up` wrote before the database existed (api/store/bootstrap.py)."""
        import_bootstrap(self.store, self.settings.data_dir)

    def cached_key(self, secret: str) -> KeyRecord | None:
        """A key this gateway authenticated within SINGLE_GATEWAY_KEY_CACHE_S (no database, no thread
        hop); None: look it up. Only a single gateway caches keys (its management API forgets them on every
        change); with a shared database another replica may revoke a key, so none is served from memory.
        A key's expiry is checked at each use (docs/gateway.md "Known keys stay in memory")."""
        return None if self.settings.database_url else self._authenticated(secret, SINGLE_GATEWAY_KEY_CACHE_S)

    def recent_key(self, secret: str) -> KeyRecord | None:
        """The key this replica authenticated within CACHE_S, in any mode. Only for refusing early
        (admission_gate.py): at worst a key revoked on another replica within that second is
        answered 429 instead of 401; nothing is ever let through on it."""
        return self._authenticated(secret, CACHE_S)

    def tenant_hint(self, secret: str) -> str | None:
        """The tenant of a key this replica authenticated within SINGLE_GATEWAY_KEY_CACHE_S, in any
        mode. Only a scheduling hint (which requests run first, priority_loop.py), never a decision:
        a stale one at worst orders a request's first steps wrongly."""
        key = self._authenticated(secret, SINGLE_GATEWAY_KEY_CACHE_S)
        return key.tenant if key is not None else None

    def _authenticated(self, secret: str, within_s: float) -> KeyRecord | None:
        hit = self._cache.get(("key", hash_secret(secret)))
        if not hit:
            return None
        key: KeyRecord = hit[1]  # ("key", hash) entries hold the KeyRecord that authenticate() found
        if time.monotonic() - hit[0] < within_s and not key.expired(dt.datetime.now(dt.UTC)):
            return key
        return None

    def authenticate(self, secret: str) -> KeyRecord:
        key = self.store.lookup_key(secret)
        if key is None:
            self.bootstrap_keys()
            key = self.store.lookup_key(secret)
        if key is None or key.expired(dt.datetime.now(dt.UTC)):
            raise GatewayError(401, "Incorrect API key provided.", code="invalid_api_key")
        self._cache[("key", hash_secret(secret))] = (time.monotonic(), key)
        return key

    def split(self, tenant: str, model: str) -> dict[str, float]:
        return self.cached(("split", tenant, model), lambda: {
            v.version: v.traffic_percent for v in self.store.model_versions(tenant) if v.model == model})

    def models_for(self, key: KeyRecord) -> list[str]:
        """Models a request can be answered for now: a ready (and, where required, attested) worker
        holds them. A model in the catalog whose workers are still loading is not listed yet."""
        names = {w.model for w in self.registry.workers.values() if w.tenant == key.tenant}
        return sorted(n for n in names if (not key.models or n in key.models) and self.registry.ready(key.tenant, n))

    def resolve(self, key: KeyRecord, model: str) -> dict[str, float]:
        if key.models and model not in key.models:
            raise not_found(model)
        split = self.split(key.tenant, model)
        if not split and not self.registry.for_model(key.tenant, model):
            raise not_found(model)
        return split

    def tenant(self, name: str) -> Tenant | None:
        return self.cached(("tenant", name), lambda: self.store.tenant(name))

    def tokens_used(self, tenant: str, key_id: str | None) -> int:
        return self.cached(("used", tenant) if key_id is None else ("used", tenant, key_id),
                           lambda: self.store.tokens_used(tenant, key_id))

    def caller_policy(self, tenant: str) -> Any:
        """The tenant's signed caller policy as the gateway enforces it for plaintext (api/gateway/callers.py).
        The row is re-read within CACHE_S like any other; its signature is checked and its rules compiled
        again only when its content changed (a digest of the document and the admin key): that work was
        about a tenth of a search's gateway CPU, and all of it for a request arriving once a second."""
        row = self._policy_row(tenant)
        hit = self._callers.get(tenant)
        if hit is not None and hit[0] is row:
            return hit[2]
        digest = _row_digest(row)
        if hit is not None and hit[1] == digest:
            self._callers[tenant] = (row, digest, hit[2])
            return hit[2]
        policy = caller_policy(tenant, row)
        self._callers[tenant] = (row, digest, policy)
        return policy

    def policy_document(self, tenant: str) -> Any:
        """The tenant's stored policy set as stored (signed envelope), or None."""
        row = self._policy_row(tenant)
        return row.document if row is not None else None

    def _policy_row(self, tenant: str) -> Any:
        return self.cached(("policy", tenant), lambda: self.store.policy(tenant))

    def require_sealed(self, tenant: str) -> bool:
        """The tenant's policy says `require_sealed` (its worker enforces the signed original too)."""
        doc = self.policy_document(tenant)
        payload = doc.get("payload", doc) if isinstance(doc, dict) else None
        return isinstance(payload, dict) and payload.get("require_sealed") is True


def _row_digest(row: Any) -> str:
    """What a caller policy is made from: the stored document and the admin key it is checked with."""
    if row is None:
        return ""
    material = json.dumps([row.document, row.admin_key_pem], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(material.encode()).hexdigest()
