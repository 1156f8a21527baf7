"""The policies page: a tenant's policy versions, whether each is signed by a pinned key, and the
difference between two versions."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from api.console.pages.render import pick_tenant, render, tenants_of
from api.console.session import Viewer, viewer
from api.console.state import Console
from api.gateway.dependencies import get_service
from api.gateway.service import GatewayService
from policy.documents import verify_policy_document
from policy.errors import PolicyError

router = APIRouter(prefix="/console", include_in_schema=False)


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


@router.get("/policies", response_class=HTMLResponse)
def policies_page(request: Request, state: Console, who: Viewer = Depends(viewer), tenant: str | None = None,
                  a: int | None = None, b: int | None = None,
                  service: GatewayService = Depends(get_service)) -> HTMLResponse:
    chosen = pick_tenant(service, who, tenant)
    versions = service.store.policy_versions(chosen) if chosen else []
    rows = [{"version": v.version, "created_at": v.created_at,
             **policy_signature(chosen or "", v.document, state.settings.policy_keys_dir)} for v in versions]
    by_version = {v.version: v.document for v in versions}
    diff, pair = None, None
    if len(versions) >= 2:
        new = b if b is not None and b in by_version else versions[0].version
        old = a if a is not None and a in by_version else versions[1].version
        diff, pair = policy_diff(by_version[old], by_version[new], old, new), (old, new)
    return render(state, request, "policies.html", who, tenant=chosen, tenants=tenants_of(service, who), rows=rows,
                  diff=diff, pair=pair)
