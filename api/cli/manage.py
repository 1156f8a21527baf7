"""`sealed login|tokens|tenants|apikeys|policies`: the management API from the command line.

Naming: `sealed apikeys` manages the API keys clients send to the gateway (scopes, limits,
budgets); `sealed keys` manages the tenant keys at the key broker (KEKs, data keys, release
policies). No secret is ever an argument: see api/cli/mgmt_client.py.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import typer

from api.cli import tenant_broker
from api.cli.mgmt_client import (
    PROFILE,
    TOKEN_ENV,
    URL,
    broker_call,
    broker_credentials,
    broker_tenant_call,
    call,
    gateway_url,
    local_stack_url,
    read_secret,
    save_profile,
    show,
)
from api.home import Home, default_home
from api.management.auth import issue_token
from protocol.fsutil import atomic_write

JSON = typer.Option(False, "--json", help="print the API's JSON")
TENANT = typer.Option(..., "--tenant", help="tenant id")


def login(
    url: str = URL, profile: str = PROFILE,
    token_file: Path = typer.Option(None, "--token-file", help=f"management token file, or - for stdin "
                                                                f"(default ${TOKEN_ENV} or piped stdin)"),
    local_operator: bool = typer.Option(False, "--local-operator",
                                        help="operator of the `sealed up` stack on this host: mint a token from "
                                             "its secret and keep its key-broker admin token too"),
    hours: int = typer.Option(12, min=1, max=168, help="lifetime of a minted token"),
) -> None:
    """Store a management token (0600) for the other commands; checks it against the gateway first."""
    stored: dict[str, str] = {}
    if local_operator:
        home = Home(default_home())
        secret_file = home.gateway / "jwt-secret"
        if not secret_file.exists():
            raise typer.BadParameter(f"no local stack secret at {secret_file}: run `sealed up` first")
        token = issue_token(secret_file.read_text().strip(), "local-operator", "operator", ttl_s=hours * 3600)
        broker_token = home.broker / "admin-token"
        if broker_token.exists() and local_stack_url("broker_url"):
            stored.update(broker_token=broker_token.read_text().strip(), broker_url=str(local_stack_url("broker_url")))
    else:
        token = read_secret(token_file, TOKEN_ENV, "a management token")
    base = gateway_url(url, profile)
    who = call("GET", "/whoami", profile=profile, url=base, token=token)
    path = save_profile(profile, {"url": base, "token": token, **stored})
    tenant = f" of tenant {who['tenant']}" if who.get("tenant") else ""
    typer.echo(f"logged in to {base} as {who['role']}{tenant} (profile {profile!r}, stored in {path})")


def tokens_create(
    role: str = typer.Option(..., help="operator | tenant-admin | tenant-user | auditor"),
    tenant: str = typer.Option(None, help="the tenant of a tenant role"),
    subject: str = typer.Option(..., help="who the token is for (recorded in the token)"),
    hours: int = typer.Option(12, min=1, max=168),
    out: Path = typer.Option(..., help="write the token here (0600); it is never printed"),
    profile: str = PROFILE, url: str = URL,
) -> None:
    """Mint a management token (operator only), e.g. a tenant admin's for `sealed upload`."""
    doc = call("POST", "/tokens", profile=profile, url=url,
               body={"role": role, "tenant": tenant, "subject": subject, "ttl_s": hours * 3600})
    atomic_write(out, (doc["token"] + "\n").encode(), mode=0o600)
    typer.echo(f"{role} token for {subject}{' of ' + tenant if tenant else ''} written to {out} "
               f"(valid {hours} h); use it with `sealed login --token-file {out} --profile NAME`")


