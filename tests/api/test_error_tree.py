"""The control plane's one error tree (api/errors.py): every exception class api/ defines derives
from SealedApiError (or from the gateway's OpenAI-shaped tree), and one that reaches the HTTP edge
unanswered is opaque: a 500 that names nothing of it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.errors import SealedApiError
from api.gateway.settings import GatewaySettings
from api.orchestrator.pin import PinError

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = {"Exception", "ValueError", "RuntimeError", "LookupError", "KeyError", "OSError", "TypeError",
           "PermissionError"}


def _exception_classes() -> list[tuple[str, str, list[str]]]:
    out = []
    for path in sorted((ROOT / "api").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
                if set(bases) & (BUILTIN | {"SealedApiError"}):
                    out.append((str(path.relative_to(ROOT)), node.name, bases))
    return out


def test_every_exception_class_of_api_is_in_the_tree() -> None:
    found = _exception_classes()
    assert len([n for _, n, bases in found if "SealedApiError" in bases]) >= 14  # the probe sees them
    assert [(f, n) for f, n, bases in found if "SealedApiError" not in bases and n != "SealedApiError"] == []


def test_they_keep_the_builtin_they_were() -> None:
    assert issubclass(PinError, ValueError) and issubclass(PinError, SealedApiError)


def test_an_unanswered_error_is_opaque_at_the_edge(tmp_path: Path) -> None:
    app = create_app(GatewaySettings(data_dir=tmp_path, dev=True, jwt_secret="s" * 48))

    @app.get("/__boom")
    def boom() -> None:
        raise PinError("tenant acme's secret path /srv/x")

    response = TestClient(app, raise_server_exceptions=False).get("/__boom")
    assert response.status_code == 500
    assert response.json() == {"error": {"message": "internal error", "type": "internal_error"}}
    assert "acme" not in response.text and "/srv/x" not in response.text


@pytest.mark.parametrize("name", ["ConsoleAuthError", "ConsoleForbidden"])
def test_the_more_specific_handlers_still_win(name: str) -> None:
    from api.console import session

    assert issubclass(getattr(session, name), SealedApiError)
