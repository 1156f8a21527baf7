"""What each page shows, computed from the gateway's state, the audit index and the key broker.

Every function takes the viewer and applies its scope itself: a tenant admin's rows are filtered
to its tenant here, and the templates never see another tenant's data.
"""

from __future__ import annotations

import bisect
import datetime as dt
import difflib
import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from api.console.auditindex import AuditIndex, Row
from api.console.session import Viewer
from attestation.errors import AttestationError
from attestation.x509chain import BAD_DER
from policy.audit.entry import parse_ts
from policy.documents import verify_policy_document
from policy.errors import PolicyError

MANAGEMENT_ACTIONS = ("tenant-key", "admin", "management", "console")


@dataclass(frozen=True)
class AuditFilter:
    tenant: str | None = None
    component: str | None = None
    rule: str | None = None
    decision: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None

    def matches(self, r: Row) -> bool:
        e = r.entry
        return ((self.tenant is None or e.tenant == self.tenant)
                and (self.component is None or e.component == self.component)
                and (self.rule is None or r.rule == self.rule)
                and (self.decision is None or e.decision == self.decision)
                and (self.since is None or e.ts >= self.since)
                and (self.until is None or e.ts < self.until))

    @property
    def empty(self) -> bool:
        return all(v is None for v in (self.tenant, self.component, self.rule, self.decision, self.since,
                                       self.until))


def parse_time(text: str | None) -> dt.datetime | None:
    """A filter bound from a form: ``YYYY-MM-DDTHH:MM[:SS]`` (UTC) or an audit timestamp."""
    if not text:
        return None
    text = text.strip()
    try:
        return parse_ts(text)
    except ValueError:
        pass
    try:
        value = dt.datetime.fromisoformat(text.rstrip("Z"))
    except ValueError as exc:
        raise ValueError(f"not a time: {text[:40]!r}") from exc
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def scoped_filter(who: Viewer, *, tenant: str | None, component: str | None, rule: str | None,
                  decision: str | None, since: str | None, until: str | None) -> AuditFilter:
    # A tenant admin's tenant filter is not a choice: it is always its own tenant.
    return AuditFilter(tenant=who.tenant or (tenant or None), component=component or None, rule=rule or None,
                       decision=decision or None, since=parse_time(since), until=parse_time(until))


def select_rows(index: AuditIndex, flt: AuditFilter) -> Sequence[Row]:
    """Matching rows, newest first.

    Starts from the smallest per-tenant/role/rule list that applies, cuts the time window by
    bisection (rows are in time order), and checks only the predicates still left, so a page
    costs about the size of the answer rather than of the log.
    """
    lists = [("tenant", flt.tenant, index.by_tenant), ("component", flt.component, index.by_component),
             ("rule", flt.rule, index.by_rule)]
    rows, used = index.rows, None
    for name, value, by_value in lists:
        if value is not None:
            candidate = by_value.get(value, [])
            if used is None or len(candidate) < len(rows):
                rows, used = candidate, name
    if flt.since is not None or flt.until is not None:
        lo = bisect.bisect_left(rows, flt.since, key=_ts) if flt.since is not None else 0
        hi = bisect.bisect_left(rows, flt.until, key=_ts) if flt.until is not None else len(rows)
        rows = rows[lo:hi]
    checks = []
    if flt.tenant is not None and used != "tenant":
        checks.append(lambda r, v=flt.tenant: r.entry.tenant == v)
    if flt.component is not None and used != "component":
        checks.append(lambda r, v=flt.component: r.entry.component == v)
    if flt.rule is not None and used != "rule":
        checks.append(lambda r, v=flt.rule: r.rule == v)
    if flt.decision is not None:
        checks.append(lambda r, v=flt.decision: r.entry.decision == v)
    if not checks:
        return NewestFirst(rows)  # no copy of a 100,000-row list per page
    if len(checks) == 1:
        (check,) = checks
        return [r for r in reversed(rows) if check(r)]
    return [r for r in reversed(rows) if all(c(r) for c in checks)]


