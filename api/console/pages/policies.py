"""The policies page: a tenant's policy versions, whether each is signed by a pinned key, and the
difference between two versions."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from api.console.pages.render import pick_tenant, render, tenants_of
from api.console.session import Viewer, viewer
from api.console.state import Console
from api.console.views import policy_diff, policy_signature
from api.gateway.dependencies import get_service
from api.gateway.service import GatewayService

router = APIRouter(prefix="/console", include_in_schema=False)


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
