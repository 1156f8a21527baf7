"""`sealed keys ...`: tenant keys, the tenant's policy-admin key, signed release policies and
release receipts.

Key operations go through the broker's admin API (`--url`, default $SEALED_BROKER_URL or the
local `sealed up` broker; bearer token from $SEALED_ADMIN_TOKEN, never from argv). `receipts
--verify` works offline on a receipts file or the local broker's receipts.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import httpx
import typer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from api.cli import tenant_broker
from api.cli.refs import model_ref
from api.home import Home, default_home
from key_broker.receipts import ReceiptBook
from protocol.broker.receipts import ReceiptInvalid, verify_receipt
from protocol.fsutil import atomic_write

TOKEN_ENV = "SEALED_ADMIN_TOKEN"
URL_ENV = "SEALED_BROKER_URL"


def _home(home: Path | None) -> Home:
    return Home(home or default_home())


def _broker_url(url: str | None, home: Path | None) -> str:
    if url or os.environ.get(URL_ENV):
        return str(url or os.environ[URL_ENV])
    pids = _home(home).root / "run" / "pids.json"
    if pids.exists():
        return str(json.loads(pids.read_text())["broker_url"])
    raise typer.BadParameter(f"give --url or set {URL_ENV}")


def _admin(method: str, path: str, url: str | None, home: Path | None, body: Any = None,
           missing_ok: bool = False) -> Any:
    token = os.environ.get(TOKEN_ENV)
    if not token:
        from api.cli.mgmt_client import PROFILE_ENV, broker_credentials

        stored = broker_credentials(os.environ.get(PROFILE_ENV) or "default")  # `sealed login --local-operator`
        token = stored[1] if stored else None
    if not token:
        raise typer.BadParameter(f"set {TOKEN_ENV} to an admin or tenant-admin token (or `sealed login "
                                 "--local-operator` on the host of `sealed up`)")
    response = httpx.request(method, f"{_broker_url(url, home)}/v1/admin{path}", json=body, timeout=30.0,
                             headers={"Authorization": f"Bearer {token}"})
    if missing_ok and response.status_code == 404:
        return None
    if response.status_code >= 400:
        typer.echo(f"error {response.status_code}: {response.text[:500]}", err=True)
        raise typer.Exit(1)
    return response.json()


def _as_tenant(method: str, path: str, url: str | None, home: Path | None, tenant: str, body: Any) -> Any:
    """A call only the tenant's own token may make: $SEALED_ADMIN_TOKEN, else the profile's tenant
    token (on the host of `sealed up`, minted once for the tenant by the local operator login)."""
    if os.environ.get(TOKEN_ENV):
        return _admin(method, path, url, home, body)
    from api.cli.mgmt_client import PROFILE_ENV, broker_tenant_call

    return broker_tenant_call(method, path, tenant=tenant, profile=os.environ.get(PROFILE_ENV) or "default",
                              body=body)


URL = typer.Option(None, "--url", help=f"key broker URL (default ${URL_ENV} or the local `sealed up` broker)")
HOME = typer.Option(None, help="data directory (default $SEALED_HOME or ~/.sealed)")
TENANT = typer.Option(..., help="tenant id")


def create(tenant: str = TENANT, url: str = URL, home: Path = HOME,
           invitation_out: Path = typer.Option(None, help="write the tenant's invitation here (give it to the "
                                                          "tenant out of band)")) -> None:
    """Create the tenant's key-encryption key; the broker answers with the tenant's invitation (signed by
    the broker instance), which the tenant answers with its policy-admin key (`admin-key --invitation`)."""
    doc = _admin("POST", f"/tenants/{tenant}/key", url, home)
    if invitation_out is not None and doc.get("invitation") is not None:
        atomic_write(invitation_out, json.dumps(doc["invitation"], indent=1, sort_keys=True).encode(), mode=0o644)
    typer.echo(json.dumps(doc, indent=1))


def invite(tenant: str = TENANT, url: str = URL, home: Path = HOME,
           out: Path = typer.Option(..., help="write the invitation here (for the tenant)")) -> None:
    """A new invitation for the tenant's first policy-admin key (operator)."""
    doc = _admin("POST", f"/tenants/{tenant}/invitations", url, home)
    atomic_write(out, json.dumps(doc, indent=1, sort_keys=True).encode(), mode=0o644)
    typer.echo(f"invitation for {tenant} (expires {doc['payload']['expires']}): {out}")


