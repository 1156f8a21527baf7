"""The gateway's parts reach routes only as a dependency bound by `create_app` (api/gateway/dependencies.py):
no service locator on the app, and each app serves the parts it was built with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.gateway.router import router
from api.gateway.settings import GatewaySettings
from tests.api.gateway_client import GatewayClient

ROOT = Path(__file__).resolve().parents[2]


def test_no_module_of_the_control_plane_reads_the_parts_from_the_app_state() -> None:
    readers = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "api").rglob("*.py"))
               if re.search(r"\.state\.service\b|state\.service\s*=|gateway_of\(", p.read_text())]
    assert readers == []


def test_each_app_serves_the_parts_it_was_built_with(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = GatewayClient(GatewaySettings(data_dir=tmp_path / "one", dev=True))
    two = GatewayClient(GatewaySettings(data_dir=tmp_path / "two", dev=True))
    secret, _ = one.service.store.create_key("acme", "k")
    headers = {"Authorization": f"Bearer {secret}"}
    assert one.get("/v1/models", headers=headers).status_code == 200
    assert two.get("/v1/models", headers=headers).status_code == 401  # the other app's store knows no such key


def test_routes_on_an_app_that_bound_no_parts_fail_closed() -> None:
    app = FastAPI()
    app.include_router(router)
    with TestClient(app, raise_server_exceptions=True) as client, pytest.raises(RuntimeError, match="no gateway bound"):
        client.get("/v1/models", headers={"Authorization": "Bearer sk-anything"})
