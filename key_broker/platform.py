"""The key broker's own TEE: what attests the broker and what its state is sealed with.

* `sim`: the simulated TEE. Reports signed and sealing keys derived from the simulated platform key
  (a file on the operator's disk: nothing is protected from the operator; docs/security.md), the
  measurement computed over the broker's own code and measured configuration (key_broker/measurement.py).
* `snp`: reports through configfs-tsm or /dev/sev-guest (attestation.attesters), the sealing key
  from the firmware (MSG_KEY_REQ, attestation.snp.derived_key), bound to the launch measurement.
* `tdx`: attests like the worker, but the TDX module offers no sealing key: the broker's keys live
  only in its memory, made anew at each start, and its state is in OpenBao (vault key store only);
  docs/security.md has the design (a state key from an attested key service) that would persist them.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.attesters import Attester, SimAttester, hardware_attester
from attestation.errors import AttestationError
from attestation.sealing import SealingKeySource
from attestation.sim import SimTee
from attestation.sim.sealing import SimSealingKey
from key_broker.errors import SealedStateError, SettingsError
from key_broker.measurement import simulated_measurement
from key_broker.settings import BrokerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerPlatform:
    tee: str
    measurement: bytes
    attester: Attester
    sealing: SealingKeySource | None  # None: no sealing key on this TEE (TDX): keys only in memory
    sim_key: Ed25519PrivateKey | None = None  # simulated TEE only: derives any build's sealing key

    def sealing_for(self, measurement: bytes) -> SealingKeySource:
        """Simulated TEE only (unsafe re-seal): the sealing key of another build of the broker."""
        if self.sim_key is None:
            raise SealedStateError("only the simulated TEE can derive another build's sealing key")
        return SimSealingKey(self.sim_key, measurement)


def load_sim_platform_key(path: Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SettingsError("the simulated platform signing key must be Ed25519")
    return key


def sim_platform(key: Ed25519PrivateKey, measurement: bytes) -> BrokerPlatform:
    return BrokerPlatform("sim", measurement, Attester(SimAttester(SimTee(key, measurement))),
                          SimSealingKey(key, measurement), sim_key=key)


def open_platform(settings: BrokerSettings) -> BrokerPlatform:
    platform = _open(settings)
    if settings.init_data is not None and platform.tee != "sim":
        # Every report this broker hands out must carry its init-data's digest (Attester.bundle):
        # a host that launched it with other init-data gets no evidence out of it.
        from attestation.coco_initdata import load_broker_launch_init_data

        digest = load_broker_launch_init_data(settings.init_data.read_bytes()).digest_for(platform.tee)
        platform = dataclasses.replace(platform, attester=dataclasses.replace(platform.attester,
                                                                             init_data_digest=digest))
    return platform


def _open(settings: BrokerSettings) -> BrokerPlatform:
    if settings.tee == "sim":
        assert settings.sim_platform_signing_key is not None  # checked by BrokerSettings
        key = load_sim_platform_key(settings.sim_platform_signing_key)
        if settings.unsafe_sim_measurement:
            log.warning("UNSAFE: the broker's simulated measurement is overridden by configuration")
            measurement = bytes.fromhex(settings.unsafe_sim_measurement)
        else:
            measurement = simulated_measurement(settings)
        return sim_platform(key, measurement)
    if settings.tee == "snp":
        from attestation.snp.abi import parse_report
        from attestation.snp.derived_key import SnpDerivedKey

        attester = hardware_attester("snp", None, settings.kernel)
        try:
            own = parse_report(attester.cpu.attest(bytes(64)).report).measurement
            return BrokerPlatform("snp", own, attester, SnpDerivedKey(own, device=settings.kernel.sev_guest))
        except AttestationError as exc:
            raise SealedStateError(f"the broker cannot attest itself or derive its sealing key: {exc}") from exc
    if settings.keystore != "vault":
        raise SealedStateError("TDX offers no sealing key: a TDX broker keeps its keys only in memory and its "
                               "state in OpenBao (--keystore vault); see docs/security.md")
    from attestation.tdx.abi import parse_quote

    attester = hardware_attester("tdx", None, settings.kernel)
    try:
        own = parse_quote(attester.cpu.attest(bytes(64)).report).body.mr_td
    except AttestationError as exc:
        raise SealedStateError(f"the broker cannot attest itself: {exc}") from exc
    log.warning("TDX: no sealing key; the broker's keys are made anew at each start and never stored")
    return BrokerPlatform("tdx", own, attester, None)
