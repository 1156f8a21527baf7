"""The control plane's composition root: one HTTP app with the gateway (OpenAI, sealed and internal
routes), the management API (`/admin/v1`, package uploads) and the web console (`/console`).

The parts do not know each other: the gateway imports neither management nor the console (an
import contract, pyproject.toml); management and the console read the gateway's state through
its service (`app.state.service`); the console talks to the key broker only through the broker's
admin HTTP API and the contracts in `protocol.broker`. Nothing is built at import time.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from api.console.router import install as install_console
from api.errors import SealedApiError
from api.gateway.app import build_service, gateway_app
from api.gateway.settings import GatewaySettings
from api.management import uploads
from api.management.app import router as management_router
from api.management.lifecycle import router as lifecycle_router
from api.management.metrics import router as metrics_router
from api.management.oidc import OidcVerifier
from api.management.sessions import router as sessions_router


def create_app(settings: GatewaySettings) -> FastAPI:
    app = gateway_app(settings, build_service(settings))
    app.include_router(management_router, prefix="/admin/v1")
    app.include_router(lifecycle_router, prefix="/admin/v1")
    app.include_router(sessions_router, prefix="/admin/v1")  # logout, revocation, tenant removal
    app.include_router(metrics_router)  # /metrics: management tokens (operator, auditor)
    app.include_router(uploads.router)  # package uploads, for tenant admins
    app.state.package_store = uploads.PackageStore(settings.data_dir / "package-store")
    oidc = settings.oidc
    app.state.oidc = OidcVerifier(oidc) if oidc is not None else None
    if oidc is None:
        logging.getLogger("api.app").warning(
            "auth: LOCAL DEVELOPMENT MODE - management API and console accept shared-secret HS256 tokens, "
            "no single sign-on; configure --oidc-config for production")
    elif oidc.accept_local_tokens:
        logging.getLogger("api.app").warning(
            "auth: single sign-on, and local HS256 management tokens accepted too (accept_local_tokens)")
    install_console(app, settings.console, settings.data_dir, sso=oidc is not None and oidc.console_enabled,
                    local_auth=oidc is None or oidc.accept_local_tokens)
    app.add_exception_handler(SealedApiError, opaque_error)  # the more specific handlers above win
    return app


async def opaque_error(request: Request, exc: Exception) -> JSONResponse:
    """The edge of the control plane's error tree (api/errors.py): an error no route answered says
    nothing of itself to the caller; the log names its type only (a message may name a tenant or a path)."""
    logging.getLogger("api.app").error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path)
    return JSONResponse({"error": {"message": "internal error", "type": "internal_error"}}, status_code=500)
