"""Queries over the control-plane tables, used by the gateway and the management API."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from api.store.ledger import (
    Ledger,
    export_ledger,
    read_ledger,
    registered_usage_keys,
    remember_usage_key,
    verified_rows,
)
from api.store.models import ApiKeyRow, ModelVersion, PolicyRow, PolicyVersionRow, Tenant, UsageRow, utcnow
from api.store.revocation import Revocations
from protocol.model_ref import ModelRef
from protocol.sealed.hpke import api_key_id

KEY_PREFIX = "sk-sealed-"
_USAGE_COLUMNS = ("request_id", "tenant", "key_id", "model", "version", "worker_id", "prompt_tokens",
                  "completion_tokens", "worker_seconds", "signature", "payload", "public_key")


def _dialect_insert(session: Session) -> Callable[..., Any]:
    """INSERT with ON CONFLICT for the session's database (PostgreSQL in fleet mode, else SQLite)."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert
    return sqlite.insert


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class KeyRecord:
    key_id: str
    tenant: str
    name: str
    models: tuple[str, ...]
    expires_at: dt.datetime | None
    rpm: int | None
    tpm: int | None
    priority: int
    token_budget: int | None = None
    tools_killed: bool = False  # agent kill switch (docs/policy.md)

    def expired(self, now: dt.datetime) -> bool:
        if self.expires_at is None:
            return False
        exp = self.expires_at if self.expires_at.tzinfo else self.expires_at.replace(tzinfo=dt.UTC)
        return now >= exp


def _record(row: ApiKeyRow) -> KeyRecord:
    return KeyRecord(row.key_id, row.tenant, row.name, tuple(row.models or ()), row.expires_at, row.rpm, row.tpm,
                     row.priority, row.token_budget, bool(row.tools_killed))