def tenants_create(
    name: str = typer.Argument(..., help="tenant id (lowercase letters, digits, - and _)"),
    weight: float = typer.Option(1.0, help="share under weighted fair queueing"),
    rpm: int = typer.Option(None), tpm: int = typer.Option(None),
    token_budget: int = typer.Option(None, help="lifetime tokens of the tenant"),
    max_queued: int = typer.Option(None),
    broker_key: bool = typer.Option(True, "--broker-key/--no-broker-key",
                                    help="also create the tenant's key-encryption key at the key broker"),
    invitation_out: Path = typer.Option(None, help="where to write the tenant's invitation from the key broker "
                                                   "(default NAME.invitation.json): give it to the tenant"),
    profile: str = PROFILE, url: str = URL, as_json: bool = JSON,
) -> None:
    """Create (or update) a tenant in the control plane, and its key at the key broker, whose answer
    carries the tenant's invitation (the tenant answers it with `sealed keys admin-key --invitation`)."""
    body = {k: v for k, v in {"name": name, "weight": weight, "rpm": rpm, "tpm": tpm, "token_budget": token_budget,
                              "max_queued": max_queued}.items() if v is not None}
    doc = call("POST", "/tenants", profile=profile, url=url, body=body)
    line = f"tenant {doc['name']} (weight {doc['weight']}, rpm {doc['rpm']}, tpm {doc['tpm']}, " \
           f"budget {doc['token_budget']})"
    if broker_key and broker_credentials(profile) is not None:
        status = broker_call("GET", f"/tenants/{name}", profile=profile)
        if not status.get("has_key"):
            status = broker_call("POST", f"/tenants/{name}/key", profile=profile)
        line += f"; key broker: tenant key {'revoked' if status.get('revoked') else 'present'}"
        if status.get("invitation") is not None:
            out = invitation_out or Path(f"{name}.invitation.json")
            atomic_write(out, json.dumps(status["invitation"], indent=1, sort_keys=True).encode(), mode=0o644)
            line += f"; invitation for the tenant: {out}"
    elif broker_key:
        line += "; no key-broker credentials here: create its key with `sealed keys create --tenant`"
    show(doc, as_json, [line])


def tenants_list(profile: str = PROFILE, url: str = URL, as_json: bool = JSON) -> None:
    """Every tenant (operator, auditor)."""
    doc = call("GET", "/tenants", profile=profile, url=url)
    show(doc, as_json, [f"{t['name']}\tweight={t['weight']} rpm={t['rpm']} tpm={t['tpm']} "
                        f"budget={t['token_budget']}" for t in doc["data"]])


def apikeys_create(
    tenant: str = TENANT, name: str = typer.Option(..., help="a label for the key"),
    model: list[str] = typer.Option([], "--model", help="restrict the key to this model (repeatable)"),
    rpm: int = typer.Option(None), tpm: int = typer.Option(None),
    priority: int = typer.Option(0, min=-10, max=10),
    token_budget: int = typer.Option(None, help="lifetime tokens of this key"),
    expires_in_days: int = typer.Option(None, min=1),
    out: Path = typer.Option(None, help="write the secret here (0600) instead of printing it"),
    profile: str = PROFILE, url: str = URL,
) -> None:
    """Create an API key; its secret is shown once (only a hash is stored)."""
    expires = (dt.datetime.now(dt.UTC) + dt.timedelta(days=expires_in_days)).isoformat() if expires_in_days else None
    body = {"name": name, "models": model, "rpm": rpm, "tpm": tpm, "priority": priority,
            "token_budget": token_budget, "expires_at": expires}
    doc = call("POST", f"/tenants/{tenant}/keys", profile=profile, url=url,
               body={k: v for k, v in body.items() if v is not None})
    scope = ",".join(doc["models"]) or "all models"
    if out is not None:
        atomic_write(out, (doc["secret"] + "\n").encode(), mode=0o600)
        typer.echo(f"API key {doc['key_id']} for {tenant} ({scope}) written to {out}")
    else:
        typer.echo(f"API key {doc['key_id']} for {tenant} ({scope}); shown once:")
        typer.echo(doc["secret"])


def apikeys_digest(key_file: Path = typer.Argument(..., exists=True, help="file holding the API key's secret")
                   ) -> None:
    """The digest that lists this key in the tenant's signed caller policy (`callers.api_keys`;
    docs/policy.md). Computed locally: the secret is not sent anywhere."""
    from policy.callers import api_key_digest

    typer.echo(api_key_digest(key_file.read_text().strip()))


def apikeys_list(tenant: str = TENANT, profile: str = PROFILE, url: str = URL, as_json: bool = JSON) -> None:
    """The tenant's API keys (ids, scopes and limits; never secrets)."""
    doc = call("GET", f"/tenants/{tenant}/keys", profile=profile, url=url)
    show(doc, as_json, [f"{k['key_id']}\t{k['name']}\tmodels={','.join(k['models']) or '*'} rpm={k['rpm']} "
                        f"tpm={k['tpm']} priority={k['priority']} expires={k['expires_at']}" for k in doc["data"]])


def apikeys_revoke(key_id: str = typer.Argument(...), tenant: str = TENANT, profile: str = PROFILE,
                   url: str = URL) -> None:
    """Revoke an API key (refused on every gateway replica within a second)."""
    call("DELETE", f"/tenants/{tenant}/keys/{key_id}", profile=profile, url=url)
    typer.echo(f"revoked {key_id}")


def apikeys_kill_switch(key_id: str = typer.Argument(...), tenant: str = TENANT,
                        on: bool = typer.Option(..., "--on/--off", help="refuse (or allow again) the key's "
                                                                        "tool calls"),
                        profile: str = PROFILE, url: str = URL) -> None:
    """The agent kill switch: every tool call of this key's answers is refused while on."""
    call("PUT", f"/tenants/{tenant}/keys/{key_id}/kill-switch", profile=profile, url=url, body={"killed": on})
    typer.echo(f"{key_id}: tool calls {'refused' if on else 'allowed'}")


