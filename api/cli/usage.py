"""`sealed usage`: prompt and completion tokens, requests and worker-seconds, per tenant and per key.

Reads the local control-plane database by default (`sealed up`'s); with --url it asks a gateway's
management API instead (a JWT of role operator, auditor, or tenant-* for its own tenant).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import typer

from api.home import Home, default_home


def _rows(home: Path | None, url: str | None, token: str | None, tenant: str | None) -> list[dict]:
    if url:
        if not token:
            raise typer.BadParameter("--url needs --token (a management JWT)")
        r = httpx.get(f"{url.rstrip('/')}/admin/v1/usage", params={"tenant": tenant} if tenant else None,
                      headers={"Authorization": f"Bearer {token}"}, timeout=30)
        r.raise_for_status()
        rows: list[dict] = r.json()["data"]
        return rows
    from api.store.db import make_engine, session_factory, sqlite_url, upgrade
    from api.store.repo import Store

    engine = make_engine(sqlite_url(Home(home or default_home()).gateway))
    upgrade(engine)
    try:
        return Store(session_factory(engine)).usage_summary(tenant)
    finally:
        engine.dispose()


def usage(
    tenant: str = typer.Option(None, help="only this tenant"),
    home: Path = typer.Option(None, help="data directory (default $SEALED_HOME or ~/.sealed)"),
    url: str = typer.Option(None, help="gateway URL: ask its management API instead of the local database"),
    token: str = typer.Option(None, envvar="SEALED_ADMIN_TOKEN", help="management JWT for --url"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Usage per tenant and per API key."""
    rows = _rows(home, url, token, tenant)
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    typer.echo(f"{'tenant':16} {'key':24} {'requests':>9} {'prompt':>10} {'completion':>10} {'worker-s':>10}")
    totals: dict[str, list[float]] = {}
    for r in rows:
        typer.echo(f"{r['tenant']:16} {r['key_id']:24} {r['requests']:>9} {r['prompt_tokens']:>10} "
                   f"{r['completion_tokens']:>10} {r['worker_seconds']:>10.2f}")
        t = totals.setdefault(r["tenant"], [0, 0, 0, 0.0])
        for i, f in enumerate(("requests", "prompt_tokens", "completion_tokens", "worker_seconds")):
            t[i] += r[f]
    for name, (n, p, c, w) in totals.items():
        typer.echo(f"{name:16} {'(all keys)':24} {int(n):>9} {int(p):>10} {int(c):>10} {w:>10.2f}")
