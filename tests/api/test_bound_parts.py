"""The control plane's parts reach routes as typed dependencies that `create_app` binds into each route
once (api/parts.py; no `app.state` locator, no `app.dependency_overrides`): the single sign-on
verifier, the package store, the console's state; and the management audit keeps scalars only."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.app import create_app
from api.console.state import bound_console
from api.gateway.dependencies import get_service
from api.gateway.files_routes import get_retrieval
from api.gateway.service import GatewayService
from api.gateway.settings import GatewaySettings
from api.gateway.vector_stores import GatewayRetrieval
from api.management import uploads
from api.management.audit import audit_admin
from api.management.auth import Principal
from api.management.oidc import get_oidc_verifier
from api.parts import RouteBinder, bound_part
from policy.audit import AuditLog
from policy.audit.query import read_entries


def test_create_app_binds_its_parts_and_keeps_none_on_app_state(tmp_path: Path) -> None:
    app = create_app(GatewaySettings(data_dir=tmp_path, dev=True))
    assert isinstance(bound_part(app, uploads.package_store), uploads.PackageStore)
    assert bound_part(app, get_oidc_verifier) is None  # None bound: the local-development mode
    assert isinstance(bound_part(app, get_service), GatewayService)
    assert isinstance(bound_part(app, get_retrieval), GatewayRetrieval)
    assert bound_console(app).settings == GatewaySettings(data_dir=tmp_path, dev=True).console
    # No override: FastAPI would rebuild every route's dependency graph on every request.
    assert app.dependency_overrides == {}
    for locator in ("oidc", "package_store", "console", "service"):  # nothing kept on app.state
        assert not hasattr(app.state, locator)


def test_an_app_without_a_bound_part_refuses() -> None:
    app = FastAPI()
    binder = RouteBinder(app)
    binder.replace(uploads.uploader, lambda: "acme")
    binder.include(uploads.router)
    with TestClient(app) as client:  # no package store bound: uploads are off here
        r = client.post("/v1/packages/uploads", json={"tenant": "acme", "files": []})
    assert r.status_code == 404 and "not enabled" in r.text
    with pytest.raises(RuntimeError, match="no console bound"):
        bound_console(app)


def test_the_management_audit_names_the_principal_and_drops_what_is_not_a_scalar(tmp_path: Path) -> None:
    path = tmp_path / "gateway.audit.jsonl"
    with AuditLog(path, Ed25519PrivateKey.generate(), "gateway") as audit:
        audit_admin(
            audit,
            Principal("alice", "operator", None),
            "acme",
            "api-key-create",
            key_id="k1",
            models=["m"],
            secret=object(),
            percent=10,
        )
    (entry,) = read_entries(path)
    assert (entry.tenant, entry.action, entry.decision) == ("acme", "api-key-create", "allow")
    assert dict(entry.metadata) == {"principal": "alice", "role": "operator", "key_id": "k1", "percent": 10}
