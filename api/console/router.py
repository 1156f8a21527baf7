"""The console's routes under /console: login, audit, workers, keys, usage, policies, exports.

``install(binder, settings)`` adds them to the gateway app next to the management API, with the
console's state bound in its routes (api/parts.py); they use the
same tokens and roles (operator, tenant admin, auditor) through a browser session cookie. The pages
are in api/console/pages/, one module per domain.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from api.console.auditindex import AuditIndex
from api.console.broker import BrokerView
from api.console.headers import ConsoleHeaders
from api.console.pages import audit, keys, policies, signin, usage, workers
from api.console.pages.render import render
from api.console.session import ConsoleAuthError, ConsoleForbidden
from api.console.sso import router as sso_router
from api.console.state import ConsoleState, get_console
from api.console.views import Facets
from api.console_settings import ConsoleSettings
from api.parts import RouteBinder
from policy.audit import CheckpointAnchor, SqlAnchor, WitnessFile

HERE = Path(__file__).parent

ROUTERS = (signin.router, audit.router, workers.router, keys.router, usage.router, policies.router, sso_router)


def install(binder: RouteBinder, settings: ConsoleSettings, data_dir: Path, *, sso: bool = False,
            local_auth: bool = True) -> None:
    """Serve the console from ``binder.app`` (the gateway with its management API, whose parts
    ``binder`` binds; the console's state is bound here); ``data_dir`` keeps the console's audit
    signing key. ``sso``: sign-in through the IdP (api/console/sso.py); ``local_auth``: the pasted
    local management token (the development mode, or SSO's opt-in)."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.autoescape = True
    templates.env.globals.update(sso=sso, local_auth=local_auth, dev_auth=local_auth and not sso)
    anchors: list[CheckpointAnchor] = []
    if settings.audit_witness is not None:
        anchors.append(WitnessFile(settings.audit_witness))
    if settings.audit_anchor_url:
        anchors.append(SqlAnchor(settings.audit_anchor_url))
    index = (AuditIndex(settings.audit_dir, settings.keys_dir, anchors) if settings.audit_dir is not None
             else None)
    state = ConsoleState(settings, index, Facets(), BrokerView(settings.broker_url), templates,
                         audit_key_file=data_dir / "console-audit.pem")
    binder.bind(get_console, state)
    for router in ROUTERS:
        binder.include(router)
    app = binder.app
    app.mount("/console/static", StaticFiles(directory=str(HERE / "static")), name="console-static")

    async def auth_error(request: Request, _: Exception) -> Response:
        return RedirectResponse("/console/login", status_code=303)

    async def forbidden(request: Request, exc: Exception) -> Response:
        response = render(state, request, "error.html", None, message=str(exc))
        response.status_code = 403
        return response

    app.add_exception_handler(ConsoleAuthError, auth_error)
    app.add_exception_handler(ConsoleForbidden, forbidden)

    app.add_middleware(ConsoleHeaders)