class NewestFirst(Sequence[Row]):
    """A time-ordered list read newest first, without copying it."""

    def __init__(self, rows: list[Row]) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, item: int) -> Row: ...
    @overload
    def __getitem__(self, item: slice) -> list[Row]: ...

    def __getitem__(self, item: int | slice) -> Row | list[Row]:
        n = len(self._rows)
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            if stop <= start:
                return []
            return self._rows[n - stop:n - start][::-1]
        if item < 0:
            item += n
        if not 0 <= item < n:
            raise IndexError(item)
        return self._rows[n - 1 - item]


def _ts(row: Row) -> dt.datetime:
    return row.entry.ts


class Facets:
    """Filter choices (tenants, components, rules), from the index's per-value lists."""

    def __init__(self) -> None:
        self._generation = -1
        self._tenant_rules: dict[str, list[str]] = {}

    def get(self, index: AuditIndex, who: Viewer) -> tuple[list[str], list[str], list[str]]:
        components = sorted(index.by_component)
        if who.tenant is None:
            return sorted(index.by_tenant), components, sorted(index.by_rule)
        if self._generation != index.generation:
            self._tenant_rules, self._generation = {}, index.generation
        rules = self._tenant_rules.get(who.tenant)
        if rules is None:  # a tenant admin sees only its own rules' names
            rules = sorted({r.rule for r in index.by_tenant.get(who.tenant, ())})
            self._tenant_rules[who.tenant] = rules
        return [who.tenant], components, rules


def chain_status(index: AuditIndex, page_size: int) -> list[dict[str, Any]]:
    """Per log: intact or where it breaks (entry, reason, the page of the timeline that shows it)."""
    out = []
    for st in index.statuses():
        item: dict[str, Any] = {"log": st.log, "component": st.component, "entries": st.entries,
                                "verified": st.verified, "pending": st.signatures_pending,
                                "checkpoint": st.last_checkpoint, "broken": st.broken, "page": None}
        if st.broken is not None:
            pos = index.position(st.broken.log, st.broken.index)
            if pos is not None:
                item["page"] = (len(index.rows) - 1 - pos) // page_size + 1
        out.append(item)
    return out


# -- workers
def _cert_fingerprint(pem: str) -> str:
    if not pem:
        return ""
    try:
        cert = x509.load_pem_x509_certificate(pem.encode())
    except BAD_DER:  # what a worker registered is unchecked here (InvalidVersion is no ValueError)
        return "unreadable"
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()[:16]


def token_claims(token: str, verifier: Any) -> tuple[dict[str, Any], str]:
    """The worker's attestation token claims and whether the broker's signature checks out."""
    if not token:
        return {}, "no token"
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return {}, "malformed token"
    if verifier is None:
        return claims, "signature not checked (gateway has no broker JWKS)"
    try:
        verifier.verify(token, dt.datetime.fromtimestamp(int(claims.get("iat", 0)), dt.UTC))
    except (AttestationError, jwt.PyJWTError, ValueError, KeyError) as exc:
        return claims, f"signature INVALID ({type(exc).__name__})"
    return claims, "signed by the key broker"


def worker_rows(service: Any, attestations: list[dict[str, Any]], reference: dict[tuple[str, str], set[str]],
                who: Viewer, now: float) -> list[dict[str, Any]]:

    by_id = {a.get("worker_id"): a for a in attestations}
    reg = service.registry
    rows = []
    for w in sorted(reg.workers.values(), key=lambda w: (w.tenant, w.model, w.version, w.worker_id)):
        if not who.sees(w.tenant):
            continue
        doc = by_id.get(w.worker_id) or {}
        claims, token_state = token_claims(str(doc.get("token", "")), service.enrolment.verifier)
        measurement = str(claims.get("measurement", ""))
        allowed = reference.get((w.tenant, w.model))
        if not measurement:
            ref_state = "unknown"
        elif allowed is None:
            ref_state = "no reference values available"
        else:
            ref_state = "matches reference" if measurement in allowed else "NOT in the reference values"
        gpus = claims.get("gpus") or []
        exp = claims.get("exp")
        alive = reg.alive(w)
        rows.append({
            "worker_id": w.worker_id, "tenant": w.tenant, "model": w.model, "version": w.version,
            "status": w.status if alive else "unreachable", "routed": alive and w.status == "ready"
            and (w.attested or not reg.require_attestation),
            "tee": claims.get("tee") or w.tee, "insecure": bool(w.insecure or claims.get("insecure")),
            "tcb_status": claims.get("tcb_status", "unknown"), "tcb": claims.get("tcb") or {},
            "debug": claims.get("debug"), "measurement": measurement, "reference": ref_state,
            "gpu_cc": ("no GPU" if not gpus else
                       "on" if all(g.get("cc_enabled") for g in gpus) else "OFF"),
            "gpus": len(gpus), "token_state": token_state,
            "token_expires": (dt.datetime.fromtimestamp(int(exp), dt.UTC) if exp else None),
            "heartbeat_age_s": reg.heartbeat_age(w) if w.last_seen else None,
            "inflight": w.inflight, "tls": _cert_fingerprint(w.tls_cert),
            "attested": w.attested, "now": now,
        })
    return rows


