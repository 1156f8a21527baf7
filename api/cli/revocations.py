"""`sealed policies revocations`: the tenant signs its revocation list for its clients (offline).

A broker's state can be rolled back with its anchors; what the tenant signs cannot. The list goes to
the tenant's clients (the `revocations` file of their client policy); each refuses a worker whose
release policy, data key or signing policy-admin key it names, and keeps the newest serial it has
verified (policy/revocations.py, sealed_client/tenant_pin.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer


def revocations(
    tenant: str = typer.Option(..., help="the tenant the list is for"),
    serial: int = typer.Option(..., min=1, help="higher than every list signed before (clients keep the newest)"),
    out: Path = typer.Option(..., help="where to write the signed list (give it to the tenant's clients)"),
    revoke_release_policy: list[str] = typer.Option([], "--revoke-release-policy",
                                                    help="POLICY_ID:VERSION a worker's key may no longer come under"),
    revoke_data_key: list[str] = typer.Option([], "--revoke-data-key", help="a data key id (package manifest key_id)"),
    revoke_admin_key: list[str] = typer.Option([], "--revoke-admin-key",
                                               help="a policy-admin key id whose signatures no longer count"),
    admin_key: Path = typer.Option(None, "--admin-key", exists=True,
                                   help="the tenant's policy-admin private key (default: this host's "
                                        "<home>/tenants/<tenant>/policy-admin.pem)"),
    key_id: str = typer.Option(None, "--key-id", help="its key id (default: <tenant>-admin)"),
) -> None:
    """Sign the tenant's revocation list with its policy-admin key."""
    from api.cli import release_signing as rs
    from policy.revocations import RevocationList, sign_revocation_list

    policies: set[tuple[str, int]] = set()
    for item in revoke_release_policy:
        policy_id, _, version = item.rpartition(":")
        if not policy_id or not version.isdigit():
            raise typer.BadParameter(f"{item!r}: give POLICY_ID:VERSION")
        policies.add((policy_id, int(version)))
    listed = RevocationList(tenant=tenant, serial=serial, revoked_release_policies=frozenset(policies),
                            revoked_data_keys=frozenset(revoke_data_key),
                            revoked_admin_keys=frozenset(revoke_admin_key))
    signer = key_id or rs.default_key_id(tenant)
    envelope = sign_revocation_list(listed, rs.admin_key(tenant, admin_key), signer)
    out.write_text(json.dumps(envelope, indent=1, sort_keys=True))
    typer.echo(f"revocation list {serial} for {tenant} signed by {signer}: {len(policies)} release policies, "
               f"{len(revoke_data_key)} data keys, {len(revoke_admin_key)} policy-admin keys -> {out}")
