"""Server-side revocation of console sessions and management tokens, kept in the control-plane store.

Both are HS256 JWTs any gateway replica can check, so without this a copied token stayed valid until
it expired. Now every request also asks the store (one query; every replica shares it):

- a console session is live only while its row exists, has not expired and is not revoked
  (allow-list: logout ends it; a store wiped of it ends it);
- a management token (minted offline by the CLI, the control loop or `POST /admin/v1/tokens`, so
  not recorded) is refused when a revocation matches it: its jti, or its subject, tenant, or every
  token, with an `issued_until` time its `iat` is not after (deny-list).

A revocation by subject or tenant (or of all) also ends the console sessions it covers, and a
session ends with the management token it was exchanged for. Tenant removal revokes the tenant.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from api.errors import SealedApiError
from api.store.models import ConsoleSessionRow, TokenRevocation

KINDS = ("jti", "subject", "tenant", "all")


class TokenRevoked(SealedApiError):
    """The session or management token was revoked, has expired, or was never recorded."""


@dataclass(frozen=True)
class TokenClaims:
    """What a revocation can match in a token."""

    jti: str
    subject: str
    tenant: str | None
    issued_at: float  # epoch seconds (`iat`)


@dataclass(frozen=True)
class ConsoleSession:
    jti: str
    subject: str
    role: str
    tenant: str | None
    token_jti: str
    issued_at: float
    expires_at: dt.datetime


def _matches(claims: TokenClaims, extra_jti: str | None = None):  # type: ignore[no-untyped-def]
    """The revocations that cover a token (or a session and the token it came from)."""
    jtis = [claims.jti] + ([extra_jti] if extra_jti else [])
    covered = [and_(TokenRevocation.kind == "subject", TokenRevocation.value == claims.subject),
               TokenRevocation.kind == "all"]
    if claims.tenant is not None:
        covered.append(and_(TokenRevocation.kind == "tenant", TokenRevocation.value == claims.tenant))
    return or_(and_(TokenRevocation.kind == "jti", TokenRevocation.value.in_(jtis)),
               and_(or_(*covered), TokenRevocation.issued_until >= claims.issued_at))


class Revocations:
    def __init__(self, sessions: sessionmaker[Session], clock: Callable[[], float] = time.time) -> None:
        self.sessions = sessions
        self.clock = clock

    # -- checks (raise TokenRevoked)
    def check_token(self, claims: TokenClaims) -> None:
        """A management token: refused when any revocation covers it."""
        with self.sessions() as s:
            if s.scalar(select(TokenRevocation.id).where(_matches(claims)).limit(1)) is not None:
                raise TokenRevoked("management token revoked")

    def check_session(self, jti: str) -> ConsoleSession:
        """A console session: its row must exist, be unexpired and unrevoked, and neither it nor
        the management token it came from may be covered by a revocation."""
        with self.sessions() as s:
            row = s.get(ConsoleSessionRow, jti)
            if row is None or row.revoked_at is not None:
                raise TokenRevoked("session ended")
            session = _session(row)
            if _aware(session.expires_at).timestamp() <= self.clock():
                raise TokenRevoked("session expired")
            claims = TokenClaims(session.jti, session.subject, session.tenant, session.issued_at)
            if s.scalar(select(TokenRevocation.id).where(_matches(claims, session.token_jti)).limit(1)) is not None:
                raise TokenRevoked("session revoked")
            return session

    # -- changes
    def record_session(self, session: ConsoleSession) -> None:
        now = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
        with self.sessions.begin() as s:
            # Expired sessions are of no use to anyone: dropped as new ones come.
            s.execute(delete(ConsoleSessionRow).where(ConsoleSessionRow.expires_at < now))
            s.add(ConsoleSessionRow(jti=session.jti, subject=session.subject, role=session.role,
                                    tenant=session.tenant, token_jti=session.token_jti,
                                    issued_at=session.issued_at, expires_at=session.expires_at))

    def end_session(self, jti: str) -> bool:
        """Logout: the session ends for every replica at once; False when it was not live."""
        now = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
        with self.sessions.begin() as s:
            done = s.execute(update(ConsoleSessionRow).where(ConsoleSessionRow.jti == jti,
                                                             ConsoleSessionRow.revoked_at.is_(None))
                             .values(revoked_at=now))
            return bool(done.rowcount)  # type: ignore[attr-defined]

    def revoke(self, kind: str, value: str = "") -> int:
        """Revoke by jti (a management token or a console session), subject, tenant, or all;
        returns how many live console sessions ended with it. Raises ValueError on a bad kind."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        if (kind == "all") != (value == ""):
            raise ValueError("a revocation names a value, except of all")
        cutoff = self.clock()
        now = dt.datetime.fromtimestamp(cutoff, dt.UTC)
        live = ConsoleSessionRow.revoked_at.is_(None)
        if kind == "jti":
            which = or_(ConsoleSessionRow.jti == value, ConsoleSessionRow.token_jti == value)
        elif kind == "subject":
            which = ConsoleSessionRow.subject == value
        elif kind == "tenant":
            which = ConsoleSessionRow.tenant == value
        else:
            which = ConsoleSessionRow.jti.is_not(None)
        with self.sessions.begin() as s:
            s.add(TokenRevocation(kind=kind, value=value, issued_until=cutoff, created_at=now))
            ended = s.execute(update(ConsoleSessionRow).where(live, which).values(revoked_at=now))
            return int(ended.rowcount)  # type: ignore[attr-defined]

    def live_sessions(self, tenant: str | None = None) -> list[ConsoleSession]:
        now = dt.datetime.fromtimestamp(self.clock(), dt.UTC)
        q = (select(ConsoleSessionRow).where(ConsoleSessionRow.revoked_at.is_(None),
                                             ConsoleSessionRow.expires_at > now)
             .order_by(ConsoleSessionRow.issued_at))
        if tenant is not None:
            q = q.where(ConsoleSessionRow.tenant == tenant)
        with self.sessions() as s:
            return [_session(r) for r in s.scalars(q)]


def _aware(when: dt.datetime) -> dt.datetime:
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)  # SQLite hands back naive UTC


def _session(row: ConsoleSessionRow) -> ConsoleSession:
    return ConsoleSession(row.jti, row.subject, row.role, row.tenant, row.token_jti, row.issued_at,
                          _aware(row.expires_at))