# -- usage
def bucket_usage(rows: list[Any], since: dt.datetime, until: dt.datetime, buckets: int = 24
                 ) -> dict[str, Any]:
    span = max(1.0, (until - since).total_seconds() / buckets)
    labels = [(since + dt.timedelta(seconds=span * i)).strftime("%m-%d %H:%M") for i in range(buckets)]

    def zero() -> list[float]:
        return [0.0] * buckets

    tenants: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"tokens": zero(), "requests": zero(),
                                                                      "worker_seconds": zero()})
    by_key: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0.0])
    by_model: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0.0])
    key_series: dict[tuple[str, str], list[float]] = defaultdict(zero)  # tokens per bucket
    model_series: dict[tuple[str, str], list[float]] = defaultdict(zero)
    for r in rows:
        at = r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=dt.UTC)
        i = min(buckets - 1, max(0, int((at - since).total_seconds() // span)))
        tokens = r.prompt_tokens + r.completion_tokens
        t = tenants[r.tenant]
        t["tokens"][i] += tokens
        t["requests"][i] += 1
        t["worker_seconds"][i] += r.worker_seconds
        for agg in (by_key[(r.tenant, r.key_id)], by_model[(r.tenant, f"{r.model}/{r.version}")]):
            agg[0] += 1
            agg[1] += tokens
            agg[2] += r.worker_seconds
        key_series[(r.tenant, r.key_id)][i] += tokens
        model_series[(r.tenant, f"{r.model}/{r.version}")][i] += tokens
    return {"labels": labels, "tenants": dict(tenants), "by_key": dict(by_key), "by_model": dict(by_model),
            "key_series": dict(key_series), "model_series": dict(model_series)}


# -- policies
def policy_signature(tenant: str, document: dict[str, Any], keys_dir: Path | None) -> dict[str, Any]:
    """Who signed a policy document and whether the signature verifies with the tenant's key."""
    if not {"payload", "sig", "key_id"} <= set(document):
        return {"signed": False, "key_id": None, "state": "unsigned document"}
    key_id = str(document.get("key_id"))
    info = {"signed": True, "key_id": key_id, "alg": document.get("alg"), "state": "signer key not available"}
    if keys_dir is None:
        return info
    path = keys_dir / tenant / f"{key_id}.pub"
    if "/" in key_id or ".." in key_id or not path.is_file():
        return info
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("not Ed25519")
        verify_policy_document(document, {tenant: {key_id: key}})
        info["state"] = "signature verified"
    except (PolicyError, ValueError, TypeError, KeyError) as exc:
        info["state"] = f"signature INVALID ({type(exc).__name__})"
    return info


def policy_diff(old: dict[str, Any], new: dict[str, Any], a: int, b: int) -> list[tuple[str, str]]:
    """Unified diff of two documents' canonical JSON, as (kind, line) for the template."""
    def lines(doc: dict[str, Any]) -> list[str]:
        return json.dumps(doc.get("payload", doc), indent=2, sort_keys=True).splitlines()

    out = []
    for line in difflib.unified_diff(lines(old), lines(new), f"version {a}", f"version {b}", lineterm="", n=3):
        kind = ("meta" if line.startswith(("---", "+++", "@@")) else "add" if line.startswith("+")
                else "del" if line.startswith("-") else "ctx")
        out.append((kind, line))
    return out