class Store:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self.revocations = Revocations(sessions)  # console sessions and management tokens

    # -- tenants
    def ensure_tenant(self, name: str, **fields: object) -> Tenant:
        with self.sessions.begin() as s:
            row = s.get(Tenant, name)
            if row is None:
                row = Tenant(name=name, weight=1.0)
                s.add(row)
            for k, v in fields.items():
                setattr(row, k, v)
            s.flush()
            s.expunge(row)
            return row

    def tenant(self, name: str) -> Tenant | None:
        with self.sessions() as s:
            return s.get(Tenant, name)

    def tenants(self) -> list[Tenant]:
        with self.sessions() as s:
            return list(s.scalars(select(Tenant).order_by(Tenant.name)))

    def remove_tenant(self, name: str) -> bool:
        """The tenant, its API keys and its traffic go (its versions are retired: workers drain and
        stop; usage and policy history stay for the audit); False when there is no such tenant.
        Its console sessions and management tokens are revoked with it."""
        if self.tenant(name) is None:
            return False
        self.revocations.revoke("tenant", name)  # first: a failure below leaves no session behind
        with self.sessions.begin() as s:
            s.execute(delete(ApiKeyRow).where(ApiKeyRow.tenant == name))
            s.execute(update(ModelVersion).where(ModelVersion.tenant == name)
                      .values(traffic_percent=0.0, previous_percent=None, min_warm=0, retired=True))
            s.execute(delete(Tenant).where(Tenant.name == name))
        return True

    # -- API keys
    def create_key(self, tenant: str, name: str, models: tuple[str, ...] = (), expires_at: dt.datetime | None = None,
                   rpm: int | None = None, tpm: int | None = None, priority: int = 0,
                   secret: str | None = None, token_budget: int | None = None) -> tuple[str, KeyRecord]:
        self.ensure_tenant(tenant)
        secret = secret or KEY_PREFIX + secrets.token_urlsafe(32)
        # The id derives from the secret (sealed mode: the client computes it and binds it into the
        # request's associated data, so the gateway cannot relabel a request with another key's id).
        row = ApiKeyRow(key_hash=hash_secret(secret), key_id=api_key_id(secret), tenant=tenant, name=name,
                        models=list(models), expires_at=expires_at, rpm=rpm, tpm=tpm, priority=priority,
                        token_budget=token_budget)
        with self.sessions.begin() as s:
            s.add(row)
        return secret, _record(row)

    def import_key_hash(self, key_hash: str, tenant: str, name: str, models: tuple[str, ...],
                        expires_at: dt.datetime | None) -> None:
        """Bootstrap keys made before the database existed (`api-keys.json`): their hashes move over."""
        self.ensure_tenant(tenant)
        with self.sessions.begin() as s:
            if s.get(ApiKeyRow, key_hash) is None:
                s.add(ApiKeyRow(key_hash=key_hash, key_id=f"key_{key_hash[:16]}", tenant=tenant, name=name,
                                models=list(models), expires_at=expires_at))

    def lookup_key(self, secret: str) -> KeyRecord | None:
        wanted = hash_secret(secret)
        with self.sessions() as s:
            row = s.get(ApiKeyRow, wanted)
            if row is None or row.revoked or not hmac.compare_digest(row.key_hash, wanted):
                return None
            return _record(row)

    def keys(self, tenant: str) -> list[KeyRecord]:
        with self.sessions() as s:
            rows = s.scalars(select(ApiKeyRow).where(ApiKeyRow.tenant == tenant, ApiKeyRow.revoked.is_(False)))
            return [_record(r) for r in rows]

    def revoke_key(self, tenant: str, key_id: str) -> bool:
        with self.sessions.begin() as s:
            row = s.scalar(select(ApiKeyRow).where(ApiKeyRow.tenant == tenant, ApiKeyRow.key_id == key_id))
            if row is None:
                return False
            row.revoked = True
            return True

    def set_tools_killed(self, tenant: str, key_id: str, killed: bool) -> bool:
        """Flip a key's agent kill switch; False when the tenant has no such live key."""
        with self.sessions.begin() as s:
            row = s.scalar(select(ApiKeyRow).where(ApiKeyRow.tenant == tenant, ApiKeyRow.key_id == key_id,
                                                   ApiKeyRow.revoked.is_(False)))
            if row is None:
                return False
            row.tools_killed = killed
            return True

    # -- model versions and rollouts
    def model_versions(self, tenant: str | None = None) -> list[ModelVersion]:
        with self.sessions() as s:
            q = select(ModelVersion).order_by(ModelVersion.tenant, ModelVersion.model, ModelVersion.version)
            if tenant is not None:
                q = q.where(ModelVersion.tenant == tenant)
            return list(s.scalars(q))

    def upsert_version(self, ref: ModelRef, traffic_percent: float | None = None, min_warm: int | None = None,
                       max_replicas: int | None = None, ttft_slo_ms: int | None = None) -> ModelVersion:
        tenant, model, version = ref.tenant, ref.model, ref.version
        self.ensure_tenant(tenant)
        with self.sessions.begin() as s:
            row = s.scalar(select(ModelVersion).where(ModelVersion.tenant == tenant, ModelVersion.model == model,
                                                      ModelVersion.version == version))
            if row is None:
                first = s.scalar(select(func.count()).select_from(ModelVersion).where(
                    ModelVersion.tenant == tenant, ModelVersion.model == model)) == 0
                row = ModelVersion(tenant=tenant, model=model, version=version,
                                   traffic_percent=100.0 if first else 0.0, min_warm=1)
                s.add(row)
            if traffic_percent is not None:
                row.traffic_percent = traffic_percent
            if min_warm is not None:
                row.min_warm = min_warm
            if max_replicas is not None:
                row.max_replicas = max_replicas
            if ttft_slo_ms is not None:
                row.ttft_slo_ms = ttft_slo_ms
            if row.retired and (traffic_percent or min_warm or max_replicas):
                row.retired = False  # registered again: back in service
            s.flush()
            s.expunge(row)
            return row

    def set_rollout(self, ref: ModelRef, percent: float) -> list[ModelVersion]:
        """Give `ref` `percent` of its model's traffic; the other versions share the rest in proportion."""
        tenant, model, version = ref.tenant, ref.model, ref.version
        with self.sessions.begin() as s:
            rows = list(s.scalars(select(ModelVersion).where(ModelVersion.tenant == tenant,
                                                             ModelVersion.model == model)))
            if not any(r.version == version for r in rows):
                raise KeyError(version)
            others = [r for r in rows if r.version != version]
            rest = sum(r.traffic_percent for r in others)
            for r in rows:
                r.previous_percent = r.traffic_percent
                if r.version == version:
                    r.traffic_percent = percent
                else:
                    share = (r.traffic_percent / rest) if rest > 0 else 1.0 / len(others)
                    r.traffic_percent = (100.0 - percent) * share
            s.flush()
            for r in rows:
                s.expunge(r)
            return rows

    def rollback(self, tenant: str, model: str) -> list[ModelVersion]:
        """One call: every version of the model goes back to its split before the last rollout step."""
        with self.sessions.begin() as s:
            rows = list(s.scalars(select(ModelVersion).where(ModelVersion.tenant == tenant,
                                                             ModelVersion.model == model)))
            for r in rows:
                if r.previous_percent is not None:
                    r.traffic_percent, r.previous_percent = r.previous_percent, None
            s.flush()
            for r in rows:
                s.expunge(r)
            return rows

    def retire(self, ref: ModelRef) -> list[ModelVersion]:
        """No more traffic (its share goes to the other versions) and no workers: they drain and stop."""
        tenant, model, version = ref.tenant, ref.model, ref.version
        with self.sessions.begin() as s:
            rows = list(s.scalars(select(ModelVersion).where(ModelVersion.tenant == tenant,
                                                             ModelVersion.model == model)))
            target = next((r for r in rows if r.version == version), None)
            if target is None:
                raise KeyError(version)
            others = [r for r in rows if r is not target and not r.retired]
            freed, rest = target.traffic_percent, sum(r.traffic_percent for r in others)
            for r in rows:
                r.previous_percent = r.traffic_percent
            for r in others:
                r.traffic_percent += freed * ((r.traffic_percent / rest) if rest > 0 else 1.0 / len(others))
            target.traffic_percent, target.retired, target.min_warm = 0.0, True, 0
            s.flush()
            for r in rows:
                s.expunge(r)
            return rows

    def set_version_status(self, ref: ModelRef, status: str, reason: str) -> bool:
        with self.sessions.begin() as s:
            row = s.scalar(select(ModelVersion).where(ModelVersion.tenant == ref.tenant,
                                                      ModelVersion.model == ref.model,
                                                      ModelVersion.version == ref.version))
            if row is None:
                return False
            row.status, row.status_reason = status[:32], reason[:256]
            return True

    # -- usage
    def record_usage(self, row: UsageRow) -> None:
        self.record_usage_batch([row])

    def record_usage_batch(self, rows: list[UsageRow]) -> list[bool]:
        """All rows in one transaction (the gateway's group commit), each (worker, request id) once:
        a usage record can arrive twice (on the call, and owed by heartbeat when the worker could
        not tell it was delivered), and to two replicas at once. The database's unique index
        decides (INSERT ... ON CONFLICT DO NOTHING), so concurrent replicas cannot both store it.
        Returns, per row, whether it was stored."""
        if not rows:
            return []
        first: dict[tuple[str, str], UsageRow] = {}
        for row in rows:
            first.setdefault((row.worker_id, row.request_id), row)
        values = [{**{c: getattr(row, c) for c in _USAGE_COLUMNS}, "created_at": row.created_at or utcnow()}
                  for row in first.values()]
        with self.sessions.begin() as s:
            insert = _dialect_insert(s)(UsageRow).values(values)
            stored_keys = {tuple(k) for k in s.execute(insert.on_conflict_do_nothing(
                index_elements=["worker_id", "request_id"]).returning(UsageRow.worker_id, UsageRow.request_id)
            ).all()}
        return [first[(r.worker_id, r.request_id)] is r and (r.worker_id, r.request_id) in stored_keys
                for r in rows]

    def tokens_used(self, tenant: str, key_id: str | None = None) -> int:
        """Lifetime tokens of a tenant, or of one of its keys."""
        q = select(func.coalesce(func.sum(UsageRow.prompt_tokens + UsageRow.completion_tokens), 0)
                   ).where(UsageRow.tenant == tenant)
        if key_id is not None:
            q = q.where(UsageRow.key_id == key_id)
        with self.sessions() as s:
            return int(s.scalar(q) or 0)

    def usage_summary(self, tenant: str | None = None) -> list[dict]:
        """Usage per tenant and key, of the rows that verify (api/store/ledger.py); others are flagged."""
        return read_ledger(self.sessions, tenant).summary

    def usage_ledger(self, tenant: str | None = None) -> Ledger:
        """The summary and the flagged rows (each with why it failed)."""
        return read_ledger(self.sessions, tenant)

    def usage_export(self, tenant: str) -> dict:
        """The tenant's signed records and its usage keys' attestation documents (`sealed usage --export`)."""
        return export_ledger(self.sessions, tenant)

    def remember_usage_key(self, public_key: str, tenant: str, worker_id: str, document: dict) -> None:
        remember_usage_key(self.sessions, public_key, tenant, worker_id, document)

    # -- policies
    def put_policy(self, tenant: str, document: dict, admin_key_pem: str | None = None) -> int:
        with self.sessions.begin() as s:
            row = s.get(PolicyRow, tenant)
            if row is None:
                row = PolicyRow(tenant=tenant, document=document, version=1, admin_key_pem=admin_key_pem)
                s.add(row)
            else:
                row.document, row.version = document, row.version + 1
                if admin_key_pem is not None:
                    row.admin_key_pem = admin_key_pem
            # Kept for the console's history and diff; same transaction as the current version.
            s.add(PolicyVersionRow(tenant=tenant, version=row.version, document=document))
            return row.version

    def policy_versions(self, tenant: str) -> list[PolicyVersionRow]:
        """Every version of the tenant's policy, newest first."""
        with self.sessions() as s:
            return list(s.scalars(select(PolicyVersionRow).where(PolicyVersionRow.tenant == tenant)
                                  .order_by(PolicyVersionRow.version.desc())))

    def usage_rows(self, tenant: str | None, since: dt.datetime) -> list[UsageRow]:
        """Usage records since a time (the console buckets them); one tenant's, or all. Only rows that
        verify (api/store/ledger.py): a flagged row is never counted."""
        q = select(UsageRow).where(UsageRow.created_at >= since).order_by(UsageRow.created_at)
        if tenant is not None:
            q = q.where(UsageRow.tenant == tenant)
        with self.sessions() as s:
            return verified_rows(list(s.scalars(q)), registered_usage_keys(s))

    def policy(self, tenant: str) -> PolicyRow | None:
        with self.sessions() as s:
            return s.get(PolicyRow, tenant)
