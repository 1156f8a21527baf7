"""The console's state (settings, audit index, broker view, templates, its own audit log), built once
by `install` and handed to the routes as a typed dependency (`Console`), never kept on `app.state`."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.templating import Jinja2Templates

from api.console.auditindex import AuditIndex
from api.console.broker import BrokerView
from api.console.views import Facets
from api.console_settings import ConsoleSettings
from api.home import ed25519_key, write_public_key
from api.parts import bound_part
from policy.audit import AuditLog
from policy.errors import PolicyError

log = logging.getLogger(__name__)


AUDIT_COMPONENT = "console"


@dataclass
class ConsoleState:
    settings: ConsoleSettings
    index: AuditIndex | None
    facets: Facets
    broker: BrokerView
    templates: Jinja2Templates
    audit_key_file: Path | None = None
    _audit: AuditLog | None = None
    _audit_lock: threading.Lock = field(default_factory=threading.Lock)

    def audit_log(self) -> AuditLog | None:
        """The console's own audit log (``console.audit.jsonl`` in the audit directory, its key
        beside the gateway's data), opened at the first action; None without an audit directory."""
        directory = self.settings.audit_dir
        if directory is None or self.audit_key_file is None:
            return None
        with self._audit_lock:
            if self._audit is None:
                key = ed25519_key(self.audit_key_file)
                (directory / "keys").mkdir(parents=True, exist_ok=True)
                write_public_key(key, directory / "keys" / f"{AUDIT_COMPONENT}.pem")
                try:
                    self._audit = AuditLog(directory / f"{AUDIT_COMPONENT}.audit.jsonl", key, AUDIT_COMPONENT)
                except (OSError, PolicyError) as exc:
                    # Another replica holds it (one writer per file): its process log still has the action.
                    log.error("console audit log unavailable (%s)", type(exc).__name__)
                    return None
            return self._audit

    def close(self) -> None:
        self.broker.close()
        if self._audit is not None:
            self._audit.close()


async def get_console() -> ConsoleState:
    """The console's state: `install` binds the one it built in this one's place (api/parts.py)."""
    raise RuntimeError("no console bound: serve it with api.console.router.install")


def bound_console(app: FastAPI) -> ConsoleState:
    """The state bound in `app`'s routes (for tools that hold the app, e.g. the console benchmark)."""
    try:
        state: ConsoleState = bound_part(app, get_console)
    except LookupError:
        raise RuntimeError("no console bound to this app") from None
    return state


Console = Annotated[ConsoleState, Depends(get_console)]
