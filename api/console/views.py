"""What the audit page shows (api/console/pages/audit.py), computed from the audit index: the
filter, the matching rows newest first, the filter choices, and whether each log's chain holds.

Every function takes the viewer and applies its scope itself: a tenant admin's rows are filtered
to its tenant here, and the templates never see another tenant's data. (What the other pages show
is computed beside their routes, in api/console/pages/.)
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

from api.console.auditindex import AuditIndex, Row
from api.console.session import Viewer
from policy.audit.entry import parse_ts


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
