"""`sealed usage`: prompt and completion tokens, requests and worker-seconds, per tenant and per key.

Reads the local control-plane database by default (`sealed up`'s); with --url it asks a gateway's
management API instead (a JWT of role operator, auditor, or tenant-* for its own tenant).

Every row is checked against the signed record it was stored with (api/store/ledger.py): a row that
fails is flagged and not counted. `--export FILE` writes a tenant's whole ledger (signed records and
the attestation documents of the usage keys); `--verify FILE --policy POLICY` checks such an export on
the tenant's own machine against its client policy (sealed_client/ledger.py), trusting none of it.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import httpx
import typer

from api.home import Home, default_home


def _get(url: str, token: str | None, path: str, tenant: str | None) -> Any:
    if not token:
        raise typer.BadParameter("--url needs --token (a management JWT)")
    r = httpx.get(f"{url.rstrip('/')}/admin/v1/{path}", params={"tenant": tenant} if tenant else None,
                  headers={"Authorization": f"Bearer {token}"}, timeout=30)
    r.raise_for_status()
    return r.json()


def _ledger(home: Path | None, url: str | None, token: str | None, tenant: str | None,
            export: bool) -> dict[str, Any]:
    """{"data": summary rows, "flagged": rows}, or the tenant's export."""
    if url:
        return _get(url, token, "usage/ledger" if export else "usage", tenant)  # type: ignore[no-any-return]
    from api.store.db import make_engine, session_factory, sqlite_url, upgrade
    from api.store.repo import Store

    engine = make_engine(sqlite_url(Home(home or default_home()).gateway))
    upgrade(engine)
    try:
        store = Store(session_factory(engine))
        if export:
            if not tenant:
                raise typer.BadParameter("--export needs --tenant")
            return store.usage_export(tenant)
        ledger = store.usage_ledger(tenant)
        return {"data": ledger.summary, "flagged": ledger.flagged}
    finally:
        engine.dispose()


def _verify(ledger_file: Path, policy: Path | None, at: str | None, as_json: bool, allow_sim: bool) -> None:
    from sealed_client.deployment import ClientTrust
    from sealed_client.ledger import LedgerInvalid, verify_ledger

    if policy is None:
        raise typer.BadParameter("--verify needs --policy (the tenant's client policy)")
    now = dt.datetime.fromisoformat(at) if at else dt.datetime.now(dt.UTC)
    trust = ClientTrust.load(policy, unsafe_allow_simulated=allow_sim)
    try:
        check = verify_ledger(json.loads(ledger_file.read_text()), trust, now)
    except (LedgerInvalid, ValueError) as exc:
        typer.echo(f"ledger NOT verified: {exc}", err=True)
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps({"tenant": check.tenant, "totals": check.totals, "flagged": check.flagged,
                               "keys_verified": check.keys_verified, "keys_refused": check.keys_refused}, indent=1))
    else:
        typer.echo(f"{'key':24} {'requests':>9} {'prompt':>10} {'completion':>10} {'worker-s':>10}")
        for key_id, t in sorted(check.totals.items()):
            typer.echo(f"{key_id:24} {int(t['requests']):>9} {int(t['prompt_tokens']):>10} "
                       f"{int(t['completion_tokens']):>10} {t['worker_seconds']:>10.2f}")
        for public_key, reason in check.keys_refused.items():
            typer.echo(f"usage key {public_key[:16]}... refused: {reason}")
        for f in check.flagged:
            typer.echo(f"FLAGGED record {f['index']} (request {f['request_id']!r}, "
                       f"prompt tokens {f['prompt_tokens']}): "
                       f"{f['reason']}")
        typer.echo(f"{len(check.flagged)} flagged; {len(check.keys_verified)} usage keys verified")
    if not check.clean:
        raise typer.Exit(1)


def usage(
    tenant: str = typer.Option(None, help="only this tenant"),
    home: Path = typer.Option(None, help="data directory (default $SEALED_HOME or ~/.sealed)"),
    url: str = typer.Option(None, help="gateway URL: ask its management API instead of the local database"),
    token: str = typer.Option(None, envvar="SEALED_ADMIN_TOKEN", help="management JWT for --url"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    export: Path = typer.Option(None, "--export", help="write the tenant's signed ledger to this file"),
    verify: Path = typer.Option(None, "--verify", exists=True, help="check an exported ledger (tenant side)"),
    policy: Path = typer.Option(None, "--policy", exists=True, help="client policy for --verify"),
    at: str = typer.Option(None, help="--verify: evidence checked as of this time, ISO 8601 (default now)"),
    unsafe_allow_simulated: bool = typer.Option(False, "--unsafe-allow-simulated",
                                                help="--verify: accept simulated-TEE evidence (the demo)"),
) -> None:
    """Usage per tenant and per API key (rows that fail their signature check are flagged, not counted)."""
    if verify is not None:
        _verify(verify, policy, at, as_json, unsafe_allow_simulated)
        return
    if export is not None:
        export.write_text(json.dumps(_ledger(home, url, token, tenant, export=True), indent=1))
        typer.echo(f"wrote the ledger of {tenant} to {export}")
        return
    doc = _ledger(home, url, token, tenant, export=False)
    rows, flagged = doc["data"], doc.get("flagged", [])
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        for f in flagged:
            typer.echo(f"flagged usage row {f['id']} of {f['tenant']} (not counted): {f['reason']}", err=True)
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
    for f in flagged:
        typer.echo(f"FLAGGED usage row {f['id']} of {f['tenant']} (request {f['request_id']!r}, "
                   f"{f['prompt_tokens']} prompt tokens), not counted: {f['reason']}")
