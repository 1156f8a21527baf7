"""Gateway logic: resolve a tenant's model to a worker, check it is ready, relay its token stream.

The gateway is outside the trust boundary: it never sees weights or keys, and never logs content.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from api.gateway.errors import GatewayError
from api.gateway.keys import ApiKey, ApiKeyStore
from api.gateway.settings import GatewaySettings, WorkerRoute

log = logging.getLogger(__name__)


class GatewayService:
    def __init__(self, settings: GatewaySettings, keys: ApiKeyStore, http: httpx.AsyncClient) -> None:
        self.settings = settings
        self.keys = keys
        self._http = http
        self._status: dict[str, tuple[float, dict[str, Any]]] = {}

    async def close(self) -> None:
        await self._http.aclose()

    def models_for(self, key: ApiKey) -> list[WorkerRoute]:
        seen: dict[str, WorkerRoute] = {}
        for route in self.settings.workers:
            if route.tenant == key.tenant and (not key.models or route.model in key.models):
                seen.setdefault(route.model, route)
        return list(seen.values())

    def resolve(self, key: ApiKey, model: str) -> list[WorkerRoute]:
        routes = [r for r in self.settings.workers
                  if r.tenant == key.tenant and r.model == model and (not key.models or model in key.models)]
        if not routes:
            # Same answer whether the model exists for another tenant or not at all.
            raise GatewayError(404, f"The model `{model}` does not exist or you do not have access to it.",
                               code="model_not_found", param="model")
        return routes

    async def worker_status(self, route: WorkerRoute) -> dict[str, Any]:
        cached = self._status.get(route.url)
        if cached and time.monotonic() - cached[0] < self.settings.status_cache_s:
            return cached[1]
        try:
            response = await self._http.get(f"{route.url}/internal/status", timeout=5.0)
            status = response.json() if response.status_code == 200 else {"status": "failed"}
        except (httpx.HTTPError, ValueError):
            status = {"status": "unreachable"}
        self._status[route.url] = (time.monotonic(), status)
        return status

    async def pick_worker(self, routes: list[WorkerRoute]) -> tuple[WorkerRoute, dict[str, Any]]:
        states = []
        for route in routes:
            status = await self.worker_status(route)
            if status.get("status") == "ready":
                return route, status
            states.append(status.get("status", "unknown"))
        raise GatewayError(503, f"model unavailable: no attested worker is serving it ({', '.join(states)})",
                           type_="model_unavailable", code="model_unavailable")

    async def generate(self, route: WorkerRoute, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Open the worker stream; errors before the first token become GatewayErrors."""
        request = self._http.build_request("POST", f"{route.url}/internal/generate", json=body,
                                           timeout=httpx.Timeout(self.settings.request_timeout_s, connect=5.0))
        try:
            response = await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise GatewayError(503, "model unavailable: worker unreachable", type_="model_unavailable",
                               code="model_unavailable") from exc
        if response.status_code != 200:
            raw = await response.aread()
            await response.aclose()
            try:
                message = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = "worker error"
            status = 400 if response.status_code == 400 else 503
            raise GatewayError(status, message if status == 400 else "model unavailable",
                               type_="invalid_request_error" if status == 400 else "model_unavailable")
        return self._lines(response)

    async def _lines(self, response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
        try:
            async for line in response.aiter_lines():
                if line.strip():
                    yield json.loads(line)
        except httpx.HTTPError as exc:
            raise GatewayError(502, "worker stream ended unexpectedly", type_="server_error") from exc
        finally:
            await response.aclose()

    async def attestation(self) -> list[dict[str, Any]]:
        out = []
        for route in self.settings.workers:
            try:
                response = await self._http.get(f"{route.url}/internal/attestation", timeout=5.0)
                doc = response.json() if response.status_code == 200 else {"status": "unavailable"}
            except (httpx.HTTPError, ValueError):
                doc = {"status": "unreachable"}
            out.append({"model": route.model, "version": route.version, "tenant": route.tenant, **doc})
        return out
