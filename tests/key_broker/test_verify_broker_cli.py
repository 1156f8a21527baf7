"""`sealed verify --broker URL` against a real broker process: it prints what the hardware evidence
showed; one byte of the evidence changed on the way (an operator proxy) makes it fail; a measurement
that is not pinned makes it fail. The measurement `sealed up` computes offline for a broker's
settings is the one the broker computes for itself."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from api.cli.main import build
from key_broker.measurement import simulated_measurement
from key_broker.settings import BrokerSettings
from tests.key_broker.test_broker_process import BrokerProcess
from tests.security.test_operator_attacks_broker import BrokerProxy


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path)
    process.start()
    yield process
    process.stop()


def _measurement(broker: BrokerProcess) -> str:
    settings = BrokerSettings(data_dir=broker.root / "broker", sim_platform_public_key=broker.pub,
                              sim_platform_signing_key=broker.broker_platform)
    return simulated_measurement(settings).hex()


def _policy(tmp_path: Path, broker: BrokerProcess, measurement: str) -> Path:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(broker.broker_platform.read_bytes(), None)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)  # type: ignore[union-attr]
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"tenant": "acme", "evidence": {"sim_platform_key": raw.hex()},
                                "broker": {"tee": "sim", "measurements": [measurement]}}))
    return path


def _verify(url: str, policy: Path) -> Any:
    return CliRunner().invoke(build(), ["verify", "--broker", url, "--policy", str(policy), "--unsafe-allow-simulated"])


def test_sealed_verify_broker_prints_what_the_evidence_showed(broker: BrokerProcess, tmp_path: Path) -> None:
    measurement = _measurement(broker)
    result = _verify(broker.url, _policy(tmp_path, broker, measurement))
    assert result.exit_code == 0, result.output
    assert f"measurement   {measurement} (pinned)" in result.output
    assert "identity document sha256" in result.output and "INSECURE: simulated" in result.output


def test_a_tampered_byte_or_another_measurement_fails(broker: BrokerProcess, tmp_path: Path) -> None:
    import threading

    def flip(path: str, _: dict, answer: dict) -> dict:
        raw = bytearray(base64.b64decode(answer["evidence"]["cpu_evidence"]))
        raw[len(raw) // 3] ^= 1  # one byte of the signed report body
        answer["evidence"]["cpu_evidence"] = base64.b64encode(bytes(raw)).decode()
        return answer

    proxy = BrokerProxy(broker.url, flip)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        result = _verify(proxy.url, _policy(tmp_path, broker, _measurement(broker)))
    finally:
        proxy.shutdown()
    assert result.exit_code == 1 and "NOT verified" in result.output, result.output
    other = _verify(broker.url, _policy(tmp_path, broker, bytes(48).hex()))
    assert other.exit_code == 1 and "BrokerIdentityError" in other.output, other.output