def rotate(tenant: str = TENANT, url: str = URL, home: Path = HOME) -> None:
    """Rotate the tenant key and re-wrap every data key under the new version."""
    typer.echo(json.dumps(_admin("POST", f"/tenants/{tenant}/key/rotate", url, home)))


def revoke(tenant: str = TENANT, url: str = URL, home: Path = HOME,
           yes: bool = typer.Option(False, "--yes", help="confirm: stop releases; workers drop keys")
           ) -> None:
    """Revoke the tenant key: no new releases; workers drop the key at their next status check."""
    if not yes:
        raise typer.BadParameter("revocation stops every release of this tenant's models; pass --yes")
    typer.echo(json.dumps(_admin("POST", f"/tenants/{tenant}/key/revoke", url, home), indent=1))


def status(tenant: str = TENANT, url: str = URL, home: Path = HOME) -> None:
    """The tenant key's state and its data keys (metadata only)."""
    typer.echo(json.dumps(_admin("GET", f"/tenants/{tenant}", url, home), indent=1))


ADMIN_KEY = typer.Option(None, "--admin-key", exists=True,
                         help="the tenant's policy-admin private key (PEM; default: this host's "
                              "<home>/tenants/<tenant>/policy-admin.pem)")


def policy(tenant: str = TENANT, file: Path = typer.Option(..., exists=True, help="release policy JSON (or an "
                                                                                  "envelope signed already)"),
           admin_key: Path = ADMIN_KEY, url: str = URL, home: Path = HOME) -> None:
    """Sign a release policy with the tenant's policy-admin key and upload it (versions only move
    forward). The broker takes it only with the signature of the key the tenant registered."""
    from api.cli import release_signing as rs

    key = rs.admin_key(tenant, admin_key, home)
    key_id = tenant_broker.guard(_broker_url(url, home), tenant, _home(home).root)  # its own key governs, or exit
    envelope = rs.signed_release(rs.read_json(file), tenant, key, key_id)
    typer.echo(json.dumps(_admin("PUT", f"/tenants/{tenant}/policies", url, home, envelope)))


def admin_key_cmd(tenant: str = TENANT, admin_key: Path = ADMIN_KEY,
                  key_id: str = typer.Option(None, help="id of the key to register (default <tenant>-admin)"),
                  new_key: Path = typer.Option(None, exists=True, help="rotate: the new private key (PEM); "
                                                                       "--admin-key is the current one"),
                  new_key_id: str = typer.Option(None, help="rotate: id of the new key"),
                  invitation: Path = typer.Option(None, exists=True, dir_okay=False,
                                                  help="register: the broker's invitation (from the operator)"),
                  broker_policy: Path = typer.Option(None, exists=True, dir_okay=False,
                                                     help="register: which broker to trust (a client policy's "
                                                          "`broker`, `evidence`, `appraisal`: measurement, TEE)"),
                  url: str = URL, home: Path = HOME) -> None:
    """Register the tenant's policy-admin key by answering the broker's invitation (verified against the
    broker's evidence; the broker instance is then pinned in <home>/tenants/<tenant>/broker-pin.json, a
    tenant's file), or rotate it (signed by the current key). Either way the CLI then checks, from
    the broker's attested answer, that the key governing the tenant is this one."""
    from api.cli import release_signing as rs
    from policy.release_documents import admin_key_statement

    key = rs.admin_key(tenant, admin_key, home)
    path = f"/tenants/{tenant}/policy-admin-key"
    base, root = _broker_url(url, home), _home(home).root
    if new_key is None:
        if invitation is not None:
            if broker_policy is None:
                raise typer.BadParameter("--invitation needs --broker-policy: which broker (measurement) to trust")
            try:
                statement = tenant_broker.answer_invitation(
                    base, tenant, rs.read_json(invitation), rs.read_json(broker_policy), key,
                    key_id or rs.default_key_id(tenant), root, base=broker_policy.parent)
            except tenant_broker.TenantBrokerRefused as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from exc
            with contextlib.suppress(typer.Exit):  # refused (used, expired...): the check below says by whom
                _as_tenant("PUT", path, url, home, tenant, statement)
        kid = tenant_broker.guard(base, tenant, root)
        typer.echo(f"policy-admin key of {tenant}: {kid} (attested by the pinned broker instance)")
        return
    current_id = tenant_broker.guard(base, tenant, root)  # the current key is ours, at the pinned broker
    current = _admin("GET", path, url, home)
    new = rs.admin_key(tenant, new_key, home)
    kid = new_key_id or f"{rs.default_key_id(tenant)}-{int(current['version']) + 1}"
    statement = admin_key_statement(tenant, new.public_key(), kid, int(current["version"]) + 1, key, current_id)
    typer.echo(json.dumps(_admin("PUT", path, url, home, statement)))
    tenant_broker.repin_key(root, tenant, new)


