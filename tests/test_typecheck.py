"""mypy passes on every product package (pyproject.toml [tool.mypy]: protocol, attestation,
key_broker, policy, enclave_worker, sealed_client, api, sealed_bench); untyped definitions and
implicit Any returns refused everywhere; enclave_worker (the code inside the trust boundary),
protocol, key_broker and sealed_client under mypy's strict flags as well."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_is_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    stdout, stderr, rc = api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert rc == 0, stdout + stderr
    assert "Success" in stdout, stdout
