"""Sealing keys (attestation/sealing.py): the simulated TEE's (platform key + measurement) and SEV-SNP's
(MSG_KEY_REQ through /dev/sev-guest, against the fake device at the ioctl seam). A blob opens only
for the same TEE, measurement, platform and label; an edited blob is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.errors import SealingError
from attestation.sealing import seal, unseal
from attestation.sim.sealing import SimSealingKey
from attestation.snp.derived_key import SnpDerivedKey
from sealed_fakes.fake_sev_guest import FakeSevGuest

M1, M2 = bytes(range(48)), bytes(range(1, 49))


def test_sim_sealing_opens_only_for_its_measurement_platform_and_label() -> None:
    platform = Ed25519PrivateKey.generate()
    blob = seal(SimSealingKey(platform, M1), "state", b"secret")
    assert unseal(SimSealingKey(platform, M1), "state", blob) == b"secret"
    with pytest.raises(SealingError, match="another workload"):
        unseal(SimSealingKey(platform, M2), "state", blob)
    with pytest.raises(SealingError, match="does not open"):
        unseal(SimSealingKey(Ed25519PrivateKey.generate(), M1), "state", blob)
    with pytest.raises(SealingError, match="not 'other'"):
        unseal(SimSealingKey(platform, M1), "other", blob)
    doc = json.loads(blob)
    doc["measurement"] = M2.hex()  # relabelled to another workload: the AAD no longer matches
    with pytest.raises(SealingError):
        unseal(SimSealingKey(platform, M2), "state", json.dumps(doc).encode())
    with pytest.raises(SealingError, match="malformed"):
        unseal(SimSealingKey(platform, M1), "state", b"{}")


def test_snp_derived_key_through_the_fake_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    device = FakeSevGuest(tmp_path / "sev-guest", lambda data, vmpl: b"", launch_measurement=M1)
    monkeypatch.setattr(fcntl, "ioctl", device.router(fcntl.ioctl))
    blob = seal(SnpDerivedKey(M1, device=device.device), "state", b"secret")
    assert unseal(SnpDerivedKey(M1, device=device.device), "state", blob) == b"secret"  # after a restart
    device.launch_measurement = M2  # another image on the same chip: the firmware derives another key
    with pytest.raises(SealingError):
        unseal(SnpDerivedKey(M1, device=device.device), "state", blob)
    device.launch_measurement, device.chip_secret = M1, b"another chip"
    with pytest.raises(SealingError, match="does not open"):
        unseal(SnpDerivedKey(M1, device=device.device), "state", blob)
    with pytest.raises(SealingError, match="cannot open"):
        SnpDerivedKey(M1, device=tmp_path / "no-such-device")