def releases(tenant: str = TENANT, url: str = URL, home: Path = HOME,
             out: Path = typer.Option(None, help="also write the signed receipts (JSONL) here")) -> None:
    """List the tenant's key releases (fetched from the broker as signed receipts)."""
    body = _admin("GET", f"/tenants/{tenant}/receipts", url, home)
    if out is not None:
        out.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in body["receipts"]))
        out.with_suffix(".broker.pem").write_text(body["broker_public_key_pem"])
    for line in body["receipts"]:
        r = line["receipt"]
        typer.echo(f"{r['time']} {r['model']}/{r['version']} tee={r['tee']} "
                   f"measurement={r['measurement'][:16]}... policy={r['policy_id']} v{r['policy_version']} "
                   f"token={r['token_id']}")


def receipts(
    tenant: str = TENANT,
    home: Path = HOME,
    file: Path = typer.Option(None, help="verify this receipts JSONL instead of the local broker's"),
    broker_key: Path = typer.Option(None, help="broker receipt public key (PEM) for --verify"),
    verify: bool = typer.Option(False, "--verify", help="verify every receipt's signature offline"),
) -> None:
    """List key-release receipts; with --verify, check each signature against the broker's key."""
    layout = _home(home)
    if file is not None:
        lines = [json.loads(x) for x in file.read_text().splitlines() if x.strip()]
    else:
        lines = ReceiptBook(layout.broker, Ed25519PrivateKey.generate()).list(tenant)
    public: Ed25519PublicKey | None = None
    if verify:
        if broker_key is not None:
            loaded = serialization.load_pem_public_key(broker_key.read_bytes())
        else:  # the local broker's sealed receipt key (one machine, simulated TEE only)
            from api.broker_state import local_broker_keys

            loaded = local_broker_keys(layout).receipt_key.public_key()
        if not isinstance(loaded, Ed25519PublicKey):
            raise typer.BadParameter("broker key must be Ed25519")
        public = loaded
    bad = 0
    for i, line in enumerate(lines):
        if public is not None:
            try:
                body = verify_receipt(line, public)
            except ReceiptInvalid as exc:
                bad += 1
                typer.echo(f"receipt {i}: INVALID ({exc})", err=True)
                continue
            if body.get("tenant") != tenant:
                bad += 1
                typer.echo(f"receipt {i}: INVALID (for tenant {body.get('tenant')!r})", err=True)
                continue
        typer.echo(json.dumps(line["receipt"], sort_keys=True))
    if bad:
        raise typer.Exit(1)
    if verify:
        typer.echo(f"{len(lines)} receipts verified", err=True)


def import_key(
    tenant: str = typer.Option(...), model: str = typer.Option(...), version: str = typer.Option(...),
    sealed_key: Path = typer.Option(..., exists=True, help="sealed data key written by `sealed encrypt`"),
    package: Path = typer.Option(..., exists=True, help="the package the key encrypts"),
    home: Path = typer.Option(None),
) -> None:
    """Open a sealed data key with the local broker's import key; wrap it under the tenant key."""
    from api.tenant_tools import import_sealed_key
    from protocol.package import PackageError

    ref = model_ref(tenant, model, version)
    try:  # a package of another version is refused before anything is stored
        import_sealed_key(_home(home).broker, sealed_key, package, ref)
    except PackageError as exc:
        raise typer.BadParameter(str(exc)) from exc
    typer.echo(f"data key for {ref} opened, wrapped and stored")


def import_pubkey(home: Path = typer.Option(None)) -> None:
    """Print the local broker's X25519 import public key (PEM) for `sealed encrypt --broker-import-key`."""
    from api.tenant_tools import broker_import_public_pem

    typer.echo(broker_import_public_pem(_home(home).broker).decode(), nl=False)


def build() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, help="Tenant keys, release policies and release receipts.")
    for name, fn in (("create", create), ("invite", invite), ("rotate", rotate), ("revoke", revoke), ("status", status),
                     ("policy", policy), ("admin-key", admin_key_cmd), ("releases", releases), ("receipts", receipts),
                     ("import", import_key), ("import-pubkey", import_pubkey)):
        app.command(name)(fn)
    return app
