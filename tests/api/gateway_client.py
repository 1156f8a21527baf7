"""A TestClient over the composed app, with the gateway's parts it was built from: tests inspect and
seed those directly; the routes get them only as a dependency (api/gateway/dependencies.py)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from api.app import build_gateway, create_app
from api.gateway.service import GatewayService
from api.gateway.settings import GatewaySettings


class GatewayClient(TestClient):
    def __init__(self, settings: GatewaySettings, **kw: Any) -> None:
        self.service: GatewayService = build_gateway(settings)
        super().__init__(create_app(settings, self.service), **kw)
