"""mypy passes on every product package and the development ones (pyproject.toml [tool.mypy]:
protocol, attestation, key_broker, policy, enclave_worker, sealed_client, api; devtools/sealed_bench,
devtools/sealed_fakes); untyped definitions and implicit Any returns refused everywhere;
enclave_worker (the code inside the trust boundary), protocol, key_broker, sealed_client, attestation
and policy under mypy's strict flags as well."""

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
