"""The vendor roots a broker verifies workers under are part of what it is: on a hardware TEE a roots
directory's content (not only its path) is in the broker's measured configuration, so other roots
make another init-data (and the broker refuses to start under the old one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from key_broker.errors import SettingsError
from key_broker.measurement import measured_config, roots_digest, simulated_measurement
from key_broker.settings import BrokerSettings


def _settings(tmp_path: Path, roots: Path | None, tee: str = "snp") -> BrokerSettings:
    if tee != "sim":
        return BrokerSettings(data_dir=tmp_path / "broker", roots_dir=roots, tee=tee)
    signing = tmp_path / "platform.pem"
    if not signing.exists():
        signing.write_bytes(Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return BrokerSettings(data_dir=tmp_path / "broker", roots_dir=roots, sim_platform_signing_key=signing, tee=tee)


def test_the_packaged_roots_add_nothing(tmp_path: Path) -> None:
    assert "roots_sha256" not in measured_config(_settings(tmp_path, None))


def test_another_root_in_the_same_directory_is_another_broker(tmp_path: Path) -> None:
    roots = tmp_path / "roots"
    roots.mkdir()
    (roots / "amd-ark-milan.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    settings = _settings(tmp_path, roots)
    before = measured_config(settings)["roots_sha256"]
    (roots / "amd-ark-milan.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n")
    assert measured_config(settings)["roots_sha256"] != before
    (roots / "amd-ark-milan.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    assert roots_digest(roots) == before  # content, not time: the same bytes measure the same
    (roots / "extra-root.pem").write_bytes(b"x")
    assert roots_digest(roots) != before  # an added file is another set of roots


def test_on_the_simulated_tee_roots_add_nothing(tmp_path: Path) -> None:
    """The operator holds the simulated platform key: measuring test roots there would protect nothing."""
    roots = tmp_path / "roots"
    roots.mkdir()
    settings = _settings(tmp_path, roots, tee="sim")
    assert "roots_sha256" not in measured_config(settings)
    assert simulated_measurement(settings) == simulated_measurement(_settings(tmp_path, None, tee="sim"))


def test_an_unreadable_roots_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot be read"):
        measured_config(_settings(tmp_path, tmp_path / "absent"))
