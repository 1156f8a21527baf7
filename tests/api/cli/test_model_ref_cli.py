"""`sealed models ...` parse --tenant/--model/--version into a ModelRef before anything is sent:
a name that is no ModelRef name is a usage error (exit 2) and no request leaves the CLI."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

import api.cli.models as models
from api.cli.main import build

BAD = [("--model", "m/../other"), ("--model", "a..b"), ("--version", "v 1"), ("--tenant", "ac/me")]


@pytest.fixture()
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []

    def call(method: str, path: str, **_: Any) -> dict[str, Any]:
        calls.append((method, path))
        return {"data": [], "model": "m", "version": "v1", "traffic_percent": 100, "min_warm": 1}

    monkeypatch.setattr(models, "call", call)
    return calls


def sealed(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(build(), list(args))
    return result.exit_code, result.output


def names(**change: str) -> list[str]:
    parts = {"--tenant": "acme", "--model": "m", "--version": "v1", **change}
    return [x for kv in parts.items() for x in kv]


@pytest.mark.parametrize("command", ["register", "promote", "retire"])
@pytest.mark.parametrize(("option", "value"), BAD)
def test_a_bad_name_is_refused_before_any_request(sent: list[tuple[str, str]], command: str, option: str,
                                                  value: str) -> None:
    code, out = sealed("models", command, *names(**{option: value}))
    assert code == 2, out
    assert sent == []


def test_good_names_reach_the_api_as_one_path(sent: list[tuple[str, str]]) -> None:
    code, out = sealed("models", "retire", *names())
    assert code == 0, out
    assert sent == [("POST", "/tenants/acme/models/m/versions/v1/retire")]