def policies_set(
    tenant: str = TENANT,
    file: Path = typer.Option(..., exists=True, help="signed policy set (the envelope `sealed policy sign` writes)"),
    admin_key: Path = typer.Option(None, exists=True, help="the tenant admin's Ed25519 public key (PEM) that "
                                                           "signed it; workers are measured with it"),
    profile: str = PROFILE, url: str = URL,
) -> None:
    """Store the tenant's signed in-enclave policy (data and tool-use controls) for its workers."""
    import json

    body = {"document": json.loads(file.read_text())}
    if admin_key is not None:
        body["admin_key_pem"] = admin_key.read_text()
    doc = call("PUT", f"/tenants/{tenant}/policy", profile=profile, url=url, body=body)
    typer.echo(f"policy of {tenant} is now version {doc['version']}")


def policies_sign(
    file: Path = typer.Option(..., exists=True, help="the policy set JSON (data and tool-use controls)"),
    admin_key: Path = typer.Option(..., "--admin-key", exists=True,
                                   help="the tenant's policy-admin Ed25519 private key (PEM; the tenant's file)"),
    key_id: str = typer.Option(..., "--key-id", help="the admin key's id, as registered for the tenant"),
    out: Path = typer.Option(..., "--out", help="where to write the signed envelope for `sealed policies set`"),
) -> None:
    """Sign a policy set with the tenant's policy-admin key, on the tenant's machine (no server call)."""
    from policy.cli import policy_sign

    envelope = policy_sign(file, admin_key, key_id, out)
    typer.echo(f"signed with key {key_id} -> {out} ({len(envelope)} fields)")


def policies_show(tenant: str = TENANT, profile: str = PROFILE, url: str = URL) -> None:
    """The tenant's stored policy document."""
    show(call("GET", f"/tenants/{tenant}/policy", profile=profile, url=url), True)


def policies_release(
    tenant: str = TENANT,
    file: Path = typer.Option(..., exists=True, help="release policy JSON (versions only move forward)"),
    admin_key: Path = typer.Option(None, "--admin-key", exists=True,
                                   help="the tenant's policy-admin private key (default: this host's "
                                        "<home>/tenants/<tenant>/policy-admin.pem, made if missing)"),
    profile: str = PROFILE,
) -> None:
    """Sign the tenant's key-release policy with its policy-admin key (registered at the key broker
    first if the tenant has none) and upload it: which workers may get the tenant's keys."""
    from api.cli import release_signing as rs

    key = rs.admin_key(tenant, admin_key)

    def as_tenant(method: str, path: str, body: Any) -> Any:
        return broker_tenant_call(method, path, tenant=tenant, profile=profile, body=body, missing_ok=True)

    creds = broker_credentials(profile)
    if creds is None:
        raise typer.BadParameter("no key broker URL: set $SEALED_BROKER_URL (or `sealed login --local-operator`)")
    rs.ensure_registered(as_tenant, tenant, key)
    key_id = tenant_broker.guard(creds[0], tenant, default_home())  # issue #46: its own key governs there
    envelope = rs.signed_release(rs.read_json(file), tenant, key, key_id)
    doc = broker_call("PUT", f"/tenants/{tenant}/policies", profile=profile, body=envelope)
    typer.echo(f"release policy {doc.get('policy_id')} v{doc.get('version')} for {tenant}/{doc.get('model')} "
               f"(signed by {key_id})")


def _group(help_: str, commands: dict) -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, help=help_)
    for name, fn in commands.items():
        app.command(name)(fn)
    return app


def build_tokens() -> typer.Typer:
    return _group("Management tokens.", {"create": tokens_create})


def build_tenants() -> typer.Typer:
    return _group("Tenants of the control plane.", {"create": tenants_create, "list": tenants_list})


def build_apikeys() -> typer.Typer:
    return _group("API keys clients send to the gateway (scopes, limits, budgets). Broker tenant keys: "
                  "`sealed keys`.", {"create": apikeys_create, "list": apikeys_list, "revoke": apikeys_revoke,
                                     "kill-switch": apikeys_kill_switch, "digest": apikeys_digest})


def build_policies() -> typer.Typer:
    from api.cli.revocations import revocations

    return _group("Tenant policies: in-enclave controls (sign, set, show), key release (release), the tenant's "
                  "revocation list for its clients (revocations).",
                  {"sign": policies_sign, "set": policies_set, "show": policies_show, "release": policies_release,
                   "revocations": revocations})
